"""Summaries of predicted-vs-measured rows: MAPE per group, bias by concurrency, the scatter plot.

Rows carry ``measured_/predicted_ttft_ms``, ``measured_/predicted_tpot_ms`` and the signed relative errors
``ttft_error``/``tpot_error`` (predicted / measured − 1); optional ``aic_ttft_error``/``aic_tpot_error`` hold
aiconfigurator's errors on the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.errors import ServesimError

#: The accuracy bar the validation is held to (issue: TPOT MAPE ≤ 10 %, TTFT MAPE ≤ 20 %).
TPOT_BAR_PCT = 10.0
TTFT_BAR_PCT = 20.0

#: Concurrency buckets for the bias table: (low, high] client counts.
CONCURRENCY_EDGES = (0, 8, 32, 128, np.inf)

#: A row group of the silicon report: one deployment of one model (its weight format included).
GROUP_KEYS = ("gpu", "engine", "model_id", "dtype", "tp", "ep", "dp")


def errors_summary(group: pd.DataFrame) -> dict[str, float]:
    """Rows, and the MAPE and bias (``<metric>_mape_pct``, ``<metric>_bias_pct``) of each error column the rows
    have: TTFT, TPOT and E2E, servesim's and aiconfigurator's."""
    out = {"rows": len(group)}
    for prefix in ("", "aic_"):
        for metric in ("ttft", "tpot", "e2e"):
            column = f"{prefix}{metric}_error"
            if column in group:
                errors = group[column].dropna()
                out[f"{prefix}{metric}_mape_pct"] = float(errors.abs().mean() * 100) if len(errors) else np.nan
                out[f"{prefix}{metric}_bias_pct"] = float(errors.mean() * 100) if len(errors) else np.nan
    return out


def grouped_errors(frame: pd.DataFrame, keys: Sequence[str]) -> list[dict[str, object]]:
    """MAPE and mean signed error (bias) of TTFT and TPOT per group of ``keys``, in percent."""
    keys = list(keys)
    return [dict(zip(keys, key if isinstance(key, tuple) else (key,))) | errors_summary(group)
            for key, group in frame.groupby(keys, sort=True, dropna=False, observed=True)]


def concurrency_bucket(concurrency: pd.Series) -> pd.Series:
    """Labels such as ``9-32`` for the (low, high] buckets of :data:`CONCURRENCY_EDGES`, ordered low to high."""
    labels = [f"{int(lo) + 1}-{int(hi)}" if np.isfinite(hi) else f">{int(lo)}"
              for lo, hi in zip(CONCURRENCY_EDGES[:-1], CONCURRENCY_EDGES[1:])]
    return pd.cut(concurrency.astype(float), bins=list(CONCURRENCY_EDGES), labels=labels)


def bias_by_concurrency(frame: pd.DataFrame, keys: Sequence[str] = ()) -> list[dict[str, object]]:
    """Errors per concurrency bucket (and ``keys``): a systematic trend with concurrency shows as a drift of the
    bias across buckets."""
    return grouped_errors(frame.assign(concurrency_bucket=concurrency_bucket(frame["concurrency"])),
                          [*keys, "concurrency_bucket"])


def meets_bar(row: dict[str, object]) -> bool:
    return row["ttft_mape_pct"] <= TTFT_BAR_PCT and row["tpot_mape_pct"] <= TPOT_BAR_PCT


def against_bar(frame: pd.DataFrame, keys: Sequence[str]) -> list[dict[str, object]]:
    """:func:`grouped_errors` per group of ``keys``, each with ``meets_bar``: ``yes`` when its TTFT and TPOT MAPE
    are both within the bar (:data:`TTFT_BAR_PCT`, :data:`TPOT_BAR_PCT`), else ``no``."""
    return [row | {"meets_bar": "yes" if meets_bar(row) else "no"} for row in grouped_errors(frame, keys)]


def scatter_plot(frame: pd.DataFrame, path: Path, title: str) -> None:
    """Predicted against measured TTFT and TPOT (log axes), one colour per GPU and engine, hollow markers for
    test rows, the ±bar bands dashed. Writes a small PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ServesimError("the scatter plot needs matplotlib: pip install 'servesim[plots]'") from None
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 4.4), dpi=90)
    groups = list(frame.groupby(["gpu", "engine"], sort=True))
    colours = plt.get_cmap("tab10")
    for ax, metric, bar in ((axes[0], "ttft", TTFT_BAR_PCT), (axes[1], "tpot", TPOT_BAR_PCT)):
        measured, predicted = frame[f"measured_{metric}_ms"], frame[f"predicted_{metric}_ms"]
        lo = float(min(measured.min(), predicted.min())) * 0.8
        hi = float(max(measured.max(), predicted.max())) * 1.25
        line = np.array([lo, hi])
        ax.plot(line, line, color="black", linewidth=0.8)
        for factor in (1 - bar / 100, 1 + bar / 100):
            ax.plot(line, line * factor, color="grey", linewidth=0.6, linestyle="--")
        for i, ((gpu, engine), group) in enumerate(groups):
            test = group.get("split", pd.Series("train", index=group.index)) == "test"
            for subset, hollow in ((group[~test], False), (group[test], True)):
                if subset.empty:
                    continue
                ax.scatter(subset[f"measured_{metric}_ms"], subset[f"predicted_{metric}_ms"], s=12,
                           facecolors="none" if hollow else colours(i), edgecolors=colours(i), linewidths=0.8,
                           label=f"{gpu} {engine}" if not hollow or test.all() else None)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel=f"measured {metric.upper()} (ms)",
               ylabel=f"predicted {metric.upper()} (ms)", title=f"{metric.upper()} (dashed: ±{bar:g} %)")
        ax.grid(True, which="major", linewidth=0.3)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
