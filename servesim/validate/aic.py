"""aiconfigurator's own estimate of a silicon_sample row, for comparison (optional: ``pip install aiconfigurator``).

aiconfigurator (PyPI, Apache-2.0) estimates an aggregated deployment's TTFT and TPOT from its measured kernel
database with ``aiconfigurator.cli.api.cli_estimate``, called here as its accuracy tooling calls it for
silicon_sample rows (model, system, backend, isl, osl, batch size, parallel degrees, GEMM/MoE quantisation). Two
differences, both forced by running offline:

- the database version is aiconfigurator's current one for the system and backend (the rows' own versions are
  not queryable in aiconfigurator 0.12);
- the model is given as a config bundled with aiconfigurator-core when the row's Hugging Face id is not one
  (:data:`AIC_MODEL_PATHS`), since fetching a config from the hub is not possible.

servesim never needs aiconfigurator: the import happens only when a comparison is asked for.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable, Mapping

import pandas as pd

from servesim.errors import ServesimError

#: silicon_sample model id -> the bundled aiconfigurator-core config of the same architecture.
AIC_MODEL_PATHS: Mapping[str, str] = {
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
}

_PARALLEL = {"tp": "tp_size", "pp": "pp_size", "attention_dp": "attention_dp_size", "moe_tp": "moe_tp_size",
             "moe_ep": "moe_ep_size"}


def _estimate_kwargs(row: Mapping) -> dict[str, object]:
    kwargs: dict[str, object] = {
        "model_path": AIC_MODEL_PATHS.get(row["model"], row["model"]), "system_name": row["system"],
        "mode": "agg", "backend_name": row["backend"], "isl": int(row["isl"]), "osl": int(row["osl"]),
        "batch_size": int(row["concurrency"] if not pd.isna(row["concurrency"]) else row["batch_size"]),
    }
    for column, name in _PARALLEL.items():
        if not pd.isna(row[column]) and int(row[column]) > 0:
            kwargs[name] = int(row[column])
    for column, name in (("gemm_quant", "gemm_quant_mode"), ("moe_quant", "moe_quant_mode")):
        if not pd.isna(row[column]):
            kwargs[name] = row[column]
    return kwargs


def aiconfigurator_estimates(
    rows: pd.DataFrame, on_row: Callable[[], None] | None = None
) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    """aiconfigurator's TTFT and TPOT for silicon_sample ``rows`` (columns ``id``, ``aic_ttft_ms``,
    ``aic_tpot_ms``, ``aic_version``) and the (row id, reason) of rows it could not estimate."""
    try:
        from aiconfigurator.cli.api import cli_estimate
    except ImportError:
        raise ServesimError("the aiconfigurator comparison needs the aiconfigurator package: pip install "
                            "aiconfigurator (servesim itself does not use it)") from None
    estimates, failed, cache = [], [], {}
    logging.disable(logging.WARNING)  # it logs every database fallback it loads
    try:
        for row in rows.to_dict("records"):
            kwargs = _estimate_kwargs(row)
            key = tuple(sorted(kwargs.items()))
            if key not in cache:
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        result = cli_estimate(**kwargs)
                    cache[key] = (float(result.ttft), float(result.tpot), str(result.backend_version))
                except Exception as exc:  # aiconfigurator raises many kinds; the reason is reported per row
                    cache[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
            outcome = cache[key]
            if isinstance(outcome, str):
                failed.append((str(row["id"]), outcome))
            else:
                estimates.append({"id": row["id"], "aic_ttft_ms": outcome[0], "aic_tpot_ms": outcome[1],
                                  "aic_version": outcome[2]})
            if on_row is not None:
                on_row()
    finally:
        logging.disable(logging.NOTSET)
    return pd.DataFrame(estimates, columns=["id", "aic_ttft_ms", "aic_tpot_ms", "aic_version"]), failed


def with_aiconfigurator(frame: pd.DataFrame, estimates: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (rows keyed by ``case_id``) with aiconfigurator's predictions and signed errors added."""
    merged = frame.merge(estimates.rename(columns={"id": "case_id"}), on="case_id", how="left")
    merged["aic_ttft_error"] = merged["aic_ttft_ms"] / merged["measured_ttft_ms"] - 1.0
    merged["aic_tpot_error"] = merged["aic_tpot_ms"] / merged["measured_tpot_ms"] - 1.0
    return merged
