"""Serving-engine settings that decide memory and batching, with each engine's defaults.

The defaults follow the engines' argument handling (see docs/engines.md for the version and source file of
each); every one can be overridden by the user.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from servesim.errors import ServesimError
from servesim.hardware.spec import GpuSpec
from servesim.kernels.engines import get_engine, sglang_memory_defaults
from servesim.kernels.expand import kv_storage_dtype
from servesim.models.config import ModelConfig
from servesim.models.memory import GIB, MemoryPlan, MemoryReserve, plan_memory
from servesim.models.parallel import Parallelism, padded_vocab_per_gpu

#: vLLM's non-torch memory per GPU (CUDA context, NCCL communicators, cuBLAS workspaces): it is measured during
#: start-up and kept out of the KV cache (vllm/v1/worker/gpu_worker.py ``determine_available_memory``).
VLLM_NON_TORCH_BYTES = 0.75 * GIB
#: Extra non-torch memory with TP > 1: the custom all-reduce's IPC buffers and NCCL channel buffers.
VLLM_TP_COMM_BYTES = 0.25 * GIB
#: Memory SGLang's processes hold before it measures free memory (CUDA context, NCCL); its KV pool is
#: ``mem_fraction_static`` of what is free then, minus the weights (model_runner.py ``profile_max_num_token``).
SGLANG_CONTEXT_BYTES = 0.5 * GIB

@dataclass(frozen=True)
class EngineConfig:
    """The knobs of one engine instance that the planner and the simulator honour."""

    engine: str  # vllm | sglang
    version: str
    memory_fraction: float  # vLLM gpu_memory_utilization; SGLang mem_fraction_static
    max_num_batched_tokens: int  # vLLM token budget per step; SGLang chunked_prefill_size
    max_num_seqs: int  # vLLM max_num_seqs; SGLang max_running_requests
    block_size: int  # tokens per KV page
    enable_chunked_prefill: bool = True
    kv_cache_dtype: str = "auto"  # --kv-cache-dtype: auto (the activation dtype) or fp8

    def __post_init__(self) -> None:
        # vllm/config/scheduler.py SchedulerConfig verification: a step must have room for one token per sequence.
        if self.engine == "vllm" and self.max_num_batched_tokens < self.max_num_seqs:
            raise ServesimError(
                f"vLLM needs max_num_batched_tokens ({self.max_num_batched_tokens}) >= max_num_seqs "
                f"({self.max_num_seqs}); raise --max-num-batched-tokens or lower --max-num-seqs"
            )

    def with_overrides(self, **overrides: float | int | str | None) -> "EngineConfig":
        """A copy with the given fields replaced (``None`` keeps the default)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def _sglang_mem_fraction_static(gpu_mib: float, chunked_prefill_size: int, cuda_graph_max_bs: int,
                                par: Parallelism) -> float:
    """SGLang's default ``mem_fraction_static``: memory kept back for activations, graphs and parallelism."""
    reserved_mib = 512 + max(chunked_prefill_size, 2048) * 1.5 + cuda_graph_max_bs * 2 + par.tp * par.pp / 8 * 1024
    if gpu_mib > 60 * 1024:
        reserved_mib = max(reserved_mib, 10 * 1024)
    return round((gpu_mib - reserved_mib) / gpu_mib, 3)


def default_engine_config(engine: str, gpu: GpuSpec, par: Parallelism) -> EngineConfig:
    """The engine's defaults for this GPU and layout, as its server would pick them (docs/engines.md).

    The engine and its version are the kernel expanders' (servesim/kernels/engines.py), so memory, batching and
    kernels always describe the same release; CUDA-graph capture lives there too.
    """
    kernels_engine = get_engine(engine)
    version = kernels_engine.version
    # The KV page is the attention backend's: vLLM's blocks of 16, SGLang's single tokens or 64-token trtllm pages.
    block_size = kernels_engine.page_size(kernels_engine.attention_backend(gpu.architecture))
    if kernels_engine.name == "vllm":
        # vllm/engine/arg_utils.py: GPUs with >= 70 GiB whose name lacks "a100" get the larger server defaults.
        big = gpu.memory_gib >= 70 and not gpu.name.upper().startswith("A100")
        return EngineConfig(
            engine="vllm",
            version=version,
            memory_fraction=0.9,
            max_num_batched_tokens=8192 if big else 2048,
            max_num_seqs=1024 if big else 256,
            block_size=block_size,
        )
    chunk, graph_max = sglang_memory_defaults(gpu.memory_gib, par.tp)
    return EngineConfig(
        engine="sglang",
        version=version,
        memory_fraction=_sglang_mem_fraction_static(gpu.memory_gib * 1024, chunk, graph_max, par),
        max_num_batched_tokens=chunk,
        max_num_seqs=4096,  # upper clamp; the KV pool usually binds first (model_runner.py)
        block_size=block_size,
    )


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
    """What the engine keeps out of its memory fraction besides weights.

    vLLM subtracts its profiled peak activations and non-torch memory; its CUDA graphs are captured after the KV
    cache is sized and live in the headroom above ``gpu_memory_utilization``. SGLang sizes its pool from free memory
    after start-up, so only the memory already held then counts (scaled by the fraction, as the engine does).
    """
    if cfg.engine == "vllm":
        runtime = VLLM_NON_TORCH_BYTES + (VLLM_TP_COMM_BYTES if par.tp > 1 else 0.0)
        return MemoryReserve(activation_reserve_bytes(model, par, cfg), 0.0, runtime)
    return MemoryReserve(0.0, 0.0, SGLANG_CONTEXT_BYTES * cfg.memory_fraction)


def engine_memory_plan(
    model: ModelConfig,
    gpu: GpuSpec,
    par: Parallelism,
    cfg: EngineConfig,
    weight_dtype: str = "bf16",
) -> MemoryPlan:
    """Memory plan of ``model`` served by ``cfg`` on ``gpu`` with layout ``par``; the KV cache is stored in
    ``cfg.kv_cache_dtype`` (``auto``: the activation dtype, FP16 for FP16 weights and BF16 otherwise)."""
    return plan_memory(
        model,
        par,
        gpu_memory_bytes=gpu.memory_bytes,
        memory_fraction=cfg.memory_fraction,
        reserve=engine_memory_reserve(model, par, cfg),
        block_size=cfg.block_size,
        weight_dtype=weight_dtype,
        kv_dtype=kv_storage_dtype(weight_dtype, cfg.kv_cache_dtype),
    )
