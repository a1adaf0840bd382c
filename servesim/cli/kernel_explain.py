"""``servesim kernel gemm|scaled-mm|attention|rmsnorm|silu-mul|moe``: one kernel's SynPerf analysis on a GPU —
its tasks, occupancy, per-SM distribution, feature vector and per-pipe roofline with the bottleneck named — and the
time the kernel estimator (the MLP by default, as in every other command) predicts for it."""

from __future__ import annotations

from typing import Any

import click
import numpy as np

from servesim.cli.output import Column, emit, estimator_option, output_format_options, render_table
from servesim.cli.params import DIMENSION
from servesim.errors import ServesimError
from servesim.limits import MAX_TOKENS
from servesim.kernels.types import SCALED_MM_LIBRARIES, SCALED_MM_LIBRARY_NAMES

_SHOWN_TASKS = 8


def _int_list(text: str, option: str, example: str) -> tuple[int, ...]:
    """The comma-separated integers of ``option``; a one-line error naming an ``example`` otherwise."""
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ServesimError(f"{option} takes comma-separated integers, e.g. {example}; got {text!r}") from None


def _ints(text: str, option: str) -> tuple[int, ...]:
    values = _int_list(text, option, "512,2048")
    if not values or min(values) < 1 or max(values) > MAX_TOKENS:
        raise ServesimError(f"{option} values must be integers from 1 to {MAX_TOKENS:,}; got {text!r}")
    return values


def _expert_counts(text: str, experts: int, tokens: int, pairs: int) -> tuple[int, ...]:
    """``--expert-tokens``: one count per expert, each from 0 to ``tokens`` (a token picks an expert at most once),
    summing to the routed pairs."""
    counts = _int_list(text, "--expert-tokens", "3,0,5,2")
    if len(counts) != experts or sum(counts) != pairs:
        raise ServesimError(f"--expert-tokens needs {experts} counts summing to tokens x top-k = {pairs}")
    if min(counts) < 0 or max(counts) > tokens:
        raise ServesimError(f"--expert-tokens counts must be from 0 to the {tokens} tokens; got {text!r}")
    return counts


def analyse(kernel: Any, gpu_name: str, estimator: str) -> dict[str, Any]:
    """Everything the explain view shows, as plain data (also the ``--json`` payload)."""
    from servesim.decompose import decompose, occupancy
    from servesim.estimator import get_estimator
    from servesim.estimator.coverage import kernel_coverage
    from servesim.features import features_of, pipe_times_us
    from servesim.hardware import get_gpu
    from servesim.scheduler import schedule

    gpu = get_gpu(gpu_name)
    kernel_estimator = get_estimator(estimator)
    covered = kernel_coverage(kernel_estimator, kernel, gpu)
    feats = features_of(kernel, gpu)
    launches = []
    for launch in decompose(kernel, gpu):
        part = schedule(launch, gpu)
        occ = occupancy(launch.config, gpu)
        counts, busy = part.tasks_per_sm(), part.per_sm(launch.tasks.duration_cycles)
        shown = [dict(zip(launch.tasks.dim_names, map(int, row)), cycles=float(c))
                 for row, c in zip(launch.tasks.dims[:_SHOWN_TASKS], launch.tasks.duration_cycles[:_SHOWN_TASKS])]
        launches.append({
            "name": launch.name, "policy": launch.policy, "tasks": launch.tasks.size, "ctas": launch.grid_ctas,
            "threads_per_cta": launch.config.threads_per_cta, "registers_per_thread": launch.config.registers_per_thread,
            "smem_per_cta_bytes": launch.config.smem_per_cta_bytes, "ctas_per_sm": occ.ctas_per_sm,
            "occupancy_limiter": occ.limiter, "notes": list(launch.notes),
            "per_sm": {"tasks_min": int(counts.min()), "tasks_mean": float(counts.mean()), "tasks_max": int(counts.max()),
                       "cycles_min": float(busy.min()), "cycles_mean": float(busy.mean()), "cycles_max": float(busy.max())},
            "first_tasks": shown,
        })
    pipes = pipe_times_us(feats, gpu)
    return {
        "gpu": gpu.name, "kernel": kernel.category, "shape": kernel.shape(), "dtype": kernel.dtype,
        "launches": launches, "features": feats, "pipe_time_us": pipes,
        "bottleneck": max(pipes, key=pipes.get), "theoretical_time_us": feats["theoretical_time_us"],
        "estimator": estimator, "predicted_time_us": float(kernel_estimator.predict_us([kernel], gpu)[0]),
        "estimator_coverage": None if covered is None else covered.to_json(),
        "estimator_note": None if covered is None else covered.note(),
    }


def _print_explain(result: dict[str, Any]) -> None:
    click.echo(f"{result['kernel']} {result['shape']} {result['dtype']} on {result['gpu']}")
    for launch in result["launches"]:
        click.echo(f"\nlaunch: {launch['name']} ({launch['policy']}; {'; '.join(launch['notes'])})")
        click.echo(f"  tasks {launch['tasks']:,}  CTAs {launch['ctas']:,}  CTA {launch['threads_per_cta']} threads x "
                   f"{launch['registers_per_thread']} regs, {launch['smem_per_cta_bytes']:,} B smem -> "
                   f"{launch['ctas_per_sm']} CTA/SM (limited by {launch['occupancy_limiter']})")
        s = launch["per_sm"]
        click.echo(f"  per SM: tasks min/mean/max {s['tasks_min']}/{s['tasks_mean']:.2f}/{s['tasks_max']}, "
                   f"cycles {s['cycles_min']:,.0f}/{s['cycles_mean']:,.0f}/{s['cycles_max']:,.0f}")
        if launch["first_tasks"]:
            names = list(launch["first_tasks"][0])
            cols = [Column(n, n, ",.0f" if n == "cycles" else "") for n in names]
            click.echo(render_table(launch["first_tasks"], cols, title=f"  first {len(launch['first_tasks'])} tasks"))
    rows = [{"feature": k, "value": v} for k, v in result["features"].items()]
    click.echo("\n" + render_table(rows, [Column("feature", "feature", align="<"), Column("value", "value", ",.6g")]))
    pipes = [{"pipe": p, "time_us": t, "bound": "<- bottleneck" if p == result["bottleneck"] else ""}
             for p, t in result["pipe_time_us"].items()]
    click.echo("\n" + render_table(pipes, [Column("pipe", "pipe", align="<"), Column("time_us", "busiest-SM time (us)", ",.3f"),
                                          Column("bound", "", align="<")], title="per-pipe roofline"))
    click.echo(f"theoretical time {result['theoretical_time_us']:,.3f} us ({result['bottleneck']}-bound); "
               f"predicted {result['predicted_time_us']:,.3f} us ({result['estimator']} estimator)")
    if result["estimator_note"]:
        click.echo(result["estimator_note"])


def _run(kernel_factory, gpu: str, estimator: str, explain: bool, output_format: str) -> None:
    try:
        kernel = kernel_factory()
    except (TypeError, ValueError) as exc:
        raise ServesimError(f"invalid kernel shape: {exc}") from None
    result = analyse(kernel, gpu, estimator)
    if output_format == "json" or not explain:
        row = {"gpu": result["gpu"], "kernel": result["kernel"], "shape": result["shape"],
               "tasks": sum(l["tasks"] for l in result["launches"]), "bottleneck": result["bottleneck"],
               "theoretical_ms": result["theoretical_time_us"] / 1e3, "predicted_ms": result["predicted_time_us"] / 1e3}
        cols = [Column("gpu", "GPU", align="<"), Column("kernel", "kernel", align="<"), Column("shape", "shape", align="<"),
                Column("tasks", "tasks", ",d"), Column("bottleneck", "bottleneck", align="<"),
                Column("theoretical_ms", "theoretical (ms)", ".4f"),
                Column("predicted_ms", f"{result['estimator']} (ms)", ".4f")]
        emit([row], cols, output_format, notes=[result["estimator_note"]] if result["estimator_note"] else [],
             json_payload=result)
    else:
        _print_explain(result)


def _common(func):
    func = output_format_options(func)
    func = estimator_option(func)
    func = click.option("--explain", is_flag=True, help="Show tasks, occupancy, per-SM distribution and features.")(func)
    return click.option("--gpu", required=True, help="GPU name from 'servesim gpus', e.g. H100 or H20.")(func)


def _positive(name: str, **kw):
    return click.option(name, type=DIMENSION, required=True, **kw)


@click.command("gemm")
@_positive("--m")
@_positive("--n")
@_positive("--k")
@click.option("--dtype", type=click.Choice(["bf16", "fp16"]), default="bf16", show_default=True)
@_common
def gemm(m: int, n: int, k: int, dtype: str, gpu: str, estimator: str, explain: bool, output_format: str) -> None:
    """Analyse a cuBLAS GEMM C[m,n] = A[m,k] @ W[k,n]."""
    from servesim.kernels.types import Gemm

    _run(lambda: Gemm(m=m, n=n, k=k, dtype=dtype), gpu, estimator, explain, output_format)


@click.command("scaled-mm")
@_positive("--m")
@_positive("--n")
@_positive("--k")
@click.option("--scale", type=click.Choice(list(SCALED_MM_LIBRARIES)), default="tensor", show_default=True)
@click.option("--library", type=click.Choice(SCALED_MM_LIBRARY_NAMES),
              default=None,
              help="Implementation: vLLM's CUTLASS (default for tensor scales), SGLang's sgl-kernel, cuBLASLt, or "
                   "DeepGEMM (block scales).")
@_common
def scaled_mm(m: int, n: int, k: int, scale: str, library: str | None, gpu: str, estimator: str,
              explain: bool, output_format: str) -> None:
    """Analyse an FP8 scaled matrix multiply as its library tiles it."""
    from servesim.kernels.types import ScaledMM

    _run(lambda: ScaledMM(m=m, n=n, k=k, scale=scale, library=library or ""), gpu, estimator, explain, output_format)


@click.command("attention")
@click.option("--q", "q_text", default="1", show_default=True,
              help="New tokens per request, comma-separated; all 1 means decode.")
@click.option("--kv", "kv_text", required=True, help="Keys per request (new included), comma-separated.")
@click.option("--heads", type=DIMENSION, default=32, show_default=True)
@click.option("--kv-heads", type=DIMENSION, default=8, show_default=True)
@click.option("--head-dim", type=DIMENSION, default=128, show_default=True)
@click.option("--backend", type=click.Choice(["fa2", "fa3", "flashinfer"]), default=None,
              help="Attention kernels [default: vLLM's on this GPU: fa3 on Hopper, flashinfer on Blackwell, else fa2].")
@click.option("--no-causal", is_flag=True, help="Bidirectional prefill.")
@_common
def attention(q_text: str, kv_text: str, heads: int, kv_heads: int, head_dim: int, backend: str | None,
              no_causal: bool, gpu: str, estimator: str, explain: bool, output_format: str) -> None:
    """Analyse attention prefill (any --q above 1) or decode."""
    from servesim.hardware import get_gpu
    from servesim.kernels.engines import get_engine_kernels
    from servesim.kernels.types import AttentionDecode, AttentionPrefill

    backend = backend or get_engine_kernels("vllm").attention_backend(get_gpu(gpu).architecture)

    q, kv = _ints(q_text, "--q"), _ints(kv_text, "--kv")
    if len(q) == 1:
        q = q * len(kv)
    if len(q) != len(kv):
        raise ServesimError(f"--q gives {len(q)} requests but --kv gives {len(kv)}; give one value or one per request")
    if any(a > b for a, b in zip(q, kv)):
        raise ServesimError("each request's --kv must count its new tokens too, so --kv >= --q")
    if max(q) == 1:
        factory = lambda: AttentionDecode(kv_lens=kv, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                                          backend=backend)
    else:
        factory = lambda: AttentionPrefill(query_lens=q, kv_lens=kv, num_heads=heads, num_kv_heads=kv_heads,
                                           head_dim=head_dim, causal=not no_causal, backend=backend)
    _run(factory, gpu, estimator, explain, output_format)


@click.command("rmsnorm")
@_positive("--rows")
@_positive("--dim")
@click.option("--fused-add", is_flag=True, help="fused_add_rms_norm (residual add in place).")
@_common
def rmsnorm(rows: int, dim: int, fused_add: bool, gpu: str, estimator: str, explain: bool, output_format: str) -> None:
    """Analyse vLLM's RMSNorm kernel."""
    from servesim.kernels.types import AddRMSNorm, RMSNorm

    cls = AddRMSNorm if fused_add else RMSNorm
    _run(lambda: cls(rows=rows, dim=dim), gpu, estimator, explain, output_format)


@click.command("silu-mul")
@_positive("--tokens")
@_positive("--dim", help="Output width (the input is 2 x dim).")
@_common
def silu_mul(tokens: int, dim: int, gpu: str, estimator: str, explain: bool, output_format: str) -> None:
    """Analyse vLLM's SiLU-and-multiply kernel."""
    from servesim.kernels.types import SiluMul

    _run(lambda: SiluMul(tokens=tokens, dim=dim), gpu, estimator, explain, output_format)


@click.command("moe")
@_positive("--tokens")
@_positive("--experts")
@_positive("--top-k")
@_positive("--hidden")
@_positive("--intermediate", help="This GPU's slice of the expert intermediate size.")
@click.option("--expert-tokens", default=None, help="Routed pairs per expert, comma-separated (default: uniform).")
@_common
def moe(tokens: int, experts: int, top_k: int, hidden: int, intermediate: int, expert_tokens: str | None, gpu: str,
        estimator: str, explain: bool, output_format: str) -> None:
    """Analyse vLLM's Triton fused MoE (gate/up grouped GEMM, SiLU&Mul, down grouped GEMM)."""
    from servesim.kernels.types import FusedMoE

    if top_k > experts:
        raise ServesimError(f"--top-k {top_k} routes each token to more experts than the {experts} there are; "
                            f"give a --top-k of at most {experts}")
    pairs = tokens * top_k
    if expert_tokens is None:
        counts = tuple(int(c) for c in np.diff(np.linspace(0, pairs, experts + 1).round()))
    else:
        counts = _expert_counts(expert_tokens, experts, tokens, pairs)
    _run(lambda: FusedMoE(tokens=tokens, num_experts=experts, top_k=top_k, hidden=hidden, intermediate=intermediate,
                          expert_tokens=counts), gpu, estimator, explain, output_format)


SUBCOMMANDS = [gemm, scaled_mm, attention, rmsnorm, silu_mul, moe]
