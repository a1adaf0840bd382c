"""``servesim kernels``: the kernel sequence one engine step launches on one GPU."""

from __future__ import annotations

from typing import Any

import click

from servesim.cli.output import Column, emit, output_format_options
from servesim.cli.params import DIMENSION, dp_option, engine_option, ep_option
from servesim.kernels.batch import BATCH_SYNTAX_HELP

COLUMNS = (
    Column("layers", "layers", align="<"),
    Column("name", "op", align="<"),
    Column("kind", "kind", align="<"),
    Column("shape", "shape", align="<"),
    Column("dtype", "dtype", align="<"),
    Column("gflop", "GFLOP", ",.3f"),
    Column("mbytes", "MB moved", ",.2f"),
    Column("comm_mbytes", "MB comm", ",.2f"),
)


def _row(layers: str, op: Any) -> dict[str, Any]:
    from servesim.kernels.types import Collective

    if isinstance(op, Collective):
        return {"layers": layers, "name": op.name, "kind": op.op, "shape": op.shape(), "dtype": op.dtype,
                "gflop": None, "mbytes": None, "comm_mbytes": op.bytes / 1e6}
    return {"layers": layers, "name": op.name, "kind": op.category, "shape": op.shape(), "dtype": op.dtype,
            "gflop": op.flops() / 1e9, "mbytes": op.bytes_moved() / 1e6, "comm_mbytes": None}


def _table_rows(step: Any, all_layers: bool) -> list[dict[str, Any]]:
    """Ops outside the layers as they come; layers grouped into runs of identical layers ("1-79") unless asked."""
    first = next(i for i, s in enumerate(step.ops) if s.layer is not None)  # every stage has a layer
    before = [s.op for s in step.ops[:first]]
    after = [s.op for s in step.ops[first:] if s.layer is None]
    rows = [_row("-", op) for op in before]
    if all_layers:
        rows += [_row(str(s.layer), s.op) for s in step.ops if s.layer is not None]
    else:
        for first, last, ops in step.layer_runs():
            label = str(first) if first == last else f"{first}-{last} (x{last - first + 1})"
            rows += [_row(label, op) for op in ops]
    return rows + [_row("-", op) for op in after]


def _json_op(layer: int | None, op: Any) -> dict[str, Any]:
    from dataclasses import asdict

    from servesim.kernels.types import Collective

    record = {"layer": layer, "name": op.name, **asdict(op)}
    if isinstance(op, Collective):
        return {**record, "kind": op.op}
    return {**record, "kind": op.category, "flops": op.flops(), "bytes_moved": op.bytes_moved()}


@click.command("kernels")
@click.option("--model", "model_ref", required=True, help="Preset name, config.json path or Hugging Face hub id.")
@engine_option
@click.option("--gpu", "gpu_name", default="H100", show_default=True, help="GPU from 'servesim gpus'.")
@click.option("--tp", default=1, show_default=True, type=DIMENSION, help="Tensor-parallel size.")
@click.option("--pp", default=1, show_default=True, type=DIMENSION, help="Pipeline-parallel size.")
@ep_option
@dp_option
@click.option("--stage", default=0, show_default=True, type=int, help="Pipeline stage to show (0-based).")
@click.option("--dtype", default="bf16", show_default=True,
              help="Weights: bf16, fp16, fp8 (W8A8 per-tensor), fp8-block (W8A8, 128x128 blocks), mxfp4 (gpt-oss experts), int4 (Kimi-K2.5 experts) or nvfp4 (NVIDIA's NVFP4 releases, Blackwell).")
@click.option("--batch", "batch_text", required=True, help=f"The step's requests. {BATCH_SYNTAX_HELP}")
@click.option("--all-layers", is_flag=True, help="List every layer instead of grouping identical layers.")
@output_format_options
def kernels_command(
    model_ref: str, engine: str, gpu_name: str, tp: int, pp: int, ep: int, dp: int, stage: int, dtype: str,
    batch_text: str, all_layers: bool, output_format: str,
) -> None:
    """Show the kernels one engine step launches on one GPU: shapes, FLOPs, bytes moved, collectives, totals.

    \b
    Example: servesim kernels --model llama3-70b --engine vllm --tp 4 --batch "prefill:2048, decode:16x1024"
    """
    from servesim.hardware import get_gpu
    from servesim.kernels.batch import parse_batch
    from servesim.kernels.expand import expand
    from servesim.models import get_model
    from servesim.models.config import check_context
    from servesim.models.parallel import Parallelism, check_layout
    from servesim.serving.engines import parse_engine

    model = get_model(model_ref)
    gpu = get_gpu(gpu_name)
    check_layout(model, gpu, Parallelism(tp, pp, ep, dp))
    batch = parse_batch(batch_text)
    check_context(model, batch.kv_lens, fix="shorten the batch's requests")
    engine_class, release = parse_engine(engine)
    engine_class.check_expert_parallel(Parallelism(tp, pp, ep, dp))
    step = expand(release.engine, model, gpu, batch, tp=tp, pp=pp, stage=stage, dtype=dtype, ep=ep, dp=dp)
    n_kernels, n_collectives = len(step.kernels), len(step.collectives)
    title = (
        f"{model.name} on {gpu.name}, {release.label} (kernels of {step.engine} {step.engine_version}), "
        f"tp={tp} pp={pp}{f' ep={ep}' if ep > 1 else ''}{f' dp={dp}' if dp > 1 else ''} stage {stage} (layers {step.first_layer}-{step.end_layer - 1}), {dtype}: {batch.describe()} -> {batch.num_tokens} tokens"
    )
    graph = step.graph_mode if not step.in_cuda_graph else f"{step.graph_mode} (padded to {step.padded_tokens} tokens)"
    notes = (
        f"attention backend {step.attention_backend}; CUDA graph: {graph}",
        f"step total: {step.flops / 1e12:,.3f} TFLOP, {step.bytes_moved / 1e9:,.3f} GB moved, "
        f"{step.collective_bytes / 1e9:,.3f} GB in collectives; {n_kernels} kernels, {n_collectives} collectives",
    )
    payload = {
        "model": model.name, "gpu": gpu.name, "engine": step.engine, "release": release.label,
        "engine_version": step.engine_version,
        "tp": tp, "pp": pp, "ep": ep, "dp": dp, "stage": stage, "dtype": dtype, "batch": batch.describe(),
        "num_tokens": batch.num_tokens, "first_layer": step.first_layer, "end_layer": step.end_layer,
        "attention_backend": step.attention_backend, "cuda_graph": step.graph_mode,
        "padded_tokens": step.padded_tokens,
        "totals": {"flops": step.flops, "bytes_moved": step.bytes_moved, "collective_bytes": step.collective_bytes,
                   "kernels": n_kernels, "collectives": n_collectives},
        "ops": [_json_op(s.layer, s.op) for s in step.ops],
    }
    emit(_table_rows(step, all_layers), COLUMNS, output_format, title=title, notes=notes, json_payload=payload)


COMMANDS = [kernels_command]
