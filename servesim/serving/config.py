"""Serving-engine settings that decide memory and batching, with each engine's defaults.

The defaults follow the engines' argument handling (see docs/engines.md for the version and source file of
each); every one can be overridden by the user.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from servesim.errors import ServesimError, suggest
from servesim.hardware.spec import GpuSpec
from servesim.models.config import ModelConfig
from servesim.models.memory import GIB, MemoryPlan, MemoryReserve, plan_memory
from servesim.models.parallel import Parallelism, padded_vocab_per_gpu

ENGINES = ("vllm", "sglang")

#: CUDA context, NCCL communicators and cuBLAS/cuBLASLt workspaces per GPU, outside the engine's tensor pool.
RUNTIME_RESERVE_BYTES = 1.0 * GIB
#: Extra per-GPU buffers with TP > 1: the custom all-reduce's IPC buffers and NCCL channel buffers.
TP_COMM_RESERVE_BYTES = 0.25 * GIB
#: Memory CUDA graphs of the decode batch sizes take (private memory pools of the captured graphs).
CUDA_GRAPH_RESERVE_BYTES = 0.5 * GIB


@dataclass(frozen=True)
class EngineConfig:
    """The knobs of one engine instance that the planner and the simulator honour."""

    engine: str  # vllm | sglang
    version: str
    memory_fraction: float  # vLLM gpu_memory_utilization; SGLang mem_fraction_static
    max_num_batched_tokens: int  # vLLM token budget per step; SGLang chunked_prefill_size
    max_num_seqs: int  # vLLM max_num_seqs; SGLang max_running_requests
    block_size: int  # tokens per KV page
    cuda_graph_max_batch: int  # decode batches up to this size replay a CUDA graph
    enable_chunked_prefill: bool = True

    def with_overrides(self, **overrides: float | int | None) -> "EngineConfig":
        """A copy with the given fields replaced (``None`` keeps the default)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def _large_memory(gpu: GpuSpec) -> bool:
    return gpu.memory_gib >= 70


def default_engine_config(engine: str, gpu: GpuSpec, par: Parallelism) -> EngineConfig:
    """The engine's defaults for this GPU and layout, as its server would pick them."""
    if engine == "vllm":
        # vllm/engine/arg_utils.py: GPUs with >= 70 GiB (not A100) get the larger API-server defaults.
        big = _large_memory(gpu) and not gpu.name.startswith("A100")
        return EngineConfig(
            engine="vllm",
            version="0.11",
            memory_fraction=0.9,
            max_num_batched_tokens=8192 if big else 2048,
            max_num_seqs=1024 if big else 256,
            block_size=16,
            cuda_graph_max_batch=512,
        )
    if engine == "sglang":
        # sglang/srt/server_args.py: mem_fraction_static shrinks as TP grows (more communication buffers).
        fraction = 0.88 if par.tp < 2 else 0.87 if par.tp < 4 else 0.85 if par.tp < 8 else 0.81
        return EngineConfig(
            engine="sglang",
            version="0.5",
            memory_fraction=fraction,
            max_num_batched_tokens=8192 if _large_memory(gpu) else 2048,
            max_num_seqs=4096,
            block_size=1,
            cuda_graph_max_batch=256 if _large_memory(gpu) else 160,
        )
    raise ServesimError(f"unknown engine {engine!r}.{suggest(engine, ENGINES)} Use one of {', '.join(ENGINES)}.")


def activation_reserve_bytes(model: ModelConfig, par: Parallelism, cfg: EngineConfig) -> float:
    """Peak activation memory of the engine's start-up profiling pass.

    vLLM runs a dummy forward of ``max_num_batched_tokens`` tokens and a sampler pass over ``max_num_seqs``
    rows of FP32 logits, and keeps the peak out of the KV cache. The largest live set of the forward is the
    gate/up output plus the SiLU&Mul output and the residual stream; the sampler holds logits and their softmax.
    SGLang reserves the same kind of memory implicitly through ``mem_fraction_static``, so it gets none here.
    """
    if cfg.engine != "vllm":
        return 0.0
    tokens = cfg.max_num_batched_tokens
    mlp_width = model.moe_intermediate_size * model.num_experts_per_tok if model.is_moe else model.intermediate_size
    forward = tokens * (3 * mlp_width / par.tp + 4 * model.hidden_size) * 2
    sampler = cfg.max_num_seqs * padded_vocab_per_gpu(model, 1) * 4 * 2
    return forward + sampler


def engine_memory_reserve(model: ModelConfig, par: Parallelism, cfg: EngineConfig) -> MemoryReserve:
    runtime = RUNTIME_RESERVE_BYTES + (TP_COMM_RESERVE_BYTES if par.tp > 1 else 0.0)
    return MemoryReserve(
        activation_bytes=activation_reserve_bytes(model, par, cfg),
        cuda_graph_bytes=CUDA_GRAPH_RESERVE_BYTES,
        runtime_bytes=runtime,
    )


def engine_memory_plan(
    model: ModelConfig,
    gpu: GpuSpec,
    par: Parallelism,
    cfg: EngineConfig,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> MemoryPlan:
    """Memory plan of ``model`` served by ``cfg`` on ``gpu`` with layout ``par``."""
    return plan_memory(
        model,
        par,
        gpu_memory_bytes=gpu.memory_bytes,
        memory_fraction=cfg.memory_fraction,
        reserve=engine_memory_reserve(model, par, cfg),
        block_size=cfg.block_size,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
    )
