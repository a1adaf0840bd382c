"""How well the step model times whole FP8 linear layers: the modelled activation quantisation plus the learned
scaled MM, against aiconfigurator's measured layer time, per GPU and engine.

The scaled-MM network's own MAPE (``servesim eval kernels``) is scored on its target, the measured time less the
modelled quantisation, so it changes meaning whenever the quantisation's model does. This scores what a step
time uses, on the same rows whatever the model: every aiconfigurator per-tensor and block FP8 row the scaled-MM
category reads (the host-bound vLLM block path left out), a seeded sample of ``--max-rows``, and of those the
shapes ``split_by_shape`` holds out (never trained on) with the shipped weights.

    python scripts/fp8_layer_error.py
"""

from __future__ import annotations

import click
import numpy as np

from servesim.estimator.datasets import fp8_linear_rows, quantize_us, sample_frame, samples_from_frame, split_by_shape
from servesim.estimator.mlp import shipped_weights
from servesim.estimator.training import mape, predict_samples_us


@click.command()
@click.option("--max-rows", type=int, default=40000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def main(max_rows: int, seed: int) -> None:
    frame = sample_frame(fp8_linear_rows(), max_rows, seed).reset_index(drop=True)
    samples = samples_from_frame("scaled_mm", frame)
    test = split_by_shape(samples.shape_id, seed).test
    frame = frame[test].reset_index(drop=True)
    predicted_us = quantize_us(frame) + predict_samples_us(shipped_weights()["scaled_mm"], samples.subset(test))
    engine = frame["backend"].astype(str) + " " + frame["scaling"].astype(str)
    frame = frame.assign(predicted_us=predicted_us, engine=engine)
    click.echo(f"FP8 linear layers, held-out shapes of {len(test):,} sampled rows (seed {seed}): {len(frame):,} rows, "
               f"MAPE {mape(frame.predicted_us, frame.latency_us):.1f} %")
    click.echo(f"{'GPU':<14} {'engine, scale':<14} {'rows':>5}  {'MAPE %':>6}  {'median predicted/measured':>25}")
    for (gpu, engine), part in frame.groupby(["gpu", "engine"], observed=True):
        click.echo(f"{gpu:<14} {engine:<14} {len(part):>5}  {mape(part.predicted_us, part.latency_us):>6.1f}  "
                   f"{np.median(part.predicted_us / part.latency_us):>25.2f}")


if __name__ == "__main__":
    main()
