"""Row-parallel kernels (norms, activations, RoPE, KV write, quantisation, embedding, router, sampling): each
CTA handles one row (token) or a fixed share of the tensor, so tasks are uniform and the kernel's FLOPs and bytes
split evenly. Grids and block sizes from the engines' sources (docs/synperf.md)."""

from __future__ import annotations

import numpy as np

from servesim.decompose.launch import ROUND_ROBIN, Launch, LaunchConfig, check_task_count, pipe_rate_vector, task_set
from servesim.hardware import GpuSpec
from servesim.kernels.types import (
    AddRMSNorm,
    CausalConv1d,
    Embedding,
    GatedDeltaRuleChunk,
    GatedDeltaRuleDecode,
    IndexTopK,
    Kernel,
    KvWrite,
    Quantize,
    RMSNorm,
    Rope,
    RouterTopK,
    Sampling,
    SiluMul,
    dtype_bytes,
)

_REGISTERS = 32  # element-wise kernels stay far below any register limit (surrogate)


def _grid(kernel: Kernel, gpu: GpuSpec) -> tuple[int, int, float, float, str]:
    """(CTAs, threads per CTA, XU ops per CTA, shared-memory bytes per CTA, source) of one launch."""
    if isinstance(kernel, (RMSNorm, AddRMSNorm)):
        # csrc/layernorm_kernels.cu (vLLM v0.9): grid(num_tokens), block(min(hidden, tokens < 256 ? 1024 : 256)),
        # one rsqrt per row and a block reduction through shared memory.
        threads = min(kernel.dim, 1024 if kernel.rows < 256 else 256)
        return kernel.rows, threads, 1.0, 2 * 4 * -(-threads // 32), "vLLM layernorm_kernels.cu"
    if isinstance(kernel, SiluMul):
        # csrc/activation_kernels.cu: grid(num_tokens), block(min(d, 1024)); one exp per element.
        return kernel.tokens, min(kernel.dim, 1024), float(kernel.dim), 0.0, "vLLM activation_kernels.cu"
    if isinstance(kernel, Rope):
        # csrc/pos_encoding_kernels.cu: grid(num_tokens), block(min(num_heads * rot_dim / 2, 512)); cos/sin cached.
        threads = min(kernel.num_heads * kernel.head_dim // 2, 512)
        return kernel.tokens, threads, 0.0, 0.0, "vLLM pos_encoding_kernels.cu"
    if isinstance(kernel, KvWrite):
        # csrc/cache_kernels.cu reshape_and_cache_flash: grid(num_tokens), block(min(num_heads * head_size, 512)).
        threads = min(kernel.num_kv_heads * kernel.head_dim, 512)
        return kernel.tokens, threads, 0.0, 0.0, "vLLM cache_kernels.cu"
    if isinstance(kernel, Quantize) and kernel.group == 0 and not kernel.per_tensor:
        # SGLang's per-token scales, sgl-kernel per_token_quant_fp8.cu: a warp per token, 8 tokens per CTA, from
        # 2 x 8 tokens per SM up; below that a 256-thread CTA per token. (vLLM's per-tensor scale is two launches,
        # _per_tensor_quantize.)
        warp_per_token = kernel.rows >= 16 * gpu.sm_count
        return -(-kernel.rows // 8) if warp_per_token else kernel.rows, 256, 0.0, 0.0, "sgl-kernel per_token_quant_fp8"
    if isinstance(kernel, Quantize) and kernel.group > 0:
        # Per-group scales, one pass: vLLM per_token_group_quant.cu and sgl-kernel per_token_group_quant_8bit,
        # grid(num_tokens x groups / 16) of 16 groups x 16 threads.
        ctas = -(-kernel.rows * -(-kernel.cols // kernel.group) // 16)
        return ctas, 256, 0.0, 0.0, f"{kernel.engine} per_token_group_quant"
    if isinstance(kernel, Embedding):
        # PyTorch aten/src/ATen/native/cuda/Indexing.cu indexSelectLargeIndex: grid min(ceil(n / 128), 8 x SMs),
        # block min(n, 128) over the n = tokens x hidden gathered elements (grid-stride loop).
        elems = kernel.tokens * kernel.hidden
        return max(min(-(-elems // 128), 8 * gpu.sm_count), 1), min(elems, 128), 0.0, 0.0, "PyTorch Indexing.cu"
    if isinstance(kernel, RouterTopK):
        # csrc/moe/topk_softmax_kernels.cu: 4 warps per CTA, one token per warp (surrogate of ROWS_PER_WARP),
        # one exp per logit.
        return -(-kernel.tokens // 4), 128, 4.0 * kernel.num_experts, 0.0, "vLLM topk_softmax_kernels.cu"
    if isinstance(kernel, Sampling):
        # FlashInfer sampling.cuh: grid(batch), block(1024); one exp per logit for the softmax.
        return kernel.rows, 1024, float(kernel.vocab), 2 * 4 * 32, "FlashInfer sampling.cuh"
    if isinstance(kernel, IndexTopK):
        # sgl-kernel csrc/elementwise/topk.cu (fast_topk_transform_fused): one 1024-thread CTA per query row, its
        # radix histogram in shared memory.
        return kernel.rows, 1024, 0.0, 4 * 256, "sgl-kernel topk.cu"
    if isinstance(kernel, GatedDeltaRuleDecode):
        # fla fused_recurrent_gated_delta_rule: a CTA per (token, value head, 32-wide V block), each walking its
        # slice of the head's state (surrogate: one uniform CTA of 128 threads per token and value head).
        return kernel.tokens * kernel.value_heads, 128, 0.0, 0.0, "fla fused_recurrent"
    if isinstance(kernel, GatedDeltaRuleChunk):
        # fla chunk_gated_delta_rule: the state pass that binds it (chunk_gated_delta_rule_fwd_h) runs a CTA per
        # (request, value head, 64-wide block of the value dim), each walking its request's chunks in turn, so a
        # long prompt is a long serial chain on a few SMs; the other kernels' per-chunk work is spread the same way
        # (surrogate, one launch: its Tensor-core work counted on this launch's FMA demand).
        ctas = kernel.requests * kernel.value_heads * -(-kernel.value_head_dim // 64)
        return ctas, 128, float(kernel.tokens), 0.0, "fla chunk_gated_delta_rule"
    if isinstance(kernel, CausalConv1d):
        # causal_conv1d_fn / causal_conv1d_update: CTAs over (request, channel blocks of 128 [decode] / 64 x
        # token blocks [prompt]) (surrogate: 256-thread CTAs over tokens x channels).
        return -(-kernel.tokens * kernel.channels // 256), 256, float(kernel.channels), 0.0, "causal_conv1d"
    raise TypeError(f"no row-parallel decomposition for {type(kernel).__name__}")


def uniform_launch(kernel: Kernel, gpu: GpuSpec, ctas: int, threads: int, flops: float, xu_per_cta: float,
                   bytes_moved: float, smem_per_cta: float, name: str, *, smem_alloc: float | None = None,
                   from_dram: bool = True, note: str = "") -> Launch:
    """One launch of ``ctas`` uniform CTAs sharing ``flops`` and ``bytes_moved`` evenly (read or written once,
    through L2 and, unless ``from_dram`` is False, DRAM), each touching ``smem_per_cta`` bytes of the
    ``smem_alloc`` bytes of shared memory it holds (default: those it touches)."""
    ctas = max(int(ctas), 1)
    check_task_count(kernel, ctas)
    bytes_per_cta = bytes_moved / ctas
    demand = {
        "fma": np.full(ctas, flops / ctas),
        "xu": np.full(ctas, xu_per_cta),
        "dram": np.full(ctas, bytes_per_cta if from_dram else 0.0),
        "l2": np.full(ctas, bytes_per_cta),
        "smem": np.full(ctas, float(smem_per_cta)),
    }
    tasks = task_set(("cta",), (np.arange(ctas),), demand, pipe_rate_vector(gpu, ""))
    config = LaunchConfig(max(threads, 1), _REGISTERS, int(smem_per_cta if smem_alloc is None else smem_alloc))
    grid = f"grid {ctas} x {threads} threads"
    return Launch(name, config, tasks, ROUND_ROBIN, ctas, "", (f"{grid}, {note}" if note else grid,))


def _per_tensor_quantize(kernel: Quantize, gpu: GpuSpec) -> tuple[Launch, ...]:
    """vLLM's per-tensor scale, two launches each reading the input once (csrc/quantization/w8a8/fp8/common.cu
    dynamic_scaled_fp8_quant): grid(num_tokens) x 256 threads for both, the abs-max kernel with unvectorised loads
    and one atomicMax per CTA on the one scale, then the vectorised conversion."""
    elems = kernel.rows * kernel.cols
    read = elems * dtype_bytes(kernel.in_dtype)
    return (
        uniform_launch(kernel, gpu, kernel.rows, 256, float(elems), 0.0, read, 4.0 * 256,
                       f"{kernel.category} (vLLM fp8/common.cu abs-max)"),
        uniform_launch(kernel, gpu, kernel.rows, 256, 2.0 * elems, 0.0, kernel.bytes_moved() - read, 0.0,
                       f"{kernel.category} (vLLM fp8/common.cu convert)"),
    )


def decompose_rowwise(kernel: Kernel, gpu: GpuSpec) -> tuple[Launch, ...]:
    if isinstance(kernel, Quantize) and kernel.per_tensor:
        return _per_tensor_quantize(kernel, gpu)
    ctas, threads, xu_per_cta, smem_per_cta, source = _grid(kernel, gpu)
    return (uniform_launch(kernel, gpu, ctas, threads, kernel.flops(), xu_per_cta, kernel.bytes_moved(),
                           smem_per_cta, f"{kernel.category} ({source})"),)
