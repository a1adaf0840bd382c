"""``servesim plan``: which GPU serves a model best, and at what cost."""

from __future__ import annotations

import click

from servesim.cli.output import Column, emit, output_format_options
from servesim.errors import ServesimError

PLAN_COLUMNS = (
    Column("gpu", "GPU", align="<"),
    Column("layout", "layout", align="<"),
    Column("fits", "fits"),
    Column("weights_gib_per_gpu", "weights GiB/GPU", ".1f"),
    Column("kv_cache_gib_per_gpu", "KV GiB/GPU", ".1f"),
    Column("kv_tokens", "KV tokens", ","),
    Column("max_concurrent_seqs", "max seqs", ","),
    Column("ttft_ms", "TTFT ms", ",.1f"),
    Column("tpot_batch1_ms", "TPOT@1 ms", ".2f"),
    Column("loaded_batch", "batch", ","),
    Column("tpot_loaded_ms", "TPOT@batch ms", ".2f"),
    Column("output_tokens_per_s_per_gpu", "out tok/s/GPU", ",.0f"),
    Column("usd_per_hour", "$/h", ",.2f"),
    Column("usd_per_million_output_tokens", "$/1M out tok", ",.3f"),
)


def _parse_price_overrides(values: tuple[str, ...]) -> dict[str, float]:
    from servesim.hardware import get_gpu
    from servesim.hardware.catalogue import parse_price

    prices = {}
    for value in values:
        name, sep, price = value.partition("=")
        if not sep:
            raise ServesimError(f"--price {value!r} needs the form GPU=USD_PER_GPU_HOUR, e.g. --price H100=2.10")
        prices[get_gpu(name).name] = parse_price(price, f"--price {value}")
    return prices


def _row(est) -> dict:
    from servesim.models.memory import GIB

    memory = est.memory
    return {
        "gpu": est.gpu.name,
        "layout": str(est.par),
        "num_gpus": est.par.num_gpus,
        "engine": est.engine.engine,
        "fits": est.fits,
        "weights_gib_per_gpu": memory.weight_bytes / GIB,
        "kv_cache_gib_per_gpu": max(memory.kv_cache_bytes, 0.0) / GIB,
        "kv_tokens": memory.kv_tokens,
        "max_concurrent_seqs": memory.max_sequences(est.input_len + est.output_len) if est.memory.fits else 0,
        "ttft_ms": est.ttft_ms,
        "tpot_batch1_ms": est.tpot_batch1_ms,
        "loaded_batch": est.loaded_batch,
        "tpot_loaded_ms": est.tpot_loaded_ms,
        "output_tokens_per_s_per_gpu": est.output_tokens_per_s_per_gpu,
        "usd_per_hour": est.usd_per_hour,
        "usd_per_million_output_tokens": est.usd_per_million_output_tokens,
        "price_usd_per_gpu_hour": est.gpu.price_usd_per_gpu_hour,
        "price_date": est.gpu.price_date,
        "note": None if est.fits else est.shortfall(),
    }


@click.command("plan")
@click.option("--model", "model_ref", required=True, help="Preset name (see 'servesim models'), a path to a config.json, or a Hugging Face hub id.")
@click.option("--gpus", "gpu_list", default="H100", show_default=True, help="Comma-separated GPU names or aliases (see 'servesim gpus'), or 'all'.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor-parallel GPUs per pipeline stage.")
@click.option("--pp", type=click.IntRange(min=1), default=1, show_default=True, help="Pipeline-parallel stages.")
@click.option("--engine", type=click.Choice(["vllm", "sglang"]), default="vllm", show_default=True, help="Serving engine whose kernels, defaults and memory rules are modelled.")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp8"]), default="bf16", show_default=True, help="Weight and activation precision (fp8 = W8A8 with per-tensor scales).")
@click.option("--input-len", type=click.IntRange(min=1), default=1024, show_default=True, help="Typical prompt length in tokens.")
@click.option("--output-len", type=click.IntRange(min=1), default=256, show_default=True, help="Typical output length in tokens.")
@click.option("--estimator", default="roofline", show_default=True, help="Kernel time estimator.")
@click.option("--max-num-seqs", type=click.IntRange(min=1), help="Cap on running requests (vLLM max_num_seqs, SGLang max_running_requests); engine default if unset.")
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1), help="Token budget per step / prefill chunk size; engine default if unset.")
@click.option("--memory-fraction", type=click.FloatRange(0, 1, min_open=True), help="vLLM gpu_memory_utilization or SGLang mem_fraction_static; engine default if unset.")
@click.option("--prices", "prices_file", type=click.Path(dir_okay=False), help="CSV of gpu,usd_per_gpu_hour[,date] overriding catalogue prices.")
@click.option("--price", "price_overrides", multiple=True, metavar="GPU=USD", help="Override one GPU's price per GPU-hour; repeatable.")
@output_format_options
def plan_command(
    model_ref: str,
    gpu_list: str,
    tp: int,
    pp: int,
    engine: str,
    dtype: str,
    input_len: int,
    output_len: int,
    estimator: str,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    memory_fraction: float | None,
    prices_file: str | None,
    price_overrides: tuple[str, ...],
    output_format: str,
) -> None:
    """Estimate, per GPU, whether the model fits, its TTFT, TPOT, throughput and cost.

    Example: servesim plan --model llama3-70b --tp 4 --gpus H100,H20
    """
    from datetime import date

    from servesim.estimator import get_estimator
    from servesim.hardware import apply_prices, load_prices, parse_gpu_list
    from servesim.models import get_model
    from servesim.models.parallel import Parallelism, validate_parallelism
    from servesim.planner.estimate import estimate_gpu
    from servesim.serving.config import default_engine_config

    model = get_model(model_ref)
    par = Parallelism(tp, pp)
    validate_parallelism(model, par)
    gpus = parse_gpu_list(gpu_list)
    if prices_file:
        gpus = apply_prices(gpus, load_prices(prices_file), f"user price file {prices_file}")
    overrides = _parse_price_overrides(price_overrides)
    gpus = apply_prices(gpus, {k: (v, str(date.today())) for k, v in overrides.items()}, "--price on the command line")
    for gpu in gpus:
        if par.tp > gpu.gpus_per_node:
            raise ServesimError(f"TP={par.tp} exceeds the {gpu.gpus_per_node} GPUs of one {gpu.name} node; use TP ≤ {gpu.gpus_per_node} and PP for more GPUs")
    kernel_estimator = get_estimator(estimator)

    rows = []
    for gpu in gpus:
        cfg = default_engine_config(engine, gpu, par).with_overrides(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, memory_fraction=memory_fraction
        )
        rows.append(_row(estimate_gpu(model, gpu, par, cfg, kernel_estimator, input_len, output_len, dtype)))

    misfits = [r for r in rows if not r["fits"]]
    if len(misfits) == len(rows) and output_format == "table":
        reasons = "; ".join(f"{r['gpu']} {r['layout']}: {r['note']}" for r in misfits)
        raise ServesimError(f"{model.name} ({dtype}) does not fit: {reasons}")

    title = (
        f"{model.name} ({dtype}) with {engine}, {input_len} prompt + {output_len} output tokens per request\n"
        f"estimator: {kernel_estimator.label}"
    )
    notes = [
        "TTFT: one prompt alone. TPOT@1: one request decoding. TPOT@batch: the largest batch the KV cache holds "
        "(capped by max seqs). out tok/s/GPU: steady state at that batch, prefills included.",
        *(f"{r['gpu']} {r['layout']}: does not fit — {r['note']}" for r in misfits),
        *(f"{r['gpu']} price ${r['price_usd_per_gpu_hour']:.2f}/GPU-h as of {r['price_date']}" for r in rows),
    ]
    payload = {
        "model": model.name,
        "engine": engine,
        "dtype": dtype,
        "input_len": input_len,
        "output_len": output_len,
        "estimator": kernel_estimator.name,
        "estimator_label": kernel_estimator.label,
        "options": rows,
    }
    emit(rows, PLAN_COLUMNS, output_format, title=title, notes=notes, json_payload=payload)
    if misfits and len(misfits) == len(rows):
        raise SystemExit(2)


COMMANDS = [plan_command]
