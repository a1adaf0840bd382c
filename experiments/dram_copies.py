"""Whether copies of compute-bound training rows at other DRAM bandwidths help a left-out GPU (a trial, not shipped).

Left out, the H200's large FP8 kernels come out too fast, as if the network credited its extra DRAM bandwidth
(over the H100's, its only difference) to kernels whose time does not follow it (docs/accuracy.md, "FP8 left out,
by source"); measured, those kernels take the same time on both (H200 over H100, same shape and source, m above
1,024: median 0.98). This trial adds, for each training row whose busiest-SM DRAM cycles are at most
``--max-dram-share`` of its slowest other pipe's, a copy of the kernel on its GPU with the DRAM bandwidth scaled by
each ``--factor`` (features recomputed, measured time kept) where the share stays within the bound. A control adds
the same rows again unchanged (``duplicates``), which says how much of any gain is only the extra weight and the
extra steps per epoch those rows bring. Each variant retrains leave-one-GPU-out as ``servesim eval kernels
--holdout`` does (a seeded sample, the other GPUs' validation shapes for early stopping, copies of training rows
only) and prints the left-out GPU's MAPE and bias and the other GPUs' held-out shapes' MAPE.

    python experiments/dram_copies.py --category scaled_mm --gpu H100 --gpu B200 --gpu GB200 --seed 0 --seed 1
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import click
import numpy as np
from ablate_spec_features import left_out_scores

from servesim.decompose import PIPES
from servesim.training.datasets import KernelSamples, load_samples, require_measured, split_by_shape
from servesim.estimator.inputs import candidate_inputs
from servesim.training.train import TrainConfig, train_mlp
from servesim.features import FeatureMatrix
from servesim.hardware import get_gpu


def dram_share(features: FeatureMatrix) -> np.ndarray:
    """Each row's busiest-SM DRAM cycles over its slowest other pipe's."""
    others = np.column_stack([features.column(f"sm_{p}_cycles") for p in PIPES if p != "dram"]).max(axis=1)
    return features.column("sm_dram_cycles") / np.maximum(others, 1e-9)


def appended(samples: KernelSamples, rows: np.ndarray, values: np.ndarray) -> KernelSamples:
    """``samples`` followed by copies of its ``rows`` with feature ``values`` (measured times kept)."""
    grown = samples.take(np.concatenate([np.arange(len(samples)), rows]))
    return replace(grown, features=FeatureMatrix(samples.features.names, np.vstack([samples.features.values, values])))


def dram_copies(samples: KernelSamples, train: np.ndarray, factors: Sequence[float],
                max_dram_share: float) -> tuple[np.ndarray, np.ndarray]:
    """The training rows to copy and their features with each GPU's DRAM bandwidth scaled by each of ``factors``,
    for rows within ``max_dram_share`` before and after."""
    eligible = train & (dram_share(samples.features) <= max_dram_share)
    rows, values = [], []
    for factor in factors:
        for gpu_name in np.unique(samples.gpu[eligible]):
            index = np.flatnonzero(eligible & (samples.gpu == gpu_name))
            gpu = get_gpu(gpu_name)
            scaled = replace(gpu, name=f"{gpu.name} x{factor:g} DRAM",
                             dram_bandwidth_gbps=gpu.dram_bandwidth_gbps * factor)
            features = candidate_inputs([samples.kernels[i] for i in index], scaled)
            kept = dram_share(features) <= max_dram_share
            rows.append(index[kept])
            values.append(features.values[kept])
    return np.concatenate(rows), np.vstack(values)


@click.command()
@click.option("--category", type=click.Choice(["gemm", "scaled_mm"]), default="scaled_mm", show_default=True)
@click.option("--gpu", "gpus", multiple=True, required=True, help="GPU to leave out (repeatable).")
@click.option("--seed", "seeds", type=int, multiple=True, default=(0,), show_default=True,
              help="Training seed (repeatable); the sample and split stay at seed 0.")
@click.option("--max-rows", type=int, default=40000, show_default=True)
@click.option("--factor", "factors", type=float, multiple=True, default=(0.67, 1.5), show_default=True,
              help="DRAM bandwidth scale of a copy (repeatable).")
@click.option("--max-dram-share", type=float, default=0.5, show_default=True)
@click.option("--max-epochs", type=int, default=400, show_default=True)
@click.option("--patience-epochs", type=int, default=20, show_default=True)
@click.option("--lr-patience-epochs", type=int, default=6, show_default=True)
def main(category: str, gpus: tuple[str, ...], seeds: tuple[int, ...], max_rows: int, factors: tuple[float, ...],
         max_dram_share: float, max_epochs: int, patience_epochs: int, lr_patience_epochs: int) -> None:
    samples = load_samples(category, max_rows=max_rows, seed=0)
    split = split_by_shape(samples.shape_id, 0)
    held_gpus = [get_gpu(g).name for g in gpus]
    require_measured(samples, held_gpus, option="--gpu")
    click.echo("category   GPU            seed  variant       added  MAPE %  bias %  others %  seconds")
    for gpu_name in held_gpus:
        held = samples.gpu == gpu_name
        train, val = ~held & ~split.val, ~held & split.val
        unseen, others = samples.subset(held), samples.subset(~held & split.test)
        rows, values = dram_copies(samples, train, factors, max_dram_share)
        variants = {"no copies": (samples, np.empty(0, int)),
                    "duplicates": (appended(samples, rows, samples.features.values[rows]), rows),
                    "DRAM copies": (appended(samples, rows, values), rows)}
        for seed in seeds:
            config = TrainConfig(seed=seed, max_epochs=max_epochs, patience_epochs=patience_epochs,
                                 lr_patience_epochs=lr_patience_epochs)
            for variant, (trained_on, added) in variants.items():
                start = time.perf_counter()
                copies = np.ones(len(added), bool)
                weights = train_mlp(trained_on, np.concatenate([train, copies]), np.concatenate([val, ~copies]),
                                    config).weights
                click.echo(f"{category:<10} {gpu_name:<14} {seed:>4}  {variant:<12} {len(added):>6} "
                           f"{left_out_scores(weights, unseen, others)} {time.perf_counter() - start:>8.0f}")


if __name__ == "__main__":
    main()
