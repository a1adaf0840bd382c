"""Whether the MLP should see the GPU's spec vector, chosen without looking at the GPUs the estimator is scored on.

The spec features (``servesim.features.SPEC_FEATURES``) let the network tell GPUs apart; with eight or nine
training GPUs they may also let it memorise them. This script retrains a category's MLP leave-one-GPU-out with the
spec features kept and dropped, on validation GPUs that are not among ``servesim eval kernels``' held-out test GPUs
(docs/accuracy.md), for several seeds, and prints the MAPE and bias of each. Settings follow ``servesim eval
kernels --holdout``: a seeded sample, the validation shapes of the other GPUs for early stopping. ``--drop NAME``
leaves out only the named spec inputs instead of all nine.

    python scripts/ablate_spec_features.py --category gemm --gpu A100 --gpu H100 --gpu B200 --gpu GB200 \\
        --seed 0 --seed 1
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import click
import numpy as np

from servesim.estimator.datasets import DataOptions, KernelSamples, load_samples, split_by_shape
from servesim.estimator.training import TrainConfig, mape, predict_samples_us, train_mlp
from servesim.features import SPEC_FEATURES
from servesim.hardware import get_gpu


def spec_variants(samples: KernelSamples, dropped: Sequence[str] = SPEC_FEATURES) -> dict[str, tuple[str, ...]]:
    """The network inputs with the spec vector kept, and with ``dropped`` (the whole spec vector by default) left
    out, whichever the shipped estimator uses."""
    names = samples.features.names
    return {"spec kept": names, "spec dropped": tuple(name for name in names if name not in dropped)}


@click.command()
@click.option("--category", required=True)
@click.option("--gpu", "gpus", multiple=True, required=True, help="Validation GPU to leave out (repeatable).")
@click.option("--seed", "seeds", type=int, multiple=True, default=(0,), show_default=True,
              help="Training seed (repeatable); the sample and split stay at --sample-seed.")
@click.option("--max-rows", type=int, default=40000, show_default=True)
@click.option("--sample-seed", type=int, default=0, show_default=True)
@click.option("--drop", "dropped", multiple=True, type=click.Choice(SPEC_FEATURES),
              help="Leave out only this spec input in the dropped variant (repeatable; default: all of them).")
def main(category: str, gpus: tuple[str, ...], seeds: tuple[int, ...], max_rows: int, sample_seed: int,
         dropped: tuple[str, ...]) -> None:
    samples = load_samples(category, max_rows=max_rows, seed=sample_seed, options=DataOptions())
    variants = spec_variants(samples, dropped or SPEC_FEATURES)
    split = split_by_shape(samples.shape_id, sample_seed)
    click.echo("category   GPU            seed  variant       MAPE %  bias %  seconds")
    for gpu_name in (get_gpu(g).name for g in gpus):
        held = samples.gpu == gpu_name
        if not held.any():
            click.echo(f"{category:<10} {gpu_name:<14} no rows")
            continue
        for seed in seeds:
            for variant, names in variants.items():
                start = time.perf_counter()
                weights = train_mlp(samples, ~held & ~split.val, ~held & split.val, TrainConfig(seed=seed),
                                    names).weights
                unseen = samples.subset(held)
                predicted = predict_samples_us(weights, unseen)
                bias = 100 * float(np.mean(predicted / unseen.measured_us - 1))
                click.echo(f"{category:<10} {gpu_name:<14} {seed:>4}  {variant:<12} "
                           f"{mape(predicted, unseen.measured_us):>7.1f} {bias:>+7.1f} "
                           f"{time.perf_counter() - start:>8.0f}")


if __name__ == "__main__":
    main()
