"""``servesim validate``: predicted against measured serving runs (``silicon``, ``results``) and kernel times
(``ops``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import click

from servesim.cli.output import Column, emit, estimator_option, output_format_options, render_table, to_csv, to_json
from servesim.cli.params import DIMENSION, OutputFile, engine_behaviour_options, engine_spec
from servesim.errors import ServesimError
from servesim.serving.engines import ENGINES

_ERROR_COLUMNS = (
    Column("rows", "rows", ",d"),
    Column("ttft_mape_pct", "TTFT MAPE %", ".1f"),
    Column("ttft_bias_pct", "TTFT bias %", "+.1f"),
    Column("tpot_mape_pct", "TPOT MAPE %", ".1f"),
    Column("tpot_bias_pct", "TPOT bias %", "+.1f"),
)
_AIC_COLUMNS = (
    Column("aic_ttft_mape_pct", "aic TTFT MAPE %", ".1f"),
    Column("aic_tpot_mape_pct", "aic TPOT MAPE %", ".1f"),
)
_ROW_COLUMNS = (
    Column("case_id", "run", align="<"),
    Column("model_id", "model", align="<"),
    Column("gpu", "GPU", align="<"),
    Column("engine", "engine", align="<"),
    Column("tp", "TP", "d"),
    Column("ep", "EP", "d"),
    Column("isl", "ISL", ",.0f"),
    Column("osl", "OSL", ",.0f"),
    Column("concurrency", "conc.", ","),
    Column("measured_ttft_ms", "TTFT meas.", ",.1f"),
    Column("predicted_ttft_ms", "TTFT pred.", ",.1f"),
    Column("ttft_error", "TTFT err", "+.1%"),
    Column("measured_tpot_ms", "TPOT meas.", ",.2f"),
    Column("predicted_tpot_ms", "TPOT pred.", ",.2f"),
    Column("tpot_error", "TPOT err", "+.1%"),
)
_E2E_COLUMNS = (
    Column("measured_e2e_ms", "E2E meas.", ",.0f"),
    Column("predicted_e2e_ms", "E2E pred.", ",.0f"),
    Column("e2e_error", "E2E err", "+.1%"),
)
_SKIPPED_COLUMNS = (Column("reason", "reason", align="<"), Column("rows", "rows", ",d"),
                    Column("example", "example run", align="<"))


jobs_option = click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
                           help="Processes replaying the runs [default: the CPU count].")


def _progress(total: int, label: str) -> tuple[Callable[..., None], Callable[[], None]]:
    """(tick, close): a progress bar on stderr when it is a terminal, else nothing."""
    if not sys.stderr.isatty():
        return (lambda *_: None), (lambda: None)
    bar = click.progressbar(length=total, label=label, file=sys.stderr)
    bar.__enter__()
    return (lambda *_: bar.update(1)), (lambda: bar.__exit__(None, None, None))


def _error_summary(rows: Sequence[dict]) -> str:
    """One line: MAPE and bias of each compared metric over ``rows``."""
    import pandas as pd

    from servesim.validate.report import errors_summary

    summary = errors_summary(pd.DataFrame(rows))
    return "over these runs: " + ", ".join(
        f"{label} MAPE {summary[f'{key}_mape_pct']:.1f} % (bias {summary[f'{key}_bias_pct']:+.1f} %)"
        for key, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E")) if f"{key}_mape_pct" in summary)


def _skipped_summary(skipped: Sequence) -> list[dict[str, object]]:
    by_reason: dict[str, list] = {}
    for item in skipped:
        by_reason.setdefault(item.reason, []).append(item)
    return [{"reason": reason, "rows": len(items), "example": items[0].case_id}
            for reason, items in sorted(by_reason.items(), key=lambda kv: -len(kv[1]))]


def _print_tables(tables: Sequence[tuple[str, Sequence[dict], Sequence[Column]]], notes: Sequence[str]) -> None:
    for title, rows, columns in tables:
        if rows:
            click.echo(render_table(rows, columns, title))
            click.echo()
    for note in notes:
        click.echo(note)


@click.group("validate")
def validate_group() -> None:
    """Compare servesim's predictions with measured serving runs and kernel times (docs/validation.md)."""


@validate_group.command("silicon")
@click.option("--gpu", "gpus", multiple=True,
              help="GPU (repeatable) [default: H100-SXM, H200, B200, B300 and GB200].")
@click.option("--engine", "engines", multiple=True, type=click.Choice(tuple(ENGINES)),
              help="Engine (repeatable) [default: every one in the registry].")
@click.option("--model", "models", multiple=True, help="Hugging Face id or preset (repeatable) [default: all].")
@click.option("--row-id", "row_ids", multiple=True, help="Only these silicon_sample ids (repeatable).")
@estimator_option
@click.option("--aiconfigurator", "with_aic", is_flag=True,
              help="Add aiconfigurator's own estimate of each row (needs 'pip install aiconfigurator'; slow).")
@click.option("--plot", "plot_path", type=OutputFile(), default=None,
              help="Write the predicted-vs-measured scatter plot (PNG).")
@click.option("--rows-csv", type=OutputFile(), default=None,
              help="Write every replayed row with its predictions and errors.")
@jobs_option
@output_format_options
def silicon_command(gpus, engines, models, row_ids, estimator, with_aic, plot_path, rows_csv, jobs,
                    output_format) -> None:
    """Replay aiconfigurator-core's measured vLLM/SGLang runs (silicon_sample.csv, aggregated mode) and report
    TTFT and TPOT errors per GPU, engine, model and TP, on the calibration's training and test rows.

    \b
    servesim validate silicon --plot docs/img/validation_scatter.png
    servesim validate silicon --gpu H200 --engine vllm --model meta-llama/Llama-3.1-70B --csv
    """
    import pandas as pd

    from servesim.validate.calibration import TRAIN_RULE, is_training_row
    from servesim.validate.replay import replay
    from servesim.validate.report import (
        GROUP_KEYS,
        TPOT_BAR_PCT,
        TTFT_BAR_PCT,
        against_bar,
        bias_by_concurrency,
        grouped_errors,
        scatter_plot,
    )
    from servesim.validate.silicon import (
        BAR_PRESETS,
        SILICON_ENGINES,
        SILICON_GPUS,
        load_silicon_rows,
        silicon_cases,
    )

    rows = load_silicon_rows(gpus or SILICON_GPUS, engines or SILICON_ENGINES, models or None)
    if row_ids:
        missing = sorted(set(row_ids) - set(rows["id"]))
        if missing:
            raise ServesimError(f"no selected aggregated row has id {', '.join(missing)}")
        rows = rows[rows["id"].isin(row_ids)]
    cases, skipped = silicon_cases(rows)
    tick, close = _progress(len(cases), "replaying")
    replayed, refused = replay(cases, estimator, on_case=tick, jobs=jobs)
    close()
    skipped += refused
    frame = pd.DataFrame(replayed)
    if frame.empty:
        raise ServesimError("none of the selected rows could be replayed; see the reasons with --json")
    frame["split"] = frame.apply(is_training_row, axis=1).map({True: "train", False: "test"})
    aic_failed: list[tuple[str, str]] = []
    if with_aic:
        from servesim.validate.aic import aiconfigurator_estimates, with_aiconfigurator

        tick, close = _progress(len(frame), "aiconfigurator")
        estimates, aic_failed = aiconfigurator_estimates(rows[rows["id"].isin(frame["case_id"])], on_row=tick)
        close()
        frame = with_aiconfigurator(frame, estimates)
    groups = grouped_errors(frame, [*GROUP_KEYS, "split"])
    overall = grouped_errors(frame, ["split", "engine"])
    bar = against_bar(frame[frame["preset"].isin(BAR_PRESETS)], ["split", "engine"])
    by_concurrency = bias_by_concurrency(frame, ["split"])
    if plot_path is not None:
        scatter_plot(frame, plot_path, f"servesim vs silicon_sample.csv ({estimator} estimator; hollow: test rows)")
    if rows_csv is not None:
        frame.to_csv(rows_csv, index=False, float_format="%.4f")
    skipped_table = _skipped_summary(skipped)
    if output_format == "json":
        click.echo(to_json({"estimator": estimator, "train_rule": TRAIN_RULE, "groups": groups, "overall": overall,
                            "bar": bar, "by_concurrency": by_concurrency, "rows": frame.to_dict("records"),
                            "skipped": [vars(s) for s in skipped],
                            "aiconfigurator_failed": [{"id": i, "reason": r} for i, r in aic_failed]}))
        return
    if output_format == "csv":
        click.echo(to_csv(frame.to_dict("records"), list(frame.columns)), nl=False)
        return
    error_columns = (*_ERROR_COLUMNS, *(_AIC_COLUMNS if with_aic else ()))
    key_columns = (Column("gpu", "GPU", align="<"), Column("engine", "engine", align="<"),
                   Column("model_id", "model", align="<"), Column("dtype", "weights", align="<"),
                   Column("tp", "TP", "d"), Column("ep", "EP", "d"), Column("dp", "DP", "d"),
                   Column("split", "split", align="<"))
    notes = [f"{len(frame)} rows replayed with the {estimator} estimator, {len(skipped)} skipped; train/test: "
             f"{TRAIN_RULE}; errors are predicted / measured - 1 (bias = mean signed error)."]
    if aic_failed:
        notes.append(f"aiconfigurator could not estimate {len(aic_failed)} rows (--json lists them).")
    _print_tables([
        ("Errors per GPU, engine, model, weights, TP, EP and DP", groups, (*key_columns, *error_columns)),
        ("Overall", overall, (Column("split", "split", align="<"), Column("engine", "engine", align="<"),
                              *error_columns)),
        (f"Against the bar (TTFT MAPE ≤ {TTFT_BAR_PCT:g} %, TPOT MAPE ≤ {TPOT_BAR_PCT:g} %) on its models' rows: "
         f"{', '.join(BAR_PRESETS)}", bar, (Column("split", "split", align="<"), Column("engine", "engine", align="<"),
                                            *error_columns, Column("meets_bar", "meets bar", align="<"))),
        ("By concurrency", by_concurrency, (Column("split", "split", align="<"),
                                            Column("concurrency_bucket", "clients", align="<"), *error_columns)),
        ("Skipped rows", skipped_table, _SKIPPED_COLUMNS),
    ], notes)


@validate_group.command("ops")
@click.option("--vidur-root", type=click.Path(file_okay=False, path_type=Path), default=Path("../shared/data/vidur"),
              show_default=True, help="Folder holding Vidur's compute/ tables.")
@click.option("--gpu", "gpus", multiple=True,
              help="Only these GPUs (repeatable) [default: every GPU folder under compute/].")
@click.option("--estimator", "estimators", multiple=True, help="Estimators to score (repeatable) [default: all].")
@output_format_options
def ops_command(vidur_root, gpus, estimators, output_format) -> None:
    """Vidur's measured per-layer operator times against servesim's kernel estimators, shape for shape: MAPE and
    median signed error per GPU and operator.

    \b
    servesim validate ops --vidur-root ../shared/data/vidur

    Any GPU folder under compute/ (Vidur's a100 and h100, or a Vidur-format profile of another GPU in a folder such
    as a40 or l40s) whose name is a GPU of 'servesim gpus' is read.
    """
    from servesim.estimator.base import ESTIMATORS, get_estimator
    from servesim.hardware import get_gpu
    from servesim.validate.ops import compare_ops, load_ops, ops_summary

    names = tuple(estimators) or tuple(sorted(ESTIMATORS))
    for name in names:
        get_estimator(name)  # unknown names fail here with the list of known ones
    frame = compare_ops(names, vidur_root, tuple(get_gpu(g).name for g in gpus) or None)
    rows = ops_summary(frame, names)
    if not rows:
        measured = sorted(load_ops(vidur_root)["gpu"].unique())
        raise ServesimError(f"Vidur's data in {vidur_root} has no operator times for {', '.join(gpus)}; it measured "
                            f"{', '.join(measured)}")
    columns = [Column("gpu", "GPU", align="<"), Column("op", "op", align="<"), Column("rows", "rows", ",d"),
               Column("median_measured_us", "median meas. µs", ",.1f")]
    for name in names:
        columns += [Column(f"{name}_mape_pct", f"{name} MAPE %", ".1f"),
                    Column(f"{name}_median_error_pct", f"{name} median err %", "+.1f")]
    columns.append(Column("note", "not compared because", align="<"))
    emit(rows, columns, output_format, title=f"Vidur per-operator times ({vidur_root}) vs servesim kernels",
         notes=["error = predicted / measured - 1 per measurement; Vidur's times are torch-profiler medians."])


@validate_group.command("results")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--model", default=None, help="Preset, Hugging Face id of a preset's architecture or config.json path [default: the file's model id].")
@click.option("--gpu", default=None, help="GPU from 'servesim gpus' [default: the file's metadata].")
@click.option("--engine", default=None, callback=engine_spec, metavar="ENGINE[==RELEASE]",
              help="Engine (and release, vllm==0.15.1) that served the runs [default: the file's metadata; an "
                   "engine alone: its newest modelled release].")
@click.option("--tp", type=DIMENSION, default=None, help="Tensor-parallel size [default: 1].")
@click.option("--pp", type=DIMENSION, default=None, help="Pipeline stages [default: 1].")
@click.option("--dtype", default=None, help="Weights: bf16, fp8, fp8-block, mxfp4, int4 or nvfp4 [default: bf16].")
@click.option("--max-num-seqs", type=DIMENSION, default=None,
              help="The server's --max-num-seqs / --max-running-requests [default: the engine's].")
@click.option("--max-num-batched-tokens", type=DIMENSION, default=None,
              help="The server's --max-num-batched-tokens / --chunked-prefill-size [default: the engine's].")
@click.option("--prompt-cycle", type=DIMENSION, default=None, metavar="N",
              help="The benchmark sent N distinct prompts in turn (request i repeats request i - N), so the "
                   "server's prefix cache served the repeats [default: every prompt distinct].")
@engine_behaviour_options
@estimator_option
@jobs_option
@output_format_options
def results_command(files, model, gpu, engine, tp, pp, dtype, max_num_seqs, max_num_batched_tokens, prompt_cycle,
                    prefix_caching, async_scheduling, estimator, jobs, output_format) -> None:
    """Replay your own 'vllm bench serve --save-result' JSON files, GuideLLM JSON reports or inference-perf
    report folders and compare.

    \b
    servesim validate results bench.json --gpu H100-SXM --engine vllm --tp 2
    servesim validate results bench.json --gpu L40S --engine vllm==0.15.1 --max-num-seqs 128 \\
        --max-num-batched-tokens 2048 --prompt-cycle 100
    servesim validate results guidellm.json --model llama3.1-8b --gpu H200 --engine sglang
    servesim validate results inference-perf-results/ --gpu H100-SXM --engine vllm==0.15.1 --tp 4
    """
    from servesim.validate.replay import replay
    from servesim.validate.results import Deployment, ServerFlags, result_cases

    flags = ServerFlags(max_num_seqs, max_num_batched_tokens, prefix_caching, async_scheduling, prompt_cycle)
    cases, not_comparable = result_cases(files, Deployment(model, gpu, engine, tp, pp, dtype), flags=flags)
    tick, close = _progress(len(cases), "replaying")
    rows, skipped = replay(cases, estimator, on_case=tick, jobs=jobs)
    close()
    skipped = not_comparable + skipped
    if not rows:
        reasons = "; ".join(f"{s.case_id}: {s.reason}" for s in skipped[:3])
        more = f" (and {len(skipped) - 3} more; --json lists them)" if len(skipped) > 3 else ""
        raise ServesimError(f"none of the {len(skipped)} runs could be replayed: {reasons}{more}")
    notes = [f"{len(rows)} runs replayed with the {estimator} estimator; error = predicted / measured - 1.",
             _error_summary(rows)]
    notes += [f"not replayed: {s.case_id}: {s.reason}" for s in skipped]
    columns = _ROW_COLUMNS + (_E2E_COLUMNS if any("e2e_error" in row for row in rows) else ())
    emit(rows, columns, output_format, title="Measured vs predicted", notes=notes,
         json_payload={"rows": rows, "skipped": [vars(s) for s in skipped]})


COMMANDS = [validate_group]
