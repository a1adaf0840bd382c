"""Benchmark: SynPerf features of many random GEMM shapes, or of the attention kernels of random engine steps, on
one GPU; prints the rate.

    .venv/bin/python benchmarks/bench_features.py --gpu H20 --shapes 100000
    .venv/bin/python benchmarks/bench_features.py --kind attention --gpu H100 --shapes 3000

GEMM shapes go through the vectorised closed form in one call. Attention kernels are those vLLM launches for one
layer of llama3-70b at TP 4 (``--model``, ``--tp``) for random steps like those of a capacity search: 0 to 3
prompt chunks of 16 to 8,192 new tokens (log-uniform), each after up to 16,384 cached ones or (two times in three)
none, and 0 to 128 decodes at contexts of 256 to 16,384 tokens (log-uniform). Each is decomposed, placed on SMs
and reduced to features on its own, the per-kernel path of every attention batch a simulation has not seen before;
the timing starts after one kernel of each category has loaded the compiled loops, as a search's first one does.
"""

from __future__ import annotations

import time

import click
import numpy as np

from servesim.features import clear_feature_cache, kernel_features
from servesim.hardware import get_gpu
from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.kernels.expand import step_part
from servesim.kernels.types import Gemm, Kernel
from servesim.models import get_model


def gemm_kernels(shapes: int, rng: np.random.Generator) -> list[Kernel]:
    m = rng.integers(1, 16385, shapes)
    n = 2 ** rng.integers(7, 16, shapes) + 64 * rng.integers(0, 4, shapes)
    k = 2 ** rng.integers(7, 15, shapes)
    return [Gemm(m=int(a), n=int(b), k=int(c)) for a, b, c in zip(m, n, k)]


def attention_kernels(shapes: int, rng: np.random.Generator, model: str, gpu: str, tp: int) -> list[Kernel]:
    config, spec = get_model(model), get_gpu(gpu)
    kernels: dict[Kernel, None] = {}
    while len(kernels) < shapes:
        prefills = tuple(PrefillChunk(_log_uniform(rng, 16, 8192), _log_uniform(rng, 1, 16384) * (rng.random() < 1 / 3))
                         for _ in range(int(rng.integers(0, 4))))
        decodes = tuple(_log_uniform(rng, 256, 16384) for _ in range(int(rng.integers(0 if prefills else 1, 129))))
        for kernel in step_part("attention", "vllm", config, spec, BatchSpec(prefills, decodes), tp):
            kernels[kernel] = None
    return list(kernels)[:shapes]


def _log_uniform(rng: np.random.Generator, low: int, high: int) -> int:
    return int(np.exp(rng.uniform(np.log(low), np.log(high))))


@click.command()
@click.option("--kind", type=click.Choice(["gemm", "attention"]), default="gemm", show_default=True)
@click.option("--gpu", default="H20", show_default=True)
@click.option("--shapes", type=click.IntRange(min=1), default=100_000, show_default=True)
@click.option("--model", default="llama3-70b", show_default=True, help="Attention only.")
@click.option("--tp", type=click.IntRange(min=1), default=4, show_default=True, help="Attention only.")
@click.option("--seed", type=int, default=0, show_default=True)
def main(kind: str, gpu: str, shapes: int, model: str, tp: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    spec = get_gpu(gpu)
    if kind == "gemm":
        kernels = gemm_kernels(shapes, rng)
        start = time.perf_counter()
        matrix = kernel_features(kernels, spec)
    else:
        kernels = attention_kernels(shapes, rng, model, gpu, tp)
        for category in ("attn_prefill", "attn_decode"):  # load the compiled loops (servesim/compiled.py) first
            kernel_features([k for k in kernels if k.category == category][:1], spec)
        clear_feature_cache()
        start = time.perf_counter()
        matrix = kernel_features([k for k in kernels if k.category == "attn_prefill"], spec)
        kernel_features([k for k in kernels if k.category == "attn_decode"], spec)
    seconds = time.perf_counter() - start
    click.echo(f"{len(kernels):,} {kind} kernels on {spec.name}: {seconds:.2f} s, {len(kernels) / seconds:,.0f} "
               f"kernels/s ({seconds / len(kernels) * 1e6:,.0f} µs each), {matrix.values.shape[1]} features each")


if __name__ == "__main__":
    main()
