"""``servesim gpus`` and ``servesim models``: what servesim can plan for."""

from __future__ import annotations

import click

from servesim.cli.output import Column, emit, output_format_options

GPU_COLUMNS = (
    Column("name", "GPU", align="<"),
    Column("architecture", "arch", align="<"),
    Column("sm_count", "SMs"),
    Column("bf16_tflops", "BF16 TFLOPS", ",.0f"),
    Column("fp8_tflops", "FP8 TFLOPS", ",.0f"),
    Column("memory_gib", "memory GiB", ".0f"),
    Column("dram_bandwidth_gbps", "DRAM GB/s", ",.0f"),
    Column("nvlink_unidir_bandwidth_gbps", "NVLink GB/s/dir", ",.0f"),
    Column("price_usd_per_gpu_hour", "$/GPU-h", ".2f"),
    Column("aliases", "aliases", align="<"),
)

MODEL_COLUMNS = (
    Column("name", "model", align="<"),
    Column("hf_id", "Hugging Face id", align="<"),
    Column("params_b", "params B", ".1f"),
    Column("active_params_b", "active B", ".1f"),
    Column("layers", "layers"),
    Column("hidden", "hidden"),
    Column("heads", "heads"),
    Column("kv_heads", "KV heads"),
    Column("experts", "experts"),
    Column("kv_kib_per_token", "KV KiB/token", ".0f"),
)


@click.command("gpus")
@click.option("--details", "gpu_name", metavar="GPU", help="Show every figure of one GPU with its source.")
@output_format_options
def gpus_command(gpu_name: str | None, output_format: str) -> None:
    """List the GPUs servesim can plan for, with the figures predictions start from."""
    from servesim.hardware import get_gpu, load_catalogue

    if gpu_name:
        spec = get_gpu(gpu_name)
        rows = [
            {"field": key, "value": _format_value(getattr(spec, key)), "source": spec.sources.get(key, "")}
            for key in spec.__dataclass_fields__
            if key != "sources"
        ]
        columns = (Column("field", "field", align="<"), Column("value", "value", align="<"), Column("source", "source", align="<"))
        emit(rows, columns, output_format, title=spec.name)
        return
    rows = [
        {
            "name": spec.name,
            "architecture": spec.architecture,
            "sm_count": spec.sm_count,
            "bf16_tflops": spec.tensor_tflops("bf16"),
            "fp8_tflops": spec.tensor_tflops("fp8") or None,
            "memory_gib": spec.memory_gib,
            "dram_bandwidth_gbps": spec.dram_bandwidth_gbps,
            "nvlink_unidir_bandwidth_gbps": spec.nvlink_unidir_bandwidth_gbps,
            "price_usd_per_gpu_hour": spec.price_usd_per_gpu_hour,
            "price_date": spec.price_date,
            "aliases": ", ".join(spec.aliases),
        }
        for spec in load_catalogue().values()
    ]
    emit(rows, GPU_COLUMNS, output_format, notes=("TFLOPS: dense Tensor-core peak at the sustained clock.",))


def _format_value(value: object) -> str:
    if isinstance(value, tuple):
        return ", ".join(map(str, value))
    if hasattr(value, "items"):
        return ", ".join(f"{k}={v:g}" for k, v in value.items())
    return str(value)


@click.command("models")
@output_format_options
def models_command(output_format: str) -> None:
    """List the built-in model presets (any Hugging Face config.json or hub id works too)."""
    from servesim.models import load_preset

    from servesim.models.registry import preset_names

    rows = []
    for name in preset_names():
        model = load_preset(name)
        rows.append(
            {
                "name": name,
                "hf_id": model.source,
                "params_b": model.total_params() / 1e9,
                "active_params_b": model.active_params() / 1e9,
                "layers": model.num_layers,
                "hidden": model.hidden_size,
                "heads": model.num_attention_heads,
                "kv_heads": model.num_kv_heads,
                "experts": f"{model.num_experts} (top-{model.num_experts_per_tok})" if model.is_moe else "-",
                "kv_kib_per_token": model.kv_bytes_per_token() / 1024,
            }
        )
    emit(
        rows,
        MODEL_COLUMNS,
        output_format,
        notes=("KV KiB/token: BF16 K and V of every layer, whole model.",
               "Also accepted by --model: a path to a config.json, or a Hugging Face hub id (org/name)."),
    )


COMMANDS = [gpus_command, models_command]
