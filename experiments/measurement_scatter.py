"""How much the measured GEMM rows scatter on their own: a floor under any predictor's MAPE on them.

A GEMM with m = 1 … 16 rows is weight-bound, and every library's tile choice as servesim models it
(servesim/decompose/gemm.py) is the same for all m ≤ 16, so its time should be smooth in m. For each GPU, kernel
source, n and k, the script takes every m from 2 to 15 with both neighbours measured and the second difference of
the log time, ``d = log t(m) − (log t(m − 1) + log t(m + 1)) / 2``, which cancels any smooth trend. If each row
carried independent relative noise of spread σ, d would have spread √1.5 σ; ``scatter %`` is ``mean |d| / √1.5``,
what a predictor that knew the true time would still score as MAPE on these rows.

    python experiments/measurement_scatter.py --category scaled_mm
"""

from __future__ import annotations

import click
import numpy as np
import pandas as pd

from servesim.training.datasets import DataOptions, category_frame

SHAPE_GROUP = ["gpu", "kernel_source", "n", "k"]


def second_differences(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (GPU, kernel source, n, k, m) with m in 2..15 and both neighbours measured: ``d``, the second
    difference of log latency over m."""
    small = frame[frame["m"] <= 16]
    log_us = small.groupby([*SHAPE_GROUP, "m"])["latency_us"].median().apply(np.log).unstack("m")
    parts = []
    for m in range(2, 16):
        if {m - 1, m, m + 1} <= set(log_us.columns):
            d = (log_us[m] - (log_us[m - 1] + log_us[m + 1]) / 2).dropna()
            parts.append(d.rename("d").reset_index().assign(m=m))
    return pd.concat(parts, ignore_index=True)


@click.command()
@click.option("--category", type=click.Choice(["gemm", "scaled_mm"]), default="scaled_mm", show_default=True)
def main(category: str) -> None:
    d = second_differences(category_frame(category, DataOptions()).frame)
    table = d.groupby(["gpu", "kernel_source"])["d"].agg(
        points="size", mean_abs_d_pct=lambda x: 100 * x.abs().mean(), median_abs_d_pct=lambda x: 100 * x.abs().median()
    )
    table["scatter_pct"] = table["mean_abs_d_pct"] / np.sqrt(1.5)
    overall = 100 * d["d"].abs().mean()
    click.echo(table.round(1).to_string())
    click.echo(f"all: {len(d):,} points, mean |d| {overall:.1f} %, scatter {overall / np.sqrt(1.5):.1f} %")


if __name__ == "__main__":
    main()
