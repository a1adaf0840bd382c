"""How well the step model times whole FP8 linear layers: the modelled activation quantisation plus the learned
scaled MM, against aiconfigurator's measured layer time, per GPU and engine, beside the same layers with the
roofline's and each baseline's scaled MM (the baselines fitted as ``servesim eval kernels`` fits them).

The scaled-MM network's own MAPE (``servesim eval kernels``) is scored on its target, the measured time less the
modelled quantisation, so it changes meaning whenever the quantisation's model does. This scores what a step
time uses, on the same rows whatever the model: every aiconfigurator per-tensor and block FP8 row the scaled-MM
category reads (the host-bound vLLM block path left out), a seeded sample of ``--max-rows``, and of those the
shapes the shipped weights never trained on (``never_trained_on``) with them. Each ``--holdout`` GPU is scored
on all its sampled rows with a network retrained without it, exactly as ``servesim eval kernels --holdout``
retrains (the same sample of the category's rows, seed and schedule options).

    python experiments/fp8_layer_error.py
    python experiments/fp8_layer_error.py --holdout L40S --max-epochs 400 --patience-epochs 20 --lr-patience-epochs 6
"""

from __future__ import annotations

import click
import numpy as np
import pandas as pd

from servesim.cli.estimator import schedule_options, train_config
from servesim.training.datasets import (
    KernelSamples,
    fp8_linear_rows,
    load_samples,
    quantize_us,
    require_measured,
    sample_frame,
    samples_from_frame,
    split_by_shape,
)
from servesim.estimator.mlp import MlpWeights, shipped_weights
from servesim.training.train import (
    PREDICTORS,
    mape,
    never_trained_on,
    predict_samples_us,
    predictor_times_us,
    train_mlp,
)
from servesim.hardware import get_gpu


def layer_times(frame: pd.DataFrame, layers: KernelSamples, weights: MlpWeights, train: KernelSamples) -> pd.DataFrame:
    """``frame``'s rows with each predictor's time of the whole layer, the modelled quantisation plus its scaled
    MM (``<predictor>_us``, from ``layers``, the rows' samples; the baselines fitted on ``train``), and each row's
    engine and scaling (``engine``)."""
    quantization_us = quantize_us(frame)
    times = predictor_times_us(train, layers, predict_samples_us(weights, layers))
    return frame.assign(engine=frame["backend"].astype(str) + " " + frame["scaling"].astype(str),
                        **{f"{name}_us": quantization_us + times[name] for name in PREDICTORS})


def report(title: str, frame: pd.DataFrame) -> None:
    """Each predictor's MAPE of the whole layers per GPU, then the MLP's per GPU and engine."""
    click.echo(f"{title}: {len(frame):,} rows")
    click.echo(f"{'GPU':<14} {'rows':>5}  " + "  ".join(f"{p + ' %':>10}" for p in PREDICTORS))
    groups = [*frame.groupby("gpu", observed=True), *([("all", frame)] if frame["gpu"].nunique() > 1 else [])]
    for gpu, part in groups:
        click.echo(f"{gpu:<14} {len(part):>5}  " + "  ".join(
            f"{mape(part[f'{p}_us'], part.latency_us):>10.1f}" for p in PREDICTORS))
    click.echo(f"{'GPU':<14} {'engine, scale':<14} {'rows':>5}  {'mlp %':>6}  {'median predicted/measured':>25}")
    for (gpu, engine), part in frame.groupby(["gpu", "engine"], observed=True):
        click.echo(f"{gpu:<14} {engine:<14} {len(part):>5}  {mape(part.mlp_us, part.latency_us):>6.1f}  "
                   f"{np.median(part.mlp_us / part.latency_us):>25.2f}")


@click.command()
@click.option("--max-rows", type=int, default=40000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--holdout", "holdouts", multiple=True, metavar="GPU",
              help="Retrain without this GPU and score its whole layers (repeatable).")
@schedule_options
def main(max_rows: int, seed: int, holdouts: tuple[str, ...], **schedule: int | None) -> None:
    frame = sample_frame(fp8_linear_rows(), max_rows, seed).reset_index(drop=True)
    layers = samples_from_frame("scaled_mm", frame)
    shipped = shipped_weights()["scaled_mm"]
    test = never_trained_on(shipped, layers.shape_id)
    samples = load_samples("scaled_mm", max_rows=max_rows, seed=seed)
    split = split_by_shape(samples.shape_id, seed)
    report(f"FP8 linear layers, held-out shapes of {len(test):,} sampled rows (seed {seed})",
           layer_times(frame[test].reset_index(drop=True), layers.subset(test), shipped,
                       samples.subset(~never_trained_on(shipped, samples.shape_id))))
    config = train_config(seed, **schedule)
    held_gpus = [get_gpu(h).name for h in holdouts]
    require_measured(samples, held_gpus)
    for gpu_name in held_gpus:
        held = samples.gpu == gpu_name
        weights = train_mlp(samples, ~held & ~split.val, ~held & split.val, config).weights
        rows = layers.gpu == gpu_name
        report(f"{gpu_name} left out, all its sampled layers",
               layer_times(frame[rows].reset_index(drop=True), layers.subset(rows), weights, samples.subset(~held)))


if __name__ == "__main__":
    main()
