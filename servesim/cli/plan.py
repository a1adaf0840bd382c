"""``servesim plan``: the highest load each GPU and layout serves within the SLOs, replicas, cost, and a
recommendation; ``--quick`` for the analytical per-GPU estimate without simulating traffic."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from servesim.cli.output import Column, emit, estimator_option, output_format_options
from servesim.cli.params import (
    DIMENSION,
    POSITIVE_FINITE,
    REQUEST_COUNT,
    SEED,
    OutputFolder,
    cap_lengths_fix,
    engine_behaviour_options,
    max_cudagraph_capture_size_option,
    moe_backend_option,
    mxfp4_moe_backend_option,
    plan_degree,
    scheduler_recv_interval_option,
    stream_interval_option,
    engine_option,
    workload_flags,
)
from servesim.errors import ServesimError, not_utf8
from servesim.kernels.expand import KV_CACHE_DTYPES, WEIGHT_DTYPES

QUICK_COLUMNS = (
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


def _priced_gpus(gpu_list: str, prices_file: str | None, price_overrides: tuple[str, ...]):
    from datetime import date

    from servesim.hardware import apply_prices, load_prices, parse_gpu_list

    gpus = parse_gpu_list(gpu_list)
    if prices_file:
        try:
            prices = load_prices(prices_file)
        except UnicodeDecodeError:
            raise ServesimError(not_utf8(prices_file)) from None
        gpus = apply_prices(gpus, prices, f"user price file {prices_file}")
    overrides = _parse_price_overrides(price_overrides)
    return apply_prices(gpus, {k: (v, str(date.today())) for k, v in overrides.items()}, "--price on the command line")


def _quick_row(est, dtype: str) -> dict:
    from servesim.models.memory import GIB
    from servesim.planner.search import shortfall

    memory = est.memory
    return {
        "gpu": est.gpu.name,
        "layout": str(est.par),
        "num_gpus": est.par.num_gpus,
        "engine": est.engine.engine,
        "fits": est.fits,
        "weights_gib_per_gpu": memory.weight_bytes / GIB,
        "kv_cache_gib_per_gpu": max(memory.kv_cache_bytes, 0.0) / GIB,
        "kv_tokens": est.kv_tokens,
        "max_concurrent_seqs": est.max_sequences,
        "ttft_ms": est.ttft_ms,
        "tpot_batch1_ms": est.tpot_batch1_ms,
        "loaded_batch": est.loaded_batch,
        "tpot_loaded_ms": est.tpot_loaded_ms,
        "output_tokens_per_s_per_gpu": est.output_tokens_per_s_per_gpu,
        "usd_per_hour": est.usd_per_hour,
        "usd_per_million_output_tokens": est.usd_per_million_output_tokens,
        "price_usd_per_gpu_hour": est.gpu.price_usd_per_gpu_hour,
        "price_date": est.gpu.price_date,
        "note": None if est.fits else shortfall(est, dtype),
    }


def _unsupported_notes(unsupported: list[dict]) -> list[str]:
    """One note per GPU and reason, naming its layouts the engine cannot run: a GPU without a format fails every
    layout for the same reason."""
    layouts: dict[tuple[str, str], list[str]] = {}
    for u in unsupported:
        layouts.setdefault((u["gpu"], u["reason"]), []).append(u["layout"])
    return [f"{gpu} {', '.join(names)} (unsupported): {reason}" for (gpu, reason), names in layouts.items()]


def _quick(request, kernel_estimator, input_len: int, output_len: int, output_format: str) -> None:
    """The analytical estimate per GPU and layout (no traffic simulated)."""
    from servesim.estimator.coverage import coverage_notes, estimator_coverage, launched_by
    from servesim.planner.estimate import estimate_gpu
    from servesim.models.config import check_context
    from servesim.planner.plan import plan_options, unsupported_options

    model, dtype = request.model, request.dtype
    check_context(model, input_len + output_len, fix="lower --input-len/--output-len")
    rows = [
        _quick_row(estimate_gpu(request.deployment(gpu, par), kernel_estimator, input_len, output_len), dtype)
        for gpu, par in plan_options(request)
    ]
    unsupported = [{"gpu": gpu.name, "layout": str(par), "reason": why}
                   for gpu, par, why in unsupported_options(request)]
    misfits = [r for r in rows if not r["fits"]]
    if len(misfits) == len(rows) and output_format == "table":
        reasons = "; ".join(f"{r['gpu']} {r['layout']}: {r['note']}" for r in misfits)
        raise ServesimError(f"{model.name} ({dtype}) does not fit: {reasons}")
    coverages = estimator_coverage(kernel_estimator, request.gpus, dtype, launched_by(request.engine_name, model, dtype))
    title = (
        f"{model.name} ({dtype}) with {request.engine}, {input_len} prompt + {output_len} output tokens per request "
        f"(quick estimate, no traffic simulated)\nestimator: {kernel_estimator.label}"
    )
    notes = [
        "TTFT: one prompt alone. TPOT@1: one request decoding. TPOT@batch: the largest batch the KV cache holds "
        "(capped by max seqs). out tok/s/GPU: steady state at that batch, prefills included.",
        *(f"{r['gpu']} {r['layout']}: does not fit — {r['note']}" for r in misfits),
        *_unsupported_notes(unsupported),
        *dict.fromkeys(f"{r['gpu']} price ${r['price_usd_per_gpu_hour']:.2f}/GPU-h as of {r['price_date']}"
                       for r in rows),
        *coverage_notes(coverages),
    ]
    payload = {
        "model": model.name, "engine": request.engine, "dtype": dtype, "input_len": input_len,
        "output_len": output_len, "estimator": kernel_estimator.name, "estimator_label": kernel_estimator.label,
        "estimator_coverage": [c.to_json() for c in coverages], "options": rows,
        "unsupported": unsupported,
    }
    emit(rows, QUICK_COLUMNS, output_format, title=title, notes=notes, json_payload=payload)
    if misfits and len(misfits) == len(rows):
        raise SystemExit(2)


def _plan_columns(request) -> tuple[Column, ...]:
    from servesim.planner.slo import METRIC_LABELS

    load = (Column("capacity_qps", "req/s/replica", ",.2f") if request.mode == "qps"
            else Column("capacity_concurrency", "clients/replica", ","))
    slo_columns = tuple(Column(f"slo_{s.name}_ms", f"{METRIC_LABELS[s.metric]} p{s.percentile:g} ms", ",.1f")
                        for s in request.slos)
    return (
        Column("rank", "rank"),
        Column("gpu", "GPU", align="<"),
        Column("layout", "layout", align="<"),
        load,
        *slo_columns,
        Column("binding", "binds", align="<"),
        Column("replicas", "replicas", ","),
        Column("total_gpus", "GPUs", ","),
        Column("usd_per_hour", "$/h", ",.2f"),
        Column("usd_per_million_output_tokens", "$/1M out tok", ",.3f"),
        Column("output_tokens_per_s_per_gpu", "out tok/s/GPU", ",.0f"),
        Column("status", "status", align="<"),
    )


def _table_row(option: dict, request) -> dict:
    values = option["slo_values_ms"] or {}
    return {**option, **{f"slo_{s.name}_ms": values.get(s.name) for s in request.slos}}


def _header(request, slos_default: bool, estimator_label: str, executor_text: str) -> str:
    from servesim.planner.plan import slo_list
    from servesim.planner.search import BRACKET_FACTOR

    workload = request.workload
    variable = "arrival rate" if request.mode == "qps" else "closed-loop clients"
    unit = "req/s" if request.mode == "qps" else "clients"
    target = f"target {request.target:g} {unit}" if request.target is not None else "no target load (1 replica each)"
    budget = f", budget {request.gpu_budget} GPUs" if request.gpu_budget is not None else ""
    return (
        f"{request.model.name} ({request.dtype}{', fp8 KV cache' if request.kv_cache_dtype == 'fp8' else ''}) with "
        f"{request.release.label}: capacity per replica within "
        f"{slo_list(request.slos)}{' (default SLOs)' if slos_default else ''}\n"
        f"workload {workload.name}: {len(workload):,} requests (mean {workload.prompt_tokens.mean():,.0f} prompt + "
        f"{workload.output_tokens.mean():,.0f} output tokens), {workload.arrival_process} arrivals, seed "
        f"{workload.seed}; {target}{budget}\n"
        f"search: {variable}, ×{BRACKET_FACTOR:g} bracketing below the quick estimate, then splits to "
        f"{request.tolerance:.0%}; {executor_text}; estimator: {estimator_label}"
    )


def _progress(total: int, enabled: bool):
    """A stderr progress bar (a no-op context when stderr is not a terminal)."""
    import contextlib

    if not enabled:
        return contextlib.nullcontext(None)
    return click.progressbar(length=total, label="searching options", file=sys.stderr, show_pos=True)


SLO_FLAGS = tuple((metric, p) for metric in ("ttft", "tpot", "e2e") for p in (50, 90, 99))


def _slo_options(func):
    for metric, p in reversed(SLO_FLAGS):
        func = click.option(f"--{metric}-p{p}", f"{metric}_p{p}", type=POSITIVE_FINITE,
                            default=None, metavar="MS", help=f"SLO: {metric.upper()} p{p} at most MS milliseconds.")(func)
    return func


#: Options of the simulated search that the analytical ``--quick`` estimate has no use for.
SIMULATION_ONLY = ("source", "num_requests", "columns", "arrival", "seed", "qps", "concurrency", "tolerance",
                   "gpu_budget", "executor", "address", "jobs", "plot_dir", "stream_interval",
                   *(f"{metric}_p{p}" for metric, p in SLO_FLAGS))


def _given_on_command_line(names: tuple[str, ...]) -> list[str]:
    """The flags, among the current command's parameters ``names``, that the user typed."""
    ctx = click.get_current_context()
    flags = {param.name: param.opts[0] for param in ctx.command.params}
    return [flags[name] for name in names
            if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE]


@click.command("plan")
@click.option("--model", "model_ref", required=True, help="Preset name (see 'servesim models'), a path to a config.json, or a Hugging Face hub id.")
@click.option("--gpus", "gpu_list", default="H100", show_default=True, help="Comma-separated GPU names or aliases (see 'servesim gpus'), or 'all'.")
@click.option("--tp", type=DIMENSION, default=None, help="Tensor-parallel GPUs per stage [default: every divisor of the GPUs in a node, TP×PP within a node].")
@click.option("--pp", type=DIMENSION, default=None, help="Pipeline stages [default: every divisor of the GPUs in a node, TP×PP within a node].")
@click.option("--ep", default="1", show_default=True, callback=plan_degree, metavar="N|search", help="Expert parallelism of MoE models: split the experts over N of each layout's TP GPUs (layouts whose TP N divides), or 'search': each layout without and with its experts over all its TP GPUs.")
@click.option("--dp", default="1", show_default=True, callback=plan_degree, metavar="N|search", help="Attention data parallelism of MoE models: N ranks in each layout whose TP N divides, or 'search': each MoE layout without and with as many ranks as TP GPUs (vLLM --data-parallel-size, SGLang --dp-size --enable-dp-attention).")
@engine_option
@click.option("--dtype", type=click.Choice(WEIGHT_DTYPES), default="bf16", show_default=True, help="Weights: bf16, fp16, fp8 (W8A8, per-tensor scales), fp8-block (W8A8, 128x128 blocks), mxfp4 (MXFP4 experts, gpt-oss), int4 (INT4 experts, Kimi-K2.5) or nvfp4 (NVIDIA's NVFP4 releases, Blackwell: docs/models.md).")
@estimator_option
@click.option("--max-num-seqs", type=DIMENSION, help="Cap on running requests (vLLM max_num_seqs, SGLang max_running_requests); engine default if unset.")
@click.option("--max-num-batched-tokens", type=DIMENSION, help="Token budget per step / prefill chunk size; engine default if unset.")
@click.option("--memory-fraction", type=click.FloatRange(0, 1, min_open=True), help="vLLM gpu_memory_utilization or SGLang mem_fraction_static; engine default if unset.")
@click.option("--kv-cache-dtype", type=click.Choice(KV_CACHE_DTYPES), default="auto", show_default=True, help="KV cache storage: auto (the activation dtype) or fp8 (half the bytes per token).")
@mxfp4_moe_backend_option
@moe_backend_option
@scheduler_recv_interval_option
@max_cudagraph_capture_size_option
@stream_interval_option
@engine_behaviour_options
@click.option("--workload", "source", default="splitwise-conv", show_default=True, help="Profile (arxiv, splitwise-conv, splitwise-code, chat-shared-prefix), length spec (fixed:1024:128), prompt generator (shared-prefix:8,16:2048:128:256, repeat:100:1024:128, multi-turn:32,5:256:256, random:1024:128:0.5:256, prefix-repetition:256:256:10:128) or trace file (docs/workloads.md).")
@click.option("-n", "--num-requests", type=REQUEST_COUNT, default=None, help="Requests simulated per load [default: 1000; a trace: all its rows].")
@click.option("--columns", default=None, metavar="prompt=COL,output=COL[,arrival=COL]",
              help="Column names of a CSV/JSONL trace in a format servesim does not recognise (also prompt_id=COL "
                   "or hash_ids=COL for which prompts share text).")
@click.option("--arrival", type=click.Choice(("poisson", "trace")), default=None, help="Arrival process whose rate is searched: poisson, or the profile's or trace's own gaps rescaled [default: poisson].")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the workload (the same requests at every load).")
@click.option("--qps", type=POSITIVE_FINITE, default=None, help="Target load in requests/s: replicas = ceil(target / capacity).")
@click.option("--concurrency", type=click.IntRange(min=1), default=None, help="Closed loop: search the number of clients per replica, and serve this many in total.")
@_slo_options
@click.option("--tolerance", type=click.FloatRange(0, 1, min_open=True), default=0.05, show_default=True, help="Stop when the capacity is bracketed within this fraction of the load.")
@click.option("--gpu-budget", type=click.IntRange(min=1), default=None, help="At most this many GPUs in total; options needing more are reported as over budget.")
@click.option("--prices", "prices_file", type=click.Path(dir_okay=False), help="CSV of gpu,usd_per_gpu_hour[,date] overriding catalogue prices.")
@click.option("--price", "price_overrides", multiple=True, metavar="GPU=USD", help="Override one GPU's price per GPU-hour; repeatable.")
@click.option("--executor", type=click.Choice(("local", "ray")), default="local", show_default=True, help="Where options are searched: local processes or a Ray cluster (pip install 'servesim[ray]').")
@click.option("--address", default=None, help="Ray cluster address (host:port or 'auto'); without it a Ray instance starts here.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, help="Parallel searches [default: the CPU count].")
@click.option("--plot", "plot_dir", type=OutputFolder(), default=None, help="Write PNGs here: latency vs load per option and the cost-vs-TPOT Pareto front (needs matplotlib).")
@click.option("--quick", is_flag=True, help="Only the analytical per-GPU estimate: no traffic simulated, no SLOs.")
@click.option("--input-len", type=DIMENSION, default=None, help="With --quick: prompt tokens per request [default: 1024].")
@click.option("--output-len", type=DIMENSION, default=None, help="With --quick: output tokens per request [default: 256].")
@output_format_options
def plan_command(model_ref, gpu_list, tp, pp, ep, dp, engine, dtype, estimator, max_num_seqs, max_num_batched_tokens,
                 memory_fraction, kv_cache_dtype, mxfp4_moe_backend, moe_backend, scheduler_recv_interval,
                 max_cudagraph_capture_size, stream_interval, prefix_caching, async_scheduling, source, num_requests,
                 columns, arrival, seed, qps, concurrency, tolerance, gpu_budget, prices_file, price_overrides, executor,
                 address, jobs, plot_dir, quick, input_len, output_len, output_format, **slo_limits) -> None:
    """Find, per GPU and TP/PP layout, the highest load that meets the latency SLOs; then the replicas for the
    target load, GPUs, $/h and $ per 1M output tokens, ranked by cost, with a recommendation.

    \b
    servesim plan --model llama3-70b --tp 4 --gpus H100,H20
    servesim plan --model llama3-70b --tp 4 --gpus H100,H200 --qps 20 --ttft-p90 2000 --tpot-p99 100
    servesim plan --model llama3-8b --gpus all --concurrency 256 --gpu-budget 16 --json  (every GPU: about 4 min on 2 cores)
    servesim plan --model llama3-70b --tp 4 --gpus H100,H20 --quick
    """
    from servesim.estimator import get_estimator
    from servesim.models import get_model
    from servesim.models.config import check_context
    from servesim.planner.plan import PlanRequest
    from servesim.planner.slo import slos_from_limits

    if qps is not None and concurrency is not None:
        raise ServesimError("give a target as --qps (open loop, the rate is searched) or --concurrency (closed loop, "
                            "the clients are searched), not both")
    ignored = _given_on_command_line(SIMULATION_ONLY) if quick else []
    if ignored:
        raise ServesimError(f"--quick estimates without traffic, so {', '.join(ignored)} would be ignored; drop "
                            f"{'it' if len(ignored) == 1 else 'them'} or drop --quick")
    if not quick and (input_len is not None or output_len is not None):
        raise ServesimError("--input-len/--output-len go with --quick; to simulate fixed lengths use --workload "
                            "fixed:PROMPT:OUTPUT")
    limits = {(metric, p): slo_limits[f"{metric}_p{p}"] for metric, p in SLO_FLAGS}
    slos = slos_from_limits(limits)
    mode = "concurrency" if concurrency is not None else "qps"
    model = get_model(model_ref)
    kernel_estimator = get_estimator(estimator)
    request = PlanRequest(
        model=model,
        gpus=tuple(_priced_gpus(gpu_list, prices_file, price_overrides)),
        engine=engine,
        workload=_base_workload(source, num_requests, arrival, seed, mode, columns) if not quick else None,
        slos=slos,
        tp=tp,
        pp=pp,
        ep=ep,
        dp=dp,
        dtype=dtype,
        estimator=estimator,
        engine_overrides=(("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens),
                          ("memory_fraction", memory_fraction), ("kv_cache_dtype", kv_cache_dtype),
                          ("enable_prefix_caching", prefix_caching), ("async_scheduling", async_scheduling),
                          ("mxfp4_moe_backend", mxfp4_moe_backend), ("moe_backend", moe_backend),
                          ("scheduler_recv_interval", scheduler_recv_interval),
                          ("max_cudagraph_capture_size", max_cudagraph_capture_size),
                          ("stream_interval", stream_interval)),
        mode=mode,
        target=qps if mode == "qps" else concurrency,
        tolerance=tolerance,
        gpu_budget=gpu_budget,
    )
    if quick:
        _quick(request, kernel_estimator, input_len or 1024, output_len or 256, output_format)
        return
    flags = workload_flags(num_requests, *((1.0, None, arrival) if mode == "qps" else (None, 1, None)), seed=seed,
                           columns=columns)
    check_context(model, request.workload.prompt_tokens + request.workload.output_tokens,
                  fix=cap_lengths_fix(source, flags, model.max_position_embeddings,
                                      int(request.workload.output_tokens.max())))
    _slo_plan(request, kernel_estimator, all(v is None for v in limits.values()), executor, address, jobs,
              plot_dir, output_format)


def _base_workload(source: str, num_requests: int | None, arrival: str | None, seed: int, mode: str,
                   columns: str | None = None):
    """The search's workload: arrivals at 1 request/s (divided by the rate at each load), or one client."""
    from servesim.workloads import build_workload, parse_columns

    mapping = parse_columns(columns) if columns else None

    if mode == "concurrency":
        if arrival is not None:
            raise ServesimError("--arrival sets how an open loop's requests arrive; a closed loop (--concurrency) "
                                "sends each request when a client is free, so drop --arrival")
        return build_workload(source, num_requests, concurrency=1, seed=seed, columns=mapping)
    return build_workload(source, num_requests, qps=1.0, seed=seed, arrival=arrival or "poisson", columns=mapping)


def _slo_plan(request, kernel_estimator, slos_default: bool, executor_name: str, address: str | None,
              jobs: int | None, plot_dir: Path | None, output_format: str) -> None:
    from servesim.estimator.coverage import coverage_notes, estimator_coverage, launched_by
    from servesim.planner.executor import make_executor
    from servesim.planner.plan import option_tasks, plan_payload, run_plan

    if plot_dir is not None:
        from servesim.planner.plots import require_matplotlib

        require_matplotlib()
    tasks = option_tasks(request)
    executor = make_executor(executor_name, jobs, address)
    executor_text = (f"{len(tasks)} options on {executor.name}"
                     + (f" ({executor.jobs} processes)" if executor.name == "local" else ""))
    show_progress = output_format == "table" and sys.stderr.isatty()
    try:
        with _progress(len(tasks), show_progress) as bar:
            plan = run_plan(request, executor, on_done=bar.update if bar is not None else None,
                            tasks=tasks)
    finally:
        executor.close()
    coverages = estimator_coverage(kernel_estimator, request.gpus, request.dtype,
                                   launched_by(request.engine_name, request.model, request.dtype))
    payload = plan_payload(plan, kernel_estimator.label, coverages)
    if plot_dir is not None:
        from servesim.planner.plots import write_plots

        written = write_plots(plan, plot_dir)
    if plan.infeasible and output_format == "table":
        raise ServesimError(plan.infeasible)
    rows = [_table_row(o, request) for o in payload["options"]]
    notes = []
    if plan.explanation:
        notes.append(f"Recommendation: {plan.explanation}")
        notes.append(f"Launch: {payload['recommendation']['launch_command']}")
    notes += [f"{o['gpu']} {o['layout']} ({o['status']}): {o['note']}" for o in payload["options"]
              if o["note"] and o["status"] != "unsupported"]
    notes += _unsupported_notes([{"gpu": o["gpu"], "layout": o["layout"], "reason": o["note"]}
                                 for o in payload["options"] if o["status"] == "unsupported"])
    notes += [f"{o['gpu']} {o['layout']}: {o['sample_warning']}" for o in payload["options"] if o["sample_warning"]]
    if request.gpu_budget is not None:
        notes += [f"{o['gpu']} {o['layout']}: needs {o['total_gpus']} GPUs, over the budget of {request.gpu_budget}"
                  for o in payload["options"] if o["status"] == "over_budget"]
    notes.append("SLO columns: percentiles at the capacity load. binds: what fails first just above it. Replicas "
                 "assume the load splits evenly over identical replicas.")
    notes += list(dict.fromkeys(f"{g.name} price ${g.price_usd_per_gpu_hour:.2f}/GPU-h as of {g.price_date}"
                                for g in request.gpus))
    notes += coverage_notes(coverages)
    if plot_dir is not None:
        notes.append(f"plots: {len(written)} PNG files in {plot_dir}")
    emit(rows, _plan_columns(request), output_format,
         title=_header(request, slos_default, kernel_estimator.label, executor_text), notes=notes,
         json_payload=payload)
    if plan.infeasible:
        raise SystemExit(2)


COMMANDS = [plan_command]
