"""Compare the kernel-time baselines (servesim/training/baselines.py) with the roofline and the MLP estimator.

Seen GPUs: the baselines fit on the other shapes of a seeded sample and predict the shapes the shipped MLP
(``MlpEstimator``) never trained on (``never_trained_on``), scored against it. Each ``--holdout`` GPU: the
baselines fit on the other GPUs' training and validation shapes and predict every sampled row of the held-out
GPU; the MLP is retrained the same way (``train_mlp``, same seed), as ``servesim eval kernels`` does. Prints
MAPE (%) per GPU, the rows Habitat had to give the roofline (no training GPU measured their shape), and each
baseline's fit + predict time.

    .venv/bin/python experiments/compare_baselines.py --category gemm --max-rows 200000 --seed 0 [--holdout H200]
"""

from __future__ import annotations

import time

import click
import numpy as np

from servesim.cli.output import Column, render_table
from servesim.estimator.base import predict_per_gpu_us
from servesim.training.baselines import BASELINES, habitat_predict
from servesim.training.datasets import KernelSamples, load_samples, require_measured, split_by_shape
from servesim.estimator.mlp import MlpEstimator, shipped_weights
from servesim.training.train import (
    PREDICTORS,
    TrainConfig,
    mape_by_gpu,
    never_trained_on,
    predict_samples_us,
    roofline_samples_us,
    train_mlp,
)
from servesim.hardware import get_gpu


def shipped_mlp_us(samples: KernelSamples) -> np.ndarray:
    """The shipped MLP estimator's times, GPU by GPU (features recomputed, as at run time)."""
    return predict_per_gpu_us(MlpEstimator(), samples.kernels, samples.gpu)


def score(label: str, train: KernelSamples, test: KernelSamples, mlp_us: np.ndarray,
          seconds: dict[str, list[float]]) -> list[dict[str, object]]:
    """One row per GPU of ``test`` (and one for all): MAPE of the roofline, each baseline and the MLP."""
    predictions = {"roofline": roofline_samples_us(test)}
    for name, fit_predict in BASELINES.items():
        start = time.perf_counter()
        predictions[name] = fit_predict(train, test)
        seconds[name].append(time.perf_counter() - start)
    predictions["mlp"] = mlp_us
    fallback = habitat_predict(train, test).fallback
    rows = mape_by_gpu(test, predictions)
    for row in rows:
        mask = np.ones(len(test), bool) if row["gpu"] == "all" else test.gpu == row["gpu"]
        row.update(set=label, fallback=int(fallback[mask].sum()))
    return rows


@click.command()
@click.option("--category", default="gemm", show_default=True)
@click.option("--max-rows", type=click.IntRange(min=1), default=200_000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--holdout", "holdouts", multiple=True, metavar="GPU", help="Leave this GPU out (repeatable).")
def main(category: str, max_rows: int, seed: int, holdouts: tuple[str, ...]) -> None:
    samples = load_samples(category, max_rows=max_rows, seed=seed)
    split = split_by_shape(samples.shape_id, seed)
    fit = split.train | split.val
    seconds: dict[str, list[float]] = {name: [] for name in BASELINES}
    held_out = never_trained_on(shipped_weights()[category], samples.shape_id)
    seen = samples.subset(held_out)
    rows = score("seen GPU, held-out shapes", samples.subset(~held_out), seen, shipped_mlp_us(seen), seconds)
    train_rows = [int((~held_out).sum())]
    held_gpus = [get_gpu(h).name for h in holdouts]
    require_measured(samples, held_gpus)
    for holdout in held_gpus:
        held = samples.gpu == holdout
        unseen = samples.subset(held)
        mlp = train_mlp(samples, split.train & ~held, split.val & ~held, TrainConfig(seed=seed))
        rows += [r for r in score("unseen GPU", samples.subset(fit & ~held), unseen,
                                  predict_samples_us(mlp.weights, unseen), seconds) if r["gpu"] != "all"]
        train_rows.append(int((fit & ~held).sum()))
    columns = (Column("set", "set", align="<"), Column("gpu", "GPU", align="<"), Column("rows", "rows", ","),
               *(Column(p, p, ".1f") for p in PREDICTORS),
               Column("fallback", "habitat fallback rows", ","))
    click.echo(render_table(rows, columns, title=f"{category}: MAPE % of predicted kernel time vs measured "
                                                 f"({len(samples):,} sampled rows, seed {seed})"))
    for name, values in seconds.items():
        fits = ", ".join(f"{s:.1f} s ({n:,} training rows)" for s, n in zip(values, train_rows))
        click.echo(f"{name}: fit + predict {fits}")


if __name__ == "__main__":
    main()
