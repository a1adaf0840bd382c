"""How warm aiconfigurator's GEMM timings are: efficiency against the cold and the harness-aware roofline, per GPU
and by how many times the timing loop's working set fills L2.

aiconfigurator's collectors time six copies of a linear layer in turn without flushing L2, so a small layer's
weights come from L2, where in serving they come from DRAM (docs/estimator.md, "Warm L2 in the GEMM timings").
The measured rows' kernels carry what L2 held (``l2_resident_fraction``); this script recomputes each row's
roofline time with nothing held (cold, as serving runs) and prints the median efficiency = roofline time /
measured time of the memory-bound rows (m up to ``--max-m``) under both, in bands of the working set (six copies'
``bytes_moved()``) over the GPU's L2.

    python scripts/harness_l2.py --category scaled_mm --max-m 64
"""

from __future__ import annotations

import dataclasses

import click
import numpy as np
import pandas as pd

from servesim.estimator.datasets import HARNESS_GEMM_COPIES, load_samples
from servesim.features import kernel_features
from servesim.hardware import get_gpu

BANDS = ((0.0, 1.0, "up to 1 (six copies fit)"), (1.0, 4.0, "1 to 4"), (4.0, np.inf, "over 4"))


def cold_theoretical_us(kernels: list, gpus: np.ndarray) -> np.ndarray:
    """Each kernel's roofline time with nothing in L2 at its start, on its row's GPU."""
    cold = [dataclasses.replace(k, l2_resident_fraction=0.0) for k in kernels]
    out = np.empty(len(cold))
    for name in np.unique(gpus):
        rows = np.flatnonzero(gpus == name)
        out[rows] = kernel_features([cold[i] for i in rows], get_gpu(str(name))).column("theoretical_time_us")
    return out


def band_of(fills: np.ndarray) -> np.ndarray:
    """The :data:`BANDS` label of each working set over L2."""
    labels = np.empty(len(fills), dtype=object)
    for low, high, label in BANDS:
        labels[(fills > low) & (fills <= high)] = label
    return labels


@click.command()
@click.option("--category", type=click.Choice(["gemm", "scaled_mm"]), default="scaled_mm", show_default=True)
@click.option("--max-m", type=int, default=64, show_default=True, help="Rows of at most this many tokens.")
@click.option("--max-rows", type=int, default=40000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def main(category: str, max_m: int, max_rows: int, seed: int) -> None:
    samples = load_samples(category, max_rows=max_rows, seed=seed)
    keep = np.array([k.m <= max_m for k in samples.kernels])
    samples = samples.subset(keep)
    l2_bytes = np.array([get_gpu(str(name)).l2_cache_mib * 2**20 for name in samples.gpu])
    fills = np.array([HARNESS_GEMM_COPIES * k.bytes_moved() for k in samples.kernels]) / l2_bytes
    table = pd.DataFrame({
        "gpu": samples.gpu, "band": band_of(fills),
        "cold": cold_theoretical_us(list(samples.kernels), samples.gpu) / samples.measured_us,
        "aware": samples.efficiency,
    })
    summary = table.groupby(["gpu", "band"], sort=True).agg(
        rows=("cold", "size"), cold_p50=("cold", "median"), aware_p50=("aware", "median"))
    click.echo(f"{category}, m <= {max_m}, {max_rows:,} sampled rows (seed {seed}): median efficiency against the "
               "cold roofline and the harness-aware one, by the timing loop's working set over L2")
    click.echo(summary.to_string(float_format=lambda v: f"{v:.2f}"))


if __name__ == "__main__":
    main()
