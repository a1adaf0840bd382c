"""What share of its specification sheet's peaks each measured GPU reaches on the GEMMs that are plainly bound by
one of them: the Tensor peak for large GEMMs (m, n and k all at least 4,096) and the DRAM bandwidth for skinny
ones whose timing loop cannot keep them in L2 (m <= 16 and the loop's six copies of the layer at least four times
the L2). A GPU left out of training is predicted from the others' shares: where no trained GPU of its memory type
reaches a share like its own, neither can the networks (docs/accuracy.md, "Why the misses": the L40S and RTX PRO
6000 left out).

    python experiments/peak_fractions.py
"""

from __future__ import annotations

import click
import numpy as np
import pandas as pd

from servesim.training.datasets import HARNESS_COPIES, category_frame, harness_l2_fills, samples_from_frame
from servesim.hardware import get_gpu

LARGE_DIM = 4096
SKINNY_M = 16
COLD_FILLS = 4.0


def bound_shares(category: str) -> pd.DataFrame:
    """Per measured row of ``category`` that one peak plainly bounds: its GPU, ``bound`` (tensor or dram) and
    ``share`` = that peak's time / measured time."""
    frame = category_frame(category).frame
    large = (frame["m"] >= LARGE_DIM) & (frame["n"] >= LARGE_DIM) & (frame["k"] >= LARGE_DIM)
    frame = frame[large | (frame["m"] <= SKINNY_M)].reset_index(drop=True)
    samples = samples_from_frame(category, frame)
    gpus = list(samples.gpu)
    specs = {name: get_gpu(name) for name in set(gpus)}
    dtype = "bf16" if category == "gemm" else "fp8"
    tensor_us = np.array([2.0 * k.m * k.n * k.k / (specs[g].tensor_tflops(dtype) * 1e6)
                          for k, g in zip(samples.kernels, gpus)])
    dram_us = np.array([k.bytes_moved() / (specs[g].dram_bandwidth_gbps * 1e3) for k, g in zip(samples.kernels, gpus)])
    large = (frame["m"] >= LARGE_DIM).to_numpy()
    cold = harness_l2_fills(samples.kernels, gpus, HARNESS_COPIES[category]) >= COLD_FILLS
    keep = large | cold
    return pd.DataFrame({
        "gpu": samples.gpu[keep],
        "bound": np.where(large, "tensor", "dram")[keep],
        "share": (np.where(large, tensor_us, dram_us) / samples.measured_us)[keep],
    })


@click.command()
@click.option("--category", "categories", multiple=True, default=("gemm", "scaled_mm"), show_default=True,
              help="GEMM categories (repeatable).")
def main(categories: tuple[str, ...]) -> None:
    click.echo(f"{'category':<10} {'GPU':<14} {'bound':<6} {'rows':>6}  {'p10':>5}  {'median':>6}  {'p90':>5}")
    for category in categories:
        shares = bound_shares(category)
        for (bound, gpu), part in shares.groupby(["bound", "gpu"], sort=True):
            q = part["share"].quantile([0.1, 0.5, 0.9]).to_numpy()
            click.echo(f"{category:<10} {gpu:<14} {bound:<6} {len(part):>6}  {q[0]:>5.2f}  {q[1]:>6.2f}  {q[2]:>5.2f}")


if __name__ == "__main__":
    main()
