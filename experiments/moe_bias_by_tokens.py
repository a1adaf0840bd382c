"""The shipped fused-MoE network's signed error by token count, per GPU: does it time decode-sized MoE layers
(a few tokens, a few experts active) as well as prefill-sized ones?

A serving step's MoE layers see as many tokens as the step has (decode: one per running request), so a bias at
1-8 tokens moves every MoE model's TPOT at low concurrency. The script predicts a seeded sample of the measured
Triton fused-MoE rows without expert parallelism (``--rows`` per GPU, up to ``--max-tokens`` tokens) with the
shipped ``mlp`` estimator and prints the mean signed error and the MAPE per GPU and token band.

    python experiments/moe_bias_by_tokens.py --rows 1200 --seed 1
"""

from __future__ import annotations

import click
import numpy as np
import pandas as pd

BANDS = (0, 8, 64, 512)


@click.command()
@click.option("--rows", type=click.IntRange(min=1), default=1200, show_default=True, help="Sampled rows per GPU.")
@click.option("--seed", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--max-tokens", type=click.IntRange(min=1), default=512, show_default=True)
def main(rows: int, seed: int, max_tokens: int) -> None:
    from servesim.data.aiconfigurator import load_moe
    from servesim.estimator import get_estimator
    from servesim.hardware import get_gpu
    from servesim.training.datasets import SOURCES, prepare_frame

    frame = prepare_frame("moe", load_moe()).frame
    frame = frame[(frame["num_tokens"] <= max_tokens) & (frame["moe_ep"] == 1)]
    estimator = get_estimator("mlp")
    parts = []
    for gpu, group in frame.groupby("gpu"):
        group = group.sample(min(len(group), rows), random_state=seed)
        predicted = estimator.predict_us(SOURCES["moe"].to_kernels(group), get_gpu(str(gpu)))
        parts.append(group.assign(error=predicted / group["latency_us"].to_numpy() - 1.0))
    errors = pd.concat(parts)
    bands = [b for b in BANDS if b < max_tokens] + [max_tokens]
    errors["tokens"] = pd.cut(errors["num_tokens"], bands)
    table = errors.groupby(["gpu", "tokens"], observed=True)["error"].agg(
        rows="size", bias_pct=lambda e: 100 * e.mean(), mape_pct=lambda e: 100 * np.abs(e).mean())
    with pd.option_context("display.width", 160, "display.max_rows", 200):
        click.echo(table.round(1).to_string())


if __name__ == "__main__":
    main()
