"""Benchmark: kernel-time predictions end to end from kernel objects (estimator inputs + MLP); prints the time.

The kernels are what the serving simulator asks the estimator about: every kernel of random engine steps (decode
batches, prefill chunks, mixed steps) of dense and MoE models under vLLM and SGLang, in launch order, repeats
included, until there are ``--kernels`` of them. Caches start cold.

    .venv/bin/python benchmarks/bench_estimator.py --gpu H100 --kernels 100000
"""

from __future__ import annotations

import time
from collections import Counter

import click
import numpy as np

from servesim.estimator import get_estimator
from servesim.features import clear_feature_cache
from servesim.hardware import get_gpu
from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.kernels.expand import expand
from servesim.kernels.types import Kernel
from servesim.models import get_model

_SETUPS = (("llama3-8b", 1), ("llama3-70b", 4), ("qwen3-30b-a3b", 1), ("qwen3-32b", 2))


def _random_batch(rng: np.random.Generator) -> BatchSpec:
    decodes = tuple(int(c) for c in rng.integers(16, 8192, size=int(rng.integers(0, 257))))
    prefills = tuple(PrefillChunk(int(rng.integers(16, 4097)), int(rng.choice([0, int(rng.integers(1, 8192))])))
                     for _ in range(int(rng.integers(0 if decodes else 1, 3))))
    return BatchSpec(prefills=prefills, decodes=decodes)


def step_kernels(gpu_name: str, count: int, seed: int) -> list[Kernel]:
    """The kernels of random engine steps, in launch order, until there are ``count``."""
    rng = np.random.default_rng(seed)
    gpu = get_gpu(gpu_name)
    kernels: list[Kernel] = []
    while len(kernels) < count:
        model_name, tp = _SETUPS[int(rng.integers(len(_SETUPS)))]
        engine = ("vllm", "sglang")[int(rng.integers(2))]
        kernels += [s.op for s in expand(engine, get_model(model_name), gpu, _random_batch(rng), tp=tp).kernels]
    return kernels[:count]


@click.command()
@click.option("--gpu", default="H100", show_default=True)
@click.option("--kernels", "count", type=click.IntRange(min=1), default=100_000, show_default=True)
@click.option("--estimator", "estimator_name", default="mlp", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def main(gpu: str, count: int, estimator_name: str, seed: int) -> None:
    kernels = step_kernels(gpu, count, seed)
    spec = get_gpu(gpu)
    estimator = get_estimator(estimator_name)
    clear_feature_cache()
    start = time.perf_counter()
    times_us = estimator.predict_us(kernels, spec)
    seconds = time.perf_counter() - start
    assert np.all(np.isfinite(times_us)) and np.all(times_us > 0)
    mix = ", ".join(f"{c} {n:,}" for c, n in Counter(k.category for k in kernels).most_common())
    click.echo(f"{count:,} kernel predictions ({len(set(kernels)):,} distinct) on {spec.name} with "
               f"{estimator_name}: {seconds:.2f} s, {count / seconds:,.0f} kernels/s\nmix: {mix}")


if __name__ == "__main__":
    main()
