"""Where a left-out GPU's error lies, per kernel source and size, against copying a sibling GPU's measurement.

Retrains one category's MLP without ``--holdout`` (as ``servesim eval kernels --holdout`` does: a seeded sample, the
other GPUs' validation shapes for early stopping) and prints, for the left-out GPU's rows per kernel source and
m band, the MLP's MAPE and median predicted/measured ratio beside the MAPE of a predictor that needs no model at
all: the same shape's measured time, by the same source, on ``--sibling``, a trained GPU with the same SMs, clocks
and Tensor rates. Where the sibling's time is closer than the MLP's, the network has credited the left-out GPU's
one differing specification (the H200's DRAM bandwidth beside the H100's) with speed its kernels do not get.

    python experiments/holdout_by_source.py --category scaled_mm --holdout H200 --sibling H100
"""

from __future__ import annotations

import click
import numpy as np
import pandas as pd

from servesim.training.datasets import (
    DataOptions,
    category_frame,
    require_measured,
    sample_frame,
    samples_from_frame,
    split_by_shape,
)
from servesim.training.train import TrainConfig, mape, predict_samples_us, train_mlp
from servesim.hardware import get_gpu

M_BANDS = (0, 16, 128, 1024, np.inf)


def sibling_times_us(frame: pd.DataFrame, sibling: str) -> pd.Series:
    """The sibling GPU's median measured time per (source, m, n, k), from every measured row of ``frame`` (a source
    names its scaling)."""
    frame = frame[frame["gpu"].astype(str) == sibling]
    source = (frame["backend"].astype(str) + " " + frame["kernel_source"].astype(str)).rename("source")
    return frame["latency_us"].groupby([source, frame["m"], frame["n"], frame["k"]], observed=True).median()


@click.command()
@click.option("--category", type=click.Choice(["gemm", "scaled_mm"]), default="scaled_mm", show_default=True)
@click.option("--holdout", default="H200", show_default=True, help="GPU left out of training.")
@click.option("--sibling", default="H100", show_default=True, help="Trained GPU whose measured times are copied.")
@click.option("--max-rows", type=int, default=40000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def main(category: str, holdout: str, sibling: str, max_rows: int, seed: int) -> None:
    holdout, sibling = get_gpu(holdout).name, get_gpu(sibling).name
    frame = category_frame(category, DataOptions()).frame
    samples = samples_from_frame(category, sample_frame(frame, max_rows, seed))
    require_measured(samples, [holdout])
    require_measured(samples, [sibling], option="--sibling")
    split = split_by_shape(samples.shape_id, seed)
    held = samples.gpu == holdout
    weights = train_mlp(samples, ~held & ~split.val, ~held & split.val, TrainConfig(seed=seed)).weights
    unseen = samples.subset(held)
    kernels = unseen.kernels
    rows = pd.DataFrame({
        "source": unseen.kernel_source, "m": [k.m for k in kernels], "n": [k.n for k in kernels],
        "k": [k.k for k in kernels], "measured_us": unseen.measured_us, "mlp_us": predict_samples_us(weights, unseen),
    })
    index = pd.MultiIndex.from_frame(rows[["source", "m", "n", "k"]])
    rows["sibling_us"] = sibling_times_us(frame, sibling).reindex(index).to_numpy()
    rows["band"] = pd.cut(rows["m"], M_BANDS, right=True)
    found = rows[rows.sibling_us.notna()]
    click.echo(f"{category}: {holdout} left out ({len(rows):,} sampled rows), MLP MAPE "
               f"{mape(rows.mlp_us, rows.measured_us):.1f} %; {sibling}'s time of the same shape and source found for "
               f"{len(found):,} rows, MAPE {mape(found.sibling_us, found.measured_us):.1f} % (MLP on them "
               f"{mape(found.mlp_us, found.measured_us):.1f} %)")
    click.echo(f"{'source':<44} {'m band':<14} {'rows':>5}  {'MLP %':>6}  {'MLP median ratio':>16}  {'sibling %':>9}")
    for (source, band), part in rows.groupby(["source", "band"], observed=True):
        matched = part[part.sibling_us.notna()]
        sibling_pct = mape(matched.sibling_us, matched.measured_us) if len(matched) else float("nan")
        click.echo(f"{source:<44} {str(band):<14} {len(part):>5}  {mape(part.mlp_us, part.measured_us):>6.1f}  "
                   f"{np.median(part.mlp_us / part.measured_us):>16.3f}  {sibling_pct:>9.1f}")


if __name__ == "__main__":
    main()
