"""``servesim simulate`` (serve a workload, benchmark-style metrics) and ``servesim latency`` (one fixed batch,
like ``vllm bench latency``)."""

from __future__ import annotations

import contextlib
import math
import sys

import click

from servesim.cli.output import Column, emit, estimator_option, output_format_options
from servesim.cli.params import (
    DIMENSION,
    POSITIVE_FINITE,
    REPLICA_COUNT,
    REQUEST_COUNT,
    SEED,
    OutputFile,
    cap_lengths_fix,
    engine_behaviour_options,
    dp_option,
    ep_option,
    max_cudagraph_capture_size_option,
    moe_backend_option,
    mxfp4_moe_backend_option,
    scheduler_recv_interval_option,
    stream_interval_option,
    engine_option,
    workload_flags,
)
from servesim.errors import ServesimError
from servesim.kernels.expand import KV_CACHE_DTYPES

LATENCY_COLUMNS = (
    Column("metric", "metric", align="<"),
    Column("mean", "mean", ",.2f"),
    Column("p50", "p50", ",.2f"),
    Column("p90", "p90", ",.2f"),
    Column("p99", "p99", ",.2f"),
)
METRICS = (("queue", "queue (ms)"), ("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"),
           ("tpot_incl", "TPOT incl. 1st token (ms)"), ("itl", "ITL (ms)"), ("e2e", "E2E (ms)"))


def _engine_options(func):
    for option in reversed((
        click.option("--model", "model_ref", required=True, help="Preset name, config.json path or Hugging Face id."),
        click.option("--gpu", "gpu_name", default="H100", show_default=True, help="GPU from 'servesim gpus'."),
        click.option("--tp", default=1, show_default=True, type=DIMENSION, help="Tensor-parallel size."),
        click.option("--pp", default=1, show_default=True, type=DIMENSION, help="Pipeline stages."),
        ep_option,
        dp_option,
        engine_option,
        click.option("--dtype", default="bf16", show_default=True, help="Weights: bf16, fp16, fp8, fp8-block, mxfp4, int4 or nvfp4 (see servesim plan --help)."),
        estimator_option,
        click.option("--max-num-seqs", type=DIMENSION, default=None,
                     help="vLLM max_num_seqs / SGLang max_running_requests [default: the engine's]."),
        click.option("--max-num-batched-tokens", type=DIMENSION, default=None,
                     help="vLLM token budget per step / SGLang chunked_prefill_size [default: the engine's]."),
        click.option("--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True), default=None,
                     help="vLLM gpu_memory_utilization / SGLang mem_fraction_static [default: the engine's]."),
        click.option("--kv-cache-dtype", type=click.Choice(KV_CACHE_DTYPES), default="auto", show_default=True,
                     help="KV cache storage: auto (the activation dtype) or fp8 (half the bytes per token)."),
        mxfp4_moe_backend_option,
        moe_backend_option,
        scheduler_recv_interval_option,
        max_cudagraph_capture_size_option,
        engine_behaviour_options,
    )):
        func = option(func)
    return func


def _setup(model_ref, gpu_name, tp, pp, ep, dp, engine, dtype, estimator, max_num_seqs, max_num_batched_tokens,
           gpu_memory_utilization, kv_cache_dtype, prefix_caching, async_scheduling, mxfp4_moe_backend,
           moe_backend, scheduler_recv_interval, max_cudagraph_capture_size, stream_interval=None):
    """The deployment the options describe and its step-time model."""
    from servesim.hardware import get_gpu
    from servesim.models import get_model
    from servesim.models.parallel import Parallelism, check_layout
    from servesim.serving.deployment import build_deployment
    from servesim.serving.step_time import StepTimeModel

    model, gpu = get_model(model_ref), get_gpu(gpu_name)
    check_layout(model, gpu, Parallelism(tp, pp, ep, dp))
    deployment = build_deployment(
        model, gpu, Parallelism(tp, pp, ep, dp), engine, dtype, estimator,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        memory_fraction=gpu_memory_utilization, kv_cache_dtype=kv_cache_dtype,
        enable_prefix_caching=prefix_caching, async_scheduling=async_scheduling,
        mxfp4_moe_backend=mxfp4_moe_backend, moe_backend=moe_backend, scheduler_recv_interval=scheduler_recv_interval,
        max_cudagraph_capture_size=max_cudagraph_capture_size, stream_interval=stream_interval)
    return deployment, StepTimeModel(deployment)


def parse_slos(text: str) -> dict[str, float]:
    """``ttft_ms=500,tpot_ms=50`` -> {"ttft_ms": 500.0, "tpot_ms": 50.0}."""
    slos = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        try:
            limit_ms = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ServesimError(f"cannot read SLO {item!r}; write KEY=MS pairs such as ttft_ms=500,tpot_ms=50")
        if not (limit_ms > 0 and math.isfinite(limit_ms)):
            raise ServesimError(f"SLO {item!r} must be a positive number of milliseconds")
        if key in slos:
            raise ServesimError(f"SLO {key} is given twice; give each limit once")
        slos[key] = limit_ms
    return slos


def _latency_rows(summary: dict) -> list[dict]:
    return [{"metric": label, **{k: summary[f"{stem}_{k}_ms"] for k in ("mean", "p50", "p90", "p99")}}
            for stem, label in METRICS]


#: Workloads of at least this many requests show a progress bar while they are simulated (on a terminal).
PROGRESS_MIN_REQUESTS = 10_000


@contextlib.contextmanager
def _progress(requests: int):
    """A callback for ``simulate(progress=...)``: a bar on stderr when it is a terminal and the run is long, else
    None."""
    if requests < PROGRESS_MIN_REQUESTS or not sys.stderr.isatty():
        yield None
        return
    with click.progressbar(length=requests, label="simulating", file=sys.stderr, show_pos=True) as bar:
        yield lambda finished: bar.update(finished - bar.pos)


def _overload(result, workload) -> dict:
    """``completion_ratio``: open loop, requests completed over requests arrived in the second half of the arrival
    window (None in a closed loop, which never runs ahead of the server); ``overloaded``: that ratio is under
    :data:`servesim.planner.search.SUSTAIN_FRACTION`, so the queue grows and latencies grow with the run's
    length."""
    from servesim.planner.search import SUSTAIN_FRACTION, completion_ratio

    if workload.arrival_mode != "open":
        return {"completion_ratio": None, "overloaded": False}
    ratio = completion_ratio(result)
    return {"completion_ratio": ratio, "overloaded": ratio < SUSTAIN_FRACTION}


@click.command("simulate")
@_engine_options
@stream_interval_option
@click.option("--workload", "source", default="splitwise-conv", show_default=True,
              help="Profile (arxiv, splitwise-conv, splitwise-code, chat-shared-prefix), length spec "
                   "(fixed:1024:128), prompt generator (shared-prefix:8,16:2048:128:256, repeat:100:1024:128, "
                   "multi-turn:32,5:256:256, random:1024:128:0.5:256, prefix-repetition:256:256:10:128) or trace "
                   "file (docs/workloads.md).")
@click.option("-n", "--num-requests", type=REQUEST_COUNT, default=None,
              help="Requests [default: 1000; a trace: all its rows].")
@click.option("--columns", default=None, metavar="prompt=COL,output=COL[,arrival=COL]",
              help="Column names of a CSV/JSONL trace in a format servesim does not recognise (also prompt_id=COL "
                   "or hash_ids=COL for which prompts share text).")
@click.option("--qps", type=float, default=None, help="Arrival rate, requests per second.")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="Closed loop: at most N requests in flight (vllm bench serve --max-concurrency).")
@click.option("--arrival", type=click.Choice(("poisson", "gamma", "burst", "trace")), default=None,
              help="Arrival process (see 'servesim workload --help').")
@click.option("--cv", type=POSITIVE_FINITE, default=1.0, show_default=True,
              help="Gap coefficient of variation of gamma arrivals (--arrival gamma; above 1 burstier than Poisson).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the workload and the random router.")
@click.option("--replicas", type=REPLICA_COUNT, default=1, show_default=True, help="Engine instances.")
@click.option("--router", type=click.Choice(("round_robin", "least_outstanding", "random")), default="round_robin",
              show_default=True, help="How requests are spread over replicas.")
@click.option("--goodput", "goodput_text", default=None, metavar="ttft_ms=MS,tpot_ms=MS,e2e_ms=MS",
              help="SLOs for goodput (requests/s meeting all of them).")
@click.option("--requests-csv", type=OutputFile(), default=None,
              help="Write per-request metrics to this CSV.")
@click.option("--trace", "trace_path", type=OutputFile(), default=None,
              help="Write a Chrome trace of the steps (open in chrome://tracing or Perfetto).")
@output_format_options
def simulate_command(model_ref, gpu_name, tp, pp, ep, dp, engine, dtype, estimator, max_num_seqs,
                     max_num_batched_tokens, gpu_memory_utilization, kv_cache_dtype, mxfp4_moe_backend, moe_backend,
                     scheduler_recv_interval, max_cudagraph_capture_size, prefix_caching, async_scheduling,
                     stream_interval, source, num_requests, columns, qps, concurrency, arrival, cv, seed, replicas,
                     router, goodput_text, requests_csv, trace_path, output_format) -> None:
    """Simulate serving a workload: TTFT, TPOT, ITL and E2E percentiles, throughput and goodput.

    \b
    servesim simulate --model llama3-8b --gpu H100 --workload splitwise-conv --qps 4 -n 2000
    servesim simulate --model llama3-70b --tp 4 --engine sglang --workload fixed:1024:256 --concurrency 16
    """
    from servesim.estimator.coverage import coverage_notes, estimator_coverage, launched_by
    from servesim.models.config import check_context
    from servesim.planner.step_store import kept_step_times
    from servesim.serving.simulator import simulate
    from servesim.workloads import build_workload, parse_columns

    mapping = parse_columns(columns) if columns else None
    deployment, step_model = _setup(model_ref, gpu_name, tp, pp, ep, dp, engine, dtype, estimator, max_num_seqs,
                                    max_num_batched_tokens, gpu_memory_utilization, kv_cache_dtype, prefix_caching,
                                    async_scheduling, mxfp4_moe_backend, moe_backend, scheduler_recv_interval,
                                    max_cudagraph_capture_size, stream_interval)
    model, gpu, par, cfg = deployment.model, deployment.gpu, deployment.par, deployment.settings
    slos = parse_slos(goodput_text) if goodput_text else None
    workload = build_workload(source, num_requests, qps=qps, concurrency=concurrency, seed=seed, arrival=arrival,
                              cv=cv, columns=mapping)
    check_context(model, workload.prompt_tokens + workload.output_tokens,
                  fix=cap_lengths_fix(source, workload_flags(num_requests, qps, concurrency, arrival, cv, seed, columns),
                                      model.max_position_embeddings, int(workload.output_tokens.max())))
    # from the step times earlier runs of this deployment kept (servesim/planner/step_store.py)
    with kept_step_times(step_model), _progress(len(workload)) as progress:
        result = simulate(deployment, workload, step_model=step_model, replicas=replicas, router=router, seed=seed,
                          progress=progress)
    summary = result.summary()
    summary.update(_overload(result, workload))
    if slos:
        summary["goodput_req_per_s"] = result.goodput(slos)
    if requests_csv is not None:
        result.requests.to_csv(requests_csv, index=False, float_format="%.4f")
    if trace_path is not None:
        from servesim.serving.trace import write_chrome_trace

        write_chrome_trace(result, trace_path)
    kv = ", fp8 KV cache" if cfg.kv_cache_dtype == "fp8" else ""
    title = (f"{model.name} on {replicas} x {par} {gpu.name}, {cfg.engine} {cfg.version}{kv}, {workload.name}: "
             f"{len(workload)} requests, {workload.arrival_mode} arrivals"
             + (f" (concurrency {workload.concurrency})" if workload.concurrency else ""))
    notes = [
        f"duration {summary['duration_s']:,.1f} s; {summary['request_throughput_per_s']:,.2f} req/s, "
        f"{summary['output_throughput_tok_per_s']:,.0f} output tok/s, {summary['total_throughput_tok_per_s']:,.0f} "
        f"total tok/s",
        f"{summary['steps']:,} steps, mean batch {summary['mean_batch_size']:,.1f} requests, KV occupancy mean "
        f"{summary['mean_kv_occupancy']:.1%} peak {summary['peak_kv_occupancy']:.1%}, {summary['preemptions']} "
        f"preemptions",
    ]
    if summary["overloaded"]:
        notes.append(f"the server falls behind: requests completed at {summary['completion_ratio']:.0%} of the "
                     f"arrival rate in the second half; latencies are those of a growing queue; lower --qps or add "
                     f"--replicas")
    if slos:
        notes.append(f"goodput {summary['goodput_req_per_s']:,.2f} req/s meeting {goodput_text}")
    if summary.get("prefix_cache_hit_ratio") is not None:
        notes.append(f"prefix cache: {summary['prefix_cache_hit_ratio']:.1%} of prompt tokens served from cache")
    coverages = estimator_coverage(step_model.estimator, [gpu], dtype, launched_by(cfg.engine, model, dtype))
    notes += coverage_notes(coverages)
    notes.append(f"launch: {deployment.launch_command()}")
    emit(_latency_rows(summary), LATENCY_COLUMNS, output_format, title=title, notes=notes,
         json_payload={"config": {**result.info, "launch_command": deployment.launch_command()},
                       "estimator_coverage": [c.to_json() for c in coverages], "summary": summary})


@click.command("latency")
@_engine_options
@click.option("--batch-size", type=REQUEST_COUNT, default=8, show_default=True)
@click.option("--input-len", type=DIMENSION, default=32, show_default=True)
@click.option("--output-len", type=DIMENSION, default=128, show_default=True)
@output_format_options
def latency_command(model_ref, gpu_name, tp, pp, ep, dp, engine, dtype, estimator, max_num_seqs,
                    max_num_batched_tokens, gpu_memory_utilization, kv_cache_dtype, mxfp4_moe_backend, moe_backend,
                    scheduler_recv_interval, max_cudagraph_capture_size, prefix_caching, async_scheduling, batch_size,
                    input_len, output_len, output_format) -> None:
    """Latency of one batch of equal requests sent at once, like 'vllm bench latency'.

    \b
    servesim latency --model llama3-8b --gpu H100 --batch-size 8 --input-len 32 --output-len 128
    """
    from servesim.estimator.coverage import coverage_notes, estimator_coverage, launched_by
    from servesim.models.config import check_context
    from servesim.serving.simulator import simulate
    from servesim.serving.step_time import StepTimeModel
    from servesim.workloads import build_workload

    deployment, step_model = _setup(model_ref, gpu_name, tp, pp, ep, dp, engine, dtype, estimator, max_num_seqs,
                                    max_num_batched_tokens, gpu_memory_utilization, kv_cache_dtype, prefix_caching,
                                    async_scheduling, mxfp4_moe_backend, moe_backend, scheduler_recv_interval,
                                    max_cudagraph_capture_size)
    model, gpu, par, cfg = deployment.model, deployment.gpu, deployment.par, deployment.settings
    check_context(model, input_len + output_len, fix="lower --input-len/--output-len")
    workload = build_workload(f"fixed:{input_len}:{output_len}", batch_size, arrival="burst")
    # vllm bench latency drives the engine in-process: no API server, no HTTP.
    step_model = StepTimeModel(deployment, step_model.estimator, overhead=deployment.release.overhead.engine_only(),
                               shares_with=step_model)
    result = simulate(deployment, workload, step_model=step_model)
    summary = result.summary()
    row = {
        "latency_s": summary["duration_s"], "ttft_ms": summary["ttft_mean_ms"], "tpot_ms": summary["tpot_mean_ms"],
        "output_throughput_tok_per_s": summary["output_throughput_tok_per_s"], "steps": summary["steps"],
    }
    columns = (Column("latency_s", "latency (s)", ",.4f"), Column("ttft_ms", "TTFT (ms)", ",.2f"),
               Column("tpot_ms", "TPOT (ms)", ",.3f"), Column("output_throughput_tok_per_s", "output tok/s", ",.0f"),
               Column("steps", "steps", ",d"))
    title = (f"{model.name} on {par} {gpu.name}, {cfg.engine} {cfg.version}: batch {batch_size}, input {input_len}, "
             f"output {output_len}")
    coverages = estimator_coverage(step_model.estimator, [gpu], dtype, launched_by(cfg.engine, model, dtype))
    emit([row], columns, output_format, title=title, notes=coverage_notes(coverages),
         json_payload={"config": dict(result.info), "estimator_coverage": [c.to_json() for c in coverages], **row})


COMMANDS = [simulate_command, latency_command]
