"""Which inputs the MLP should see, chosen without looking at the GPUs the estimator is scored on.

The spec features (``servesim.features.SPEC_FEATURES``) let the network tell GPUs apart; with eight or nine
training GPUs they may also let it memorise them. This script retrains a category's MLP leave-one-GPU-out with the
spec features kept and dropped, on validation GPUs that are not among ``servesim eval kernels``' held-out test GPUs
(docs/accuracy.md), for several seeds, and prints the MAPE and bias on the left-out GPU and the MAPE on the other
GPUs' held-out shapes. Settings follow ``servesim eval kernels --holdout``: a seeded sample, the validation shapes of
the other GPUs for early stopping. ``--drop NAME`` leaves out only the named spec inputs instead of all nine.
``--ablate relative-pipes`` instead compares the shipped inputs with the same plus each pipe's busiest-SM cycles
over the slowest pipe's (:data:`RELATIVE_PIPE_FEATURES`, a trial not kept; docs/accuracy.md), ``--ablate both`` the
spec vector kept and dropped, each with and without them.

    python experiments/ablate_spec_features.py --category gemm --gpu A100 --gpu H100 --gpu B200 --gpu GB200 \\
        --seed 0 --seed 1
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import click
import numpy as np

from servesim.decompose import PIPES
from servesim.training.datasets import DataOptions, KernelSamples, load_samples, split_by_shape
from servesim.estimator.inputs import input_names
from servesim.estimator.mlp import MlpWeights
from servesim.training.train import TrainConfig, mape, predict_samples_us, train_mlp
from servesim.features import SPEC_FEATURES, FeatureMatrix
from servesim.hardware import get_gpu

RELATIVE_PIPE_FEATURES = tuple(f"relative_{p}_cycles" for p in PIPES)


def spec_variants(samples: KernelSamples, dropped: Sequence[str] = SPEC_FEATURES) -> dict[str, tuple[str, ...]]:
    """The network inputs with the spec vector kept, and with ``dropped`` (the whole spec vector by default) left
    out, whichever the shipped estimator uses."""
    names = samples.features.names
    return {"spec kept": names, "spec dropped": tuple(name for name in names if name not in dropped)}


def with_relative_pipe_cycles(samples: KernelSamples) -> KernelSamples:
    """The samples with :data:`RELATIVE_PIPE_FEATURES` appended: each pipe's busiest-SM cycles over the slowest
    pipe's, 1 for the bottleneck (0 where no pipe works)."""
    features = samples.features
    cycles = np.column_stack([features.column(f"sm_{p}_cycles") for p in PIPES])
    slowest = cycles.max(axis=1, keepdims=True)
    relative = cycles / np.where(slowest > 0, slowest, 1.0)
    return replace(samples, features=FeatureMatrix((*features.names, *RELATIVE_PIPE_FEATURES),
                                                   np.hstack([features.values, relative])))


def left_out_scores(weights: MlpWeights, unseen: KernelSamples, others: KernelSamples) -> str:
    """The table columns of a leave-one-GPU-out training: MAPE % and mean bias % on the left-out GPU's rows
    (``unseen``) and MAPE % on the other GPUs' held-out shapes (``others``)."""
    predicted = predict_samples_us(weights, unseen)
    bias = 100 * float(np.mean(predicted / unseen.measured_us - 1))
    others_mape = mape(predict_samples_us(weights, others), others.measured_us)
    return f"{mape(predicted, unseen.measured_us):>7.1f} {bias:>+7.1f} {others_mape:>9.1f}"


def input_variants(samples: KernelSamples, ablate: str, dropped: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The variants to compare: :func:`spec_variants` (``ablate`` "spec"), or the shipped inputs ("relative-pipes")
    or both of :func:`spec_variants` ("both"), each with and without :data:`RELATIVE_PIPE_FEATURES` (which
    ``samples`` must then hold: :func:`with_relative_pipe_cycles`)."""
    spec = spec_variants(samples, dropped or SPEC_FEATURES)
    if ablate == "spec":
        return spec
    bases = spec if ablate == "both" else {"shipped": input_names(samples.category, samples.features.names)}
    variants = {}
    for label, names in bases.items():
        names = tuple(name for name in names if name not in RELATIVE_PIPE_FEATURES)
        variants[f"{label}, relative pipes"] = (*names, *RELATIVE_PIPE_FEATURES)
        variants[label] = names
    return variants


@click.command()
@click.option("--category", required=True)
@click.option("--gpu", "gpus", multiple=True, required=True, help="Validation GPU to leave out (repeatable).")
@click.option("--seed", "seeds", type=int, multiple=True, default=(0,), show_default=True,
              help="Training seed (repeatable); the sample and split stay at --sample-seed.")
@click.option("--max-rows", type=int, default=40000, show_default=True)
@click.option("--sample-seed", type=int, default=0, show_default=True)
@click.option("--ablate", type=click.Choice(["spec", "relative-pipes", "both"]), default="spec", show_default=True,
              help="Which inputs the variants differ in.")
@click.option("--drop", "dropped", multiple=True, type=click.Choice(SPEC_FEATURES),
              help="Leave out only this spec input in the dropped variant (repeatable; default: all of them).")
def main(category: str, gpus: tuple[str, ...], seeds: tuple[int, ...], max_rows: int, sample_seed: int,
         ablate: str, dropped: tuple[str, ...]) -> None:
    samples = load_samples(category, max_rows=max_rows, seed=sample_seed, options=DataOptions())
    if ablate != "spec":
        samples = with_relative_pipe_cycles(samples)
    variants = input_variants(samples, ablate, dropped)
    split = split_by_shape(samples.shape_id, sample_seed)
    click.echo("category   GPU            seed  variant                         MAPE %  bias %  others %  seconds")
    for gpu_name in (get_gpu(g).name for g in gpus):
        held = samples.gpu == gpu_name
        if not held.any():
            click.echo(f"{category:<10} {gpu_name:<14} no rows")
            continue
        unseen, others = samples.subset(held), samples.subset(~held & split.test)
        for seed in seeds:
            for variant, names in variants.items():
                start = time.perf_counter()
                weights = train_mlp(samples, ~held & ~split.val, ~held & split.val, TrainConfig(seed=seed),
                                    names).weights
                click.echo(f"{category:<10} {gpu_name:<14} {seed:>4}  {variant:<30} "
                           f"{left_out_scores(weights, unseen, others)} {time.perf_counter() - start:>8.0f}")


if __name__ == "__main__":
    main()
