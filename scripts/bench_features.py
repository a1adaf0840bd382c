"""Benchmark: SynPerf features for many random GEMM shapes on one GPU; prints the rate.

    .venv/bin/python scripts/bench_features.py --gpu H20 --shapes 100000
"""

from __future__ import annotations

import time

import click
import numpy as np

from servesim.features import kernel_features
from servesim.hardware import get_gpu
from servesim.kernels.types import Gemm


@click.command()
@click.option("--gpu", default="H20", show_default=True)
@click.option("--shapes", type=click.IntRange(min=1), default=100_000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def main(gpu: str, shapes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = rng.integers(1, 16385, shapes)
    n = 2 ** rng.integers(7, 16, shapes) + 64 * rng.integers(0, 4, shapes)
    k = 2 ** rng.integers(7, 15, shapes)
    kernels = [Gemm(m=int(a), n=int(b), k=int(c)) for a, b, c in zip(m, n, k)]
    spec = get_gpu(gpu)
    start = time.perf_counter()
    matrix = kernel_features(kernels, spec)
    seconds = time.perf_counter() - start
    click.echo(f"{shapes:,} GEMM shapes on {spec.name}: {seconds:.2f} s, {shapes / seconds:,.0f} shapes/s, "
               f"{matrix.values.shape[1]} features each")


if __name__ == "__main__":
    main()
