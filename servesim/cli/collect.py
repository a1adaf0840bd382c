"""``servesim collect``: time kernels on the local GPU into a training collection; ``servesim collect
check-grids DIR``: compare the launch grids it recorded with the decomposer's CTA counts."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from servesim.cli.output import Column, emit, output_format_options

#: Grid axes (servesim.collect.sweep.ALL_AXES) as CLI options, in order.
_AXIS_HELP = {
    "m": "GEMM rows (tokens), comma-separated.",
    "n": "GEMM output features.",
    "k": "GEMM input features.",
    "batch": "Attention: sequences in the batch.",
    "seq_len": "Prefill attention: new tokens per sequence.",
    "prefix_len": "Prefill attention: cached tokens before them (default 0).",
    "heads": "Attention and RoPE: query/KV head pairs per GPU, e.g. 32/8,8/1.",
    "head_dim": "Attention and RoPE: head dimension.",
    "kv_len": "Decode attention: cached tokens per sequence.",
    "tokens": "RMSNorm, SiLU&Mul, RoPE, residual add: tokens. Alone, the token counts of the model sweep.",
    "hidden": "RMSNorm, residual add: hidden size. SiLU&Mul: output width (the per-GPU intermediate size).",
}

_COUNT_COLUMNS = (
    Column("category", "category", align="<"),
    Column("kernel_source", "kernel source", align="<"),
    Column("file", "file", align="<"),
    Column("measured", "measured"),
    Column("already", "already there"),
    Column("skipped", "skipped"),
)
_PLAN_COLUMNS = (
    Column("category", "category", align="<"),
    Column("file", "file", align="<"),
    Column("shapes", "shapes"),
    Column("first", "first shape", align="<"),
    Column("last", "last shape", align="<"),
)
_AGREEMENT_COLUMNS = (
    Column("gpu", "GPU", align="<"),
    Column("category", "category", align="<"),
    Column("kernel_source", "kernel source", align="<"),
    Column("shapes", "shapes"),
    Column("exact", "exact CTAs"),
    Column("median_ratio", "median measured/predicted", ".2f"),
    Column("min_ratio", "min", ".2f"),
    Column("max_ratio", "max", ".2f"),
)
_CHECK_COLUMNS = (
    Column("category", "category", align="<"),
    Column("kernel_source", "kernel source", align="<"),
    Column("shape", "shape", align="<"),
    Column("kernel_name", "main kernel", align="<"),
    Column("kernels", "kernels"),
    Column("measured_ctas", "measured CTAs"),
    Column("predicted_ctas", "predicted CTAs", ".0f"),
    Column("measured_threads", "threads"),
    Column("predicted_threads", "predicted threads", ".0f"),
)


def _axis_options(func):
    for axis in reversed(tuple(_AXIS_HELP)):
        func = click.option(f"--{axis.replace('_', '-')}", axis, metavar="LIST", help=_AXIS_HELP[axis])(func)
    return func


@click.group("collect", invoke_without_command=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the CSVs and manifest.json; a run into an existing collection skips measured shapes.")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="cuda: the local GPU (CUDA_VISIBLE_DEVICES picks it). cpu: test the collector; rows say 'cpu'.")
@click.option("--gpu", "gpu_name", metavar="NAME",
              help="Catalogue name of the GPU (default: looked up from the CUDA device name).")
@click.option("--category", "categories", multiple=True, metavar="NAME",
              help="gemm, scaled_mm, context_attention, generation_attention, rmsnorm, silu_mul, rope, "
                   "residual_add (repeatable; default all).")
@_axis_options
@click.option("--sweep", "sweep_file", type=click.Path(dir_okay=False, path_type=Path),
              help="TOML or JSON sweep file (docs/collect.md) instead of the options.")
@click.option("--model", "models", multiple=True, metavar="PRESET",
              help="Model sweep: preset models whose kernels to measure (repeatable; default nine dense presets).")
@click.option("--tp", "tps", default="", metavar="LIST", help="Model sweep: TP degrees (default 1,2,4,8).")
@click.option("--impl", "impls", multiple=True, metavar="NAME",
              help="Run only this implementation for its category (repeatable), e.g. flash_attn.")
@click.option("--warmup", default=10, show_default=True, help="Untimed calls before timing.")
@click.option("--repetitions", default=50, show_default=True, help="Timed calls; the median is reported.")
@click.option("--timing", "timing_method", type=click.Choice(["events", "graph"]), default="events",
              show_default=True, help="CUDA events around each call, or around a CUDA-graph replay.")
@click.option("--graph-launches", default=10, show_default=True, help="Calls captured per graph (--timing graph).")
@click.option("--flush-mib", type=float, default=None,
              help="L2 flush buffer overwritten before each call [default: 2x the GPU's L2; 64 on CPU].")
@click.option("--max-shapes", type=int, default=None, help="Measure an evenly spaced subset of this many shapes.")
@click.option("--time-budget-s", type=float, default=None,
              help="Stop starting new measurements after this many seconds (resume later with the same command).")
@click.option("--no-launches", is_flag=True, help="Do not record kernel launches with torch.profiler.")
@click.option("--dry-run", is_flag=True, help="Print the planned shapes and exit (imports no torch).")
@output_format_options
@click.pass_context
def collect_group(ctx: click.Context, out: Path | None, device: str, gpu_name: str | None,
                  categories: tuple[str, ...], sweep_file: Path | None, models: tuple[str, ...], tps: str,
                  impls: tuple[str, ...], warmup: int, repetitions: int, timing_method: str, graph_launches: int,
                  flush_mib: float | None, max_shapes: int | None, time_budget_s: float | None, no_launches: bool,
                  dry_run: bool, output_format: str, **axes: str | None) -> None:
    """Time kernels on the local CUDA GPU (torch) into per-category CSVs the estimator trains from.

    Measures BF16 GEMM (cuBLAS), FP8 scaled-MM, prefill and decode attention (SDPA flash; flash-attn and
    FlashInfer when installed), RMSNorm, SiLU&Mul, RoPE and residual add. Without shape options it measures the
    shapes the engines launch for the preset models. See docs/collect.md.
    """
    if ctx.invoked_subcommand is not None:
        return
    from servesim.collect.schema import CATEGORIES, get_schema
    from servesim.collect.sweep import plan_shapes, sweeps_from_options
    from servesim.errors import ServesimError

    chosen = tuple(get_schema(c).name for c in dict.fromkeys(categories))
    sweeps = sweeps_from_options(chosen, {a: t for a, t in axes.items() if t is not None}, sweep_file, models, tps)
    shapes = plan_shapes(sweeps, max_shapes)
    # Everything the command line says is checked before a dry run prints its plan, which is what it is for.
    if flush_mib is not None and not flush_mib >= 0:
        raise ServesimError(f"--flush-mib must be 0 or more, not {flush_mib:g}")
    if time_budget_s is not None and not time_budget_s > 0:
        raise ServesimError(f"--time-budget-s must be positive, not {time_budget_s:g}")
    from servesim.collect.run import gpu_option
    from servesim.collect.timing import TimingSettings

    gpu = gpu_option(gpu_name) if gpu_name else None
    timing = TimingSettings(warmup=warmup, repetitions=repetitions, method=timing_method, graph_launches=graph_launches)
    if dry_run:
        rows = []
        for category in dict.fromkeys(s.category for s in shapes):
            of = [s for s in shapes if s.category == category]
            rows.append({"category": category, "file": CATEGORIES[category].file, "shapes": len(of),
                         "first": of[0].describe(), "last": of[-1].describe()})
        payload = {"shapes": [{"category": s.category, **s.as_dict()} for s in shapes],
                   "sweeps": [s.describe() for s in sweeps]}
        emit(rows, _PLAN_COLUMNS, output_format, title=f"planned sweep: {len(shapes):,} shapes",
             json_payload=payload)
        return
    if out is None:
        raise ServesimError("--out is required: the folder the CSVs and manifest.json are written to")
    from servesim.collect.run import CollectRequest, collect

    request = CollectRequest(
        out=out, device=device, gpu=gpu, shapes=tuple(shapes), sweeps=tuple(s.describe() for s in sweeps),
        implementations=impls, timing=timing,
        flush_bytes=None if flush_mib is None else int(flush_mib * 2**20), time_budget_s=time_budget_s,
        record_launches=not no_launches, command=shlex.join(["servesim", *sys.argv[1:]]),
    )
    result = collect(request, progress=lambda line: click.echo(line, err=True))
    measured = sum(r["measured"] for r in result.counts)
    notes = [f"skipped {r['shapes']} {r['category']} {r['kernel_source']}: {r['reason']}" for r in result.skipped]
    if result.remaining:
        notes.append(f"time budget spent: {result.remaining} measurements left; run the same command to resume")
    if result.device.kind == "cpu":
        notes.append("CPU timings (--device cpu): they test the collector and are not GPU measurements.")
    emit(list(result.counts), _COUNT_COLUMNS, output_format,
         title=f"{measured:,} measurements on {result.device.label} ({result.device.name}) into {result.directory}",
         notes=notes,
         json_payload={"directory": str(result.directory), "gpu": result.device.label,
                       "device_name": result.device.name, "counts": list(result.counts),
                       "skipped": list(result.skipped), "remaining": result.remaining})


@collect_group.command("check-grids")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--per-shape", is_flag=True, help="One row per measured shape instead of the summary.")
@output_format_options
def check_grids_command(directory: Path, per_shape: bool, output_format: str) -> None:
    """Compare the CUDA launch grids a collection recorded (launches.csv) with servesim.decompose's CTA counts
    for the same shapes: each shape's longest kernel against the decomposer's largest launch."""
    from servesim.collect.launches import check_grids, grid_agreement

    checked = check_grids(directory)
    if per_shape:
        emit(checked.to_dict("records"), _CHECK_COLUMNS, output_format, title=f"launch grids in {directory}")
        return
    unmapped = checked[checked["predicted_ctas"].isna()]
    notes = [f"{len(unmapped)} shape(s) of {', '.join(sorted(set(unmapped['category'])))} have no decomposer mapping"
             ] if len(unmapped) else []
    emit(grid_agreement(checked).to_dict("records"), _AGREEMENT_COLUMNS, output_format,
         title=f"CTAs of each shape's longest kernel, measured vs servesim.decompose, in {directory}", notes=notes)


COMMANDS = [collect_group]
