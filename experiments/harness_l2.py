"""How warm aiconfigurator's kernel timings are: efficiency against the cold and the harness-aware roofline, per GPU
and by how many times the timing loop's working set fills L2.

aiconfigurator's collectors time six copies of a linear layer in turn, or one attention kernel again and again,
without flushing L2, so a small layer's weights or a short KV cache come from L2, where in serving they come from
DRAM (docs/estimator.md, "Warm L2 in the kernel timings"). The measured rows' kernels carry what L2 held
(``l2_resident_fraction``); this script recomputes each row's roofline time with nothing held (cold, as serving
runs) and prints the median efficiency = roofline time / measured time of the rows whose cold roofline is
DRAM-bound, under both, in bands of the working set (the loop's copies' ``bytes_moved()``) over the GPU's L2.

    python experiments/harness_l2.py --category scaled_mm
"""

from __future__ import annotations

import dataclasses

import click
import numpy as np
import pandas as pd

from servesim.decompose import PIPES
from servesim.decompose.launch import PIPE_ROW
from servesim.training.datasets import HARNESS_COPIES, harness_l2_fills, load_samples
from servesim.features import FEATURE_NAMES, FeatureMatrix, kernel_features
from servesim.hardware import get_gpu

BANDS = ((0.0, 0.25, "up to 1/4"), (0.25, 1.0, "1/4 to 1"), (1.0, 4.0, "1 to 4"), (4.0, np.inf, "over 4"))


def cold_features(kernels: list, gpus: np.ndarray) -> FeatureMatrix:
    """Each kernel's features with nothing in L2 at its start, on its row's GPU."""
    cold = [dataclasses.replace(k, l2_resident_fraction=0.0) for k in kernels]
    values = np.empty((len(cold), len(FEATURE_NAMES)))
    for name in np.unique(gpus):
        rows = np.flatnonzero(gpus == name)
        values[rows] = kernel_features([cold[i] for i in rows], get_gpu(str(name))).values
    return FeatureMatrix(FEATURE_NAMES, values)


def band_of(fills: np.ndarray) -> pd.Categorical:
    """The :data:`BANDS` label of each working set over L2."""
    labels = np.empty(len(fills), dtype=object)
    for low, high, label in BANDS:
        labels[(fills > low) & (fills <= high)] = label
    return pd.Categorical(labels, categories=[label for _, _, label in BANDS], ordered=True)


@click.command()
@click.option("--category", type=click.Choice(["gemm", "scaled_mm", "attn_prefill", "attn_decode"]),
              default="scaled_mm", show_default=True)
@click.option("--max-rows", type=int, default=40000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def main(category: str, max_rows: int, seed: int) -> None:
    samples = load_samples(category, max_rows=max_rows, seed=seed)
    cold = cold_features(list(samples.kernels), samples.gpu)
    pipe_cycles = np.column_stack([cold.column(f"sm_{p}_cycles") for p in PIPES])
    dram_bound = pipe_cycles.argmax(axis=1) == PIPE_ROW["dram"]
    copies = HARNESS_COPIES[category]
    fills = harness_l2_fills(samples.kernels, samples.gpu.astype(str).tolist(), copies)
    table = pd.DataFrame({
        "gpu": samples.gpu, "band": band_of(fills),
        "cold": cold.column("theoretical_time_us") / samples.measured_us, "aware": samples.efficiency,
    })[dram_bound]
    summary = table.groupby(["gpu", "band"], sort=True, observed=True).agg(
        rows=("cold", "size"), cold_p50=("cold", "median"), aware_p50=("aware", "median"))
    click.echo(f"{category}, DRAM-bound rows of {max_rows:,} sampled (seed {seed}), {copies} cop"
               f"{'y' if copies == 1 else 'ies'} per timing loop: median efficiency against the cold roofline and "
               "the harness-aware one, by the loop's working set over L2")
    click.echo(summary.to_string(float_format=lambda v: f"{v:.2f}"))


if __name__ == "__main__":
    main()
