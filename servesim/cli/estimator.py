"""``servesim train`` and ``servesim eval kernels``: train the kernel estimator's MLPs and score them against the
roofline on measured kernels, on seen GPUs (held-out shapes) and on GPUs left out of training."""

from __future__ import annotations

from pathlib import Path

import click

from servesim.cli.output import Column, emit, output_format_options

_SAMPLE_OPTIONS = (
    click.option("--category", default="gemm", show_default=True, help="Kernel category."),
    click.option("--max-rows", default=200_000, show_default=True, help="Seeded random subsample of the measurements."),
    click.option("--seed", default=0, show_default=True, help="Seed of the subsample, the shape split and training."),
)


def _sample_options(func):
    for option in reversed(_SAMPLE_OPTIONS):
        func = option(func)
    return func


@click.command("train")
@_sample_options
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the weights (default: the shipped servesim/estimator/weights/<category>.npz).")
def train_command(category: str, max_rows: int, seed: int, output: Path | None) -> None:
    """Train one category's MLP on all nine measured GPUs (training shapes only) and write its weights."""
    import time

    from servesim.estimator.datasets import load_samples, split_by_shape
    from servesim.estimator.mlp import WEIGHTS_DIR, save_weights
    from servesim.estimator.training import TrainConfig, train_mlp

    start = time.perf_counter()
    samples = load_samples(category, max_rows=max_rows, seed=seed)
    split = split_by_shape(samples.shape_id, seed)
    result = train_mlp(samples, split.train, split.val, TrainConfig(seed=seed))
    path = output or WEIGHTS_DIR / f"{category}.npz"
    save_weights(result.weights, path)
    click.echo(
        f"{category}: {int(split.train.sum()):,} training rows, {result.epochs} epochs, validation MAPE "
        f"{result.best_val_mape:.2f}%; wrote {path}\n"
        f"training took {result.seconds:.1f} s, {time.perf_counter() - start:.1f} s with data loading and features"
    )


@click.command("kernels")
@_sample_options
@click.option("--holdout", "holdouts", multiple=True, metavar="GPU",
              help="Retrain without this GPU and score on it (repeatable).")
@output_format_options
def eval_kernels_command(category: str, max_rows: int, seed: int, holdouts: tuple[str, ...],
                         output_format: str) -> None:
    """MAPE (%) per GPU of the roofline, the SynPerf theoretical time and the MLP: seen GPUs on held-out shapes
    with the shipped weights, then each --holdout GPU with an MLP retrained without it."""
    from servesim.estimator.datasets import load_samples, split_by_shape
    from servesim.estimator.mlp import shipped_weights
    from servesim.estimator.training import (
        TrainConfig,
        mape_by_gpu,
        predict_samples_us,
        roofline_samples_us,
        train_mlp,
    )
    from servesim.hardware import get_gpu

    samples = load_samples(category, max_rows=max_rows, seed=seed)
    split = split_by_shape(samples.shape_id, seed)
    rows = []
    weights = shipped_weights().get(category)
    if weights is not None:
        seen = samples.subset(split.test)
        predictions = {"roofline": roofline_samples_us(seen), "theoretical": seen.theoretical_us,
                       "mlp": predict_samples_us(weights, seen)}
        rows += [{"set": "seen GPU, held-out shapes", **r} for r in mape_by_gpu(seen, predictions)]
    for holdout in (get_gpu(h).name for h in holdouts):
        held = samples.gpu == holdout
        result = train_mlp(samples, split.train & ~held, split.val & ~held, TrainConfig(seed=seed))
        unseen = samples.subset(held)
        predictions = {"roofline": roofline_samples_us(unseen), "theoretical": unseen.theoretical_us,
                       "mlp": predict_samples_us(result.weights, unseen)}
        rows += [{"set": "unseen GPU", **r} for r in mape_by_gpu(unseen, predictions) if r["gpu"] != "all"]
    columns = (Column("set", "set", align="<"), Column("gpu", "GPU", align="<"), Column("rows", "rows", ","),
               Column("roofline", "roofline MAPE %", ".1f"), Column("theoretical", "theoretical MAPE %", ".1f"),
               Column("mlp", "mlp MAPE %", ".1f"))
    emit(rows, columns, output_format, title=f"{category}: MAPE of predicted kernel time vs measured",
         notes=("roofline: peak compute / DRAM bandwidth; theoretical: SynPerf busiest-SM pipe time; "
                "mlp: theoretical / predicted efficiency.",))


COMMANDS = [train_command]
#: Subcommands of ``servesim eval`` (the group lives in cli/comm.py).
EVAL_SUBCOMMANDS = [eval_kernels_command]
