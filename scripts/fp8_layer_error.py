"""How well the step model times whole FP8 linear layers: the modelled activation quantisation plus the learned
scaled MM, against aiconfigurator's measured layer time, per GPU and engine.

The scaled-MM network's own MAPE (``servesim eval kernels``) is scored on its target, the measured time less the
modelled quantisation, so it changes meaning whenever the quantisation's model does. This scores what a step
time uses, on the same rows whatever the model: every aiconfigurator per-tensor and block FP8 row the scaled-MM
category reads (the host-bound vLLM block path left out), a seeded sample of ``--max-rows``, and of those the
shapes ``split_by_shape`` holds out (never trained on) with the shipped weights. Each ``--holdout`` GPU is scored
on all its sampled rows with a network retrained without it, exactly as ``servesim eval kernels --holdout``
retrains (the same sample of the category's rows, seed and schedule options).

    python scripts/fp8_layer_error.py
    python scripts/fp8_layer_error.py --holdout L40S --max-epochs 400 --patience-epochs 20 --lr-patience-epochs 6
"""

from __future__ import annotations

import click
import numpy as np
import pandas as pd

from servesim.cli.estimator import schedule_options, train_config
from servesim.estimator.datasets import (
    fp8_linear_rows,
    load_samples,
    quantize_us,
    sample_frame,
    samples_from_frame,
    split_by_shape,
)
from servesim.estimator.mlp import MlpWeights, shipped_weights
from servesim.estimator.training import mape, predict_samples_us, train_mlp
from servesim.hardware import get_gpu


def layer_times(frame: pd.DataFrame, weights: MlpWeights) -> pd.DataFrame:
    """``frame``'s rows with the step model's time of each whole layer (``predicted_us``) and its engine and
    scaling (``engine``)."""
    predicted_us = quantize_us(frame) + predict_samples_us(weights, samples_from_frame("scaled_mm", frame))
    return frame.assign(predicted_us=predicted_us, engine=frame["backend"].astype(str) + " " +
                        frame["scaling"].astype(str))


def report(title: str, frame: pd.DataFrame) -> None:
    click.echo(f"{title}: {len(frame):,} rows, MAPE {mape(frame.predicted_us, frame.latency_us):.1f} %")
    click.echo(f"{'GPU':<14} {'engine, scale':<14} {'rows':>5}  {'MAPE %':>6}  {'median predicted/measured':>25}")
    for (gpu, engine), part in frame.groupby(["gpu", "engine"], observed=True):
        click.echo(f"{gpu:<14} {engine:<14} {len(part):>5}  {mape(part.predicted_us, part.latency_us):>6.1f}  "
                   f"{np.median(part.predicted_us / part.latency_us):>25.2f}")


@click.command()
@click.option("--max-rows", type=int, default=40000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--holdout", "holdouts", multiple=True, metavar="GPU",
              help="Retrain without this GPU and score its whole layers (repeatable).")
@schedule_options
def main(max_rows: int, seed: int, holdouts: tuple[str, ...], max_epochs: int | None, patience_epochs: int | None,
         lr_patience_epochs: int | None) -> None:
    frame = sample_frame(fp8_linear_rows(), max_rows, seed).reset_index(drop=True)
    test = split_by_shape(samples_from_frame("scaled_mm", frame).shape_id, seed).test
    report(f"FP8 linear layers, held-out shapes of {len(test):,} sampled rows (seed {seed})",
           layer_times(frame[test].reset_index(drop=True), shipped_weights()["scaled_mm"]))
    if not holdouts:
        return
    samples = load_samples("scaled_mm", max_rows=max_rows, seed=seed)
    split = split_by_shape(samples.shape_id, seed)
    config = train_config(seed, max_epochs, patience_epochs, lr_patience_epochs)
    for gpu_name in (get_gpu(h).name for h in holdouts):
        held = samples.gpu == gpu_name
        weights = train_mlp(samples, ~held & ~split.val, ~held & split.val, config).weights
        rows = frame[frame["gpu"].astype(str) == gpu_name].reset_index(drop=True)
        report(f"{gpu_name} left out, all its sampled layers", layer_times(rows, weights))


if __name__ == "__main__":
    main()
