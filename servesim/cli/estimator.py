"""``servesim train``, ``servesim eval kernels`` and ``servesim eval efficiency``: train the kernel estimator's
MLPs, score them against the roofline and the baselines on measured kernels (seen GPUs on held-out shapes, GPUs
left out of training), and inspect the efficiency targets they learn."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from servesim.cli.output import Column, emit, output_format_options
from servesim.cli.params import SEED, OutputFile

if TYPE_CHECKING:
    from servesim.training.train import TrainConfig

_DATA_OPTIONS = (
    click.option("--max-rows", type=click.IntRange(min=1), default=200_000, show_default=True,
                 help="Seeded random subsample of each category's measurements."),
    click.option("--seed", type=SEED, default=0, show_default=True,
                 help="Seed of the subsample, the shape split and training."),
    click.option("--vidur-root", type=click.Path(file_okay=False, path_type=Path), default=Path("../shared/data/vidur"),
                 show_default=True, help="Vidur's data folder (element-wise categories), relative to the current "
                                         "directory."),
    click.option("--extra-data", type=click.Path(file_okay=False, path_type=Path), default=None,
                 help="A folder of our own GPU collections (servesim collect) to add to the measured rows."),
)


def _terminal_status() -> Callable[[str], None]:
    """A status line on stderr, each call overwriting the last and ``""`` clearing it, where stderr is a terminal;
    elsewhere (a file, a pipe, a test) it writes nothing."""
    if not sys.stderr.isatty():
        return lambda line: None
    return lambda line: click.echo(f"\r\033[K{line}", err=True, nl=False)


def _epoch_status(show: Callable[[str], None], label: str) -> Callable[[int, float, float], None]:
    """A ``train_mlp`` epoch callback that shows ``label`` with the epoch and validation MAPE."""
    return lambda epoch, val_mape, best: show(f"{label}: epoch {epoch}, validation MAPE {val_mape:.2f} % "
                                              f"(best {best:.2f} %)")


def _data_options(func):
    for option in reversed(_DATA_OPTIONS):
        func = option(func)
    return func


def _known_categories(ctx: click.Context, param: click.Parameter, value: str | tuple[str, ...]):
    """Each ``--category`` must have measured data (servesim's one-line error suggests the nearest name)."""
    from servesim.training.datasets import category_source

    for category in (value,) if isinstance(value, str) else value:
        category_source(category)
    return value


def _category_option(multiple: bool):
    return click.option("--category", "categories" if multiple else "category", multiple=multiple,
                        default=("gemm",) if multiple else "gemm", show_default=True, callback=_known_categories,
                        help="Kernel category with measured data: gemm, scaled_mm, fp4_mm, attn_prefill, attn_decode, "
                             "moe, moe_marlin, moe_trtllm, index_logits, index_topk, gdn_prefill, gdn_decode, conv1d, "
                             "rmsnorm, silu_mul, rope"
                             + (" (repeatable)." if multiple else "."))


def _options(vidur_root: Path, extra_data: Path | None):
    from servesim.training.datasets import DataOptions

    return DataOptions(vidur_root=vidur_root, extra_data=extra_data)


def schedule_options(func):
    """``--max-epochs``, ``--patience-epochs``, ``--lr-patience-epochs`` and ``--min-epoch-rows``; unset,
    TrainConfig's defaults."""
    for name, help_text in reversed((
        ("--max-epochs", "Stop training after this many epochs if early stopping has not stopped it sooner "
                         "[default: 80]."),
        ("--patience-epochs", "Early stopping: stop after this many epochs without a better validation MAPE "
                              "[default: 10]."),
        ("--lr-patience-epochs", "Halve the learning rate after this many epochs without a better validation MAPE "
                                 "[default: 3]."),
        ("--min-epoch-rows", "Make each epoch as many reshuffled passes over the training rows as reach this many "
                             "rows, so a small sample takes as many optimiser steps per epoch as a large one "
                             "[default: one pass]."),
    )):
        func = click.option(name, type=click.IntRange(min=1), default=None, help=help_text)(func)
    return func


def train_config(seed: int, **schedule: int | None) -> TrainConfig:
    """A training configuration from :func:`schedule_options`' values, passed by their names (None: TrainConfig's
    default)."""
    from servesim.training.train import TrainConfig

    return TrainConfig(seed=seed, **{name: value for name, value in schedule.items() if value is not None})


@click.command("train")
@_category_option(multiple=False)
@_data_options
@schedule_options
@click.option("--output", type=OutputFile(), default=None,
              help="Where to write the weights (default: the shipped servesim/estimator/weights/<category>.npz).")
def train_command(category: str, max_rows: int, seed: int, vidur_root: Path, extra_data: Path | None,
                  output: Path | None, **schedule: int | None) -> None:
    """Train one category's MLP on every measured GPU (training shapes only) and write its weights."""
    import time

    from servesim.training.datasets import load_samples, split_by_shape
    from servesim.estimator.mlp import WEIGHTS_DIR, save_weights
    from servesim.training.train import train_mlp

    start = time.perf_counter()
    show = _terminal_status()
    show(f"{category}: loading up to {max_rows:,} measured rows and computing their features")
    samples = load_samples(category, max_rows=max_rows, seed=seed, options=_options(vidur_root, extra_data))
    split = split_by_shape(samples.shape_id, seed)
    loaded = time.perf_counter() - start
    config = train_config(seed, **schedule)
    result = train_mlp(samples, split.train, split.val, config, on_epoch=_epoch_status(show, f"training {category}"))
    show("")
    path = output or WEIGHTS_DIR / f"{category}.npz"
    save_weights(result.weights, path)
    click.echo(
        f"{category}: {len(samples):,} rows sampled, {int(split.train.sum()):,} training rows, {result.epochs} "
        f"epochs, efficiency range (0, {result.weights.efficiency_max:g}), validation MAPE "
        f"{result.best_val_mape:.2f}%; wrote {path}\n"
        f"data and features took {loaded:.1f} s, training {result.seconds:.1f} s, "
        f"{time.perf_counter() - start:.1f} s in all"
    )


@click.command("kernels")
@_category_option(multiple=True)
@_data_options
@click.option("--holdout", "holdouts", multiple=True, metavar="GPU",
              help="Retrain without this GPU and score on it (repeatable).")
@schedule_options
@output_format_options
def eval_kernels_command(categories: tuple[str, ...], max_rows: int, seed: int, vidur_root: Path,
                         extra_data: Path | None, holdouts: tuple[str, ...], output_format: str,
                         **schedule: int | None) -> None:
    """MAPE (%) of predicted kernel times per category and GPU for the roofline, the baselines (linear, NeuSight,
    Habitat) and the MLP.

    Seen GPUs: the shapes the shipped weights held out from their training (whatever --seed draws the sample),
    scored with those weights; the baselines are fitted on the other
    shapes. Each --holdout GPU: the MLP retrained (same seed and settings) and the baselines fitted without any
    row of that GPU, scored on all its sampled rows.
    """
    import time

    from servesim.errors import ServesimError
    from servesim.training.datasets import load_samples, require_measured, split_by_shape
    from servesim.estimator.mlp import shipped_weights
    from servesim.training.train import (
        PREDICTORS,
        mape_by_gpu,
        never_trained_on,
        predict_samples_us,
        predictor_times_us,
        train_mlp,
    )
    from servesim.hardware import get_gpu

    start = time.perf_counter()
    config = train_config(seed, **schedule)
    held_gpus = tuple(get_gpu(h).name for h in holdouts)
    rows = []
    show = _terminal_status()
    for category in categories:
        weights = shipped_weights().get(category)
        if weights is None:
            raise ServesimError(f"no shipped weights for {category}; train them with servesim train --category "
                                f"{category}")
        show(f"{category}: loading up to {max_rows:,} measured rows and computing their features")
        samples = load_samples(category, max_rows=max_rows, seed=seed, options=_options(vidur_root, extra_data))
        require_measured(samples, held_gpus)
        split = split_by_shape(samples.shape_id, seed)
        held_out = never_trained_on(weights, samples.shape_id)
        seen = samples.subset(held_out)
        show(f"{category}: fitting the baselines and scoring the seen GPUs")
        predictions = predictor_times_us(samples.subset(~held_out), seen, predict_samples_us(weights, seen))
        rows += [{"category": category, "set": "seen GPU, held-out shapes", **r}
                 for r in mape_by_gpu(seen, predictions)]
        for number, gpu_name in enumerate(held_gpus, 1):
            held = samples.gpu == gpu_name
            label = f"{category}: retraining without {gpu_name} ({number}/{len(held_gpus)})"
            show(label)
            result = train_mlp(samples, ~held & ~split.val, ~held & split.val, config,
                               on_epoch=_epoch_status(show, label))
            show(f"{category}: fitting the baselines without {gpu_name}")
            unseen = samples.subset(held)
            mlp_us = predict_samples_us(result.weights, unseen)
            predictions = predictor_times_us(samples.subset(~held), unseen, mlp_us)
            rows += [{"category": category, "set": "unseen GPU", **r}
                     for r in mape_by_gpu(unseen, predictions) if r["gpu"] != "all"]
    show("")
    columns = (Column("category", "category", align="<"), Column("set", "set", align="<"),
               Column("gpu", "GPU", align="<"), Column("rows", "rows", ","),
               *(Column(p, f"{p} %", ".1f") for p in PREDICTORS))
    notes = (
        "MAPE % of predicted vs measured kernel time. roofline: peak compute / DRAM bandwidth (L2's for what the "
        "timing loop left in L2); linear: least squares on GPU-level compute and DRAM time; neusight: tile waves x "
        "roofline / learned utilisation; habitat: the same shape measured on the nearest training GPU, "
        "wave-scaled (roofline where no training GPU measured it, i.e. every held-out shape); mlp: (theoretical "
        "time + latency floor) / learned efficiency.",
        f"{max_rows:,} sampled rows per category, seed {seed}; retrainings up to {config.max_epochs} epochs"
        + (f" of at least {config.min_epoch_rows:,} rows" if config.min_epoch_rows else "") + ", "
        f"stopped after {config.patience_epochs} without a better validation MAPE; took "
        f"{time.perf_counter() - start:.0f} s.",
    )
    emit(rows, columns, output_format, title="Kernel time estimators: MAPE per category and GPU", notes=notes)


@click.command("efficiency")
@_category_option(multiple=True)
@_data_options
@output_format_options
def eval_efficiency_command(categories: tuple[str, ...], max_rows: int, seed: int, vidur_root: Path,
                            extra_data: Path | None, output_format: str) -> None:
    """The estimator's targets, efficiency = theoretical / measured time, per category, GPU and kernel source: a
    mapping bug (wrong backend, page size or shape) shows as a distribution far from the others'."""
    import numpy as np
    import pandas as pd

    from servesim.training.datasets import category_frame, sample_frame, samples_from_frame

    rows = []
    for category in categories:
        data = category_frame(category, _options(vidur_root, extra_data))
        frame = sample_frame(data.frame, max_rows, seed)
        samples = samples_from_frame(category, frame)
        finite = np.isfinite(samples.features.values).all(axis=1)
        table = pd.DataFrame({"group": samples.group, "source": samples.kernel_source, "finite": finite,
                              "efficiency": samples.efficiency, "theoretical_us": samples.theoretical_us,
                              "measured_us": samples.measured_us})
        for (group, source), part in table.groupby(["group", "source"], sort=True):
            q = part["efficiency"].quantile([0.05, 0.5, 0.95]).to_numpy()
            rows.append({"category": category, "group": group, "source": source, "rows": len(part),
                         "nonfinite": int((~part["finite"]).sum()),
                         "theoretical_us": part["theoretical_us"].median(), "measured_us": part["measured_us"].median(),
                         "p5": q[0], "p50": q[1], "p95": q[2], "max": part["efficiency"].max()})
        for reason, count in data.dropped.items():
            click.echo(f"{category}: dropped {count:,} rows: {reason}", err=output_format != "table")
    columns = (Column("category", "category", align="<"), Column("group", "GPU", align="<"),
               Column("source", "engine and kernel source", align="<"), Column("rows", "rows", ","),
               Column("nonfinite", "non-finite", ","), Column("theoretical_us", "theoretical µs (median)", ",.1f"),
               Column("measured_us", "measured µs (median)", ",.1f"), Column("p5", "eff p5", ".3f"),
               Column("p50", "eff p50", ".3f"), Column("p95", "eff p95", ".3f"), Column("max", "eff max", ".2f"))
    emit(rows, columns, output_format, title="Efficiency = theoretical / measured time of the measured rows",
         notes=(f"at most {max_rows:,} sampled rows per category, seed {seed}.",))


COMMANDS = [train_command]
#: Subcommands of ``servesim eval`` (the group lives in cli/comm.py).
EVAL_SUBCOMMANDS = [eval_kernels_command, eval_efficiency_command]
