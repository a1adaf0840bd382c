"""SynPerf's F(X, S): a kernel and a GPU -> the launches it consists of, each with its tasks and CTA resources."""

from __future__ import annotations

from functools import lru_cache

from servesim.decompose.attention import decode_splits, decompose_decode, decompose_prefill
from servesim.decompose.elementwise import decompose_rowwise
from servesim.decompose.gemm import decompose_gemm, decompose_scaled_mm
from servesim.decompose.launch import (
    MIN_HEAP,
    PIPES,
    POLICIES,
    ROUND_ROBIN,
    STATIC_PERSISTENT,
    Launch,
    LaunchConfig,
    Occupancy,
    TaskSet,
    occupancy,
    pipe_rate_vector,
)
from servesim.decompose.moe import decompose_marlin_moe, decompose_moe
from servesim.errors import ServesimError
from servesim.hardware import GpuSpec
from servesim.kernels.types import AttentionDecode, Kernel


def _decompose_index_logits(kernel: Kernel, gpu: GpuSpec) -> tuple[Launch, ...]:
    """DSA's indexer logits as the MQA they are (one FP8 key head, the indexer's heads packed as tile rows): the
    attention decompositions of a decode or a prompt chunk (docs/kernels.md, "DeepSeek Sparse Attention")."""
    return decompose_decode(kernel, gpu) if isinstance(kernel, AttentionDecode) else decompose_prefill(kernel, gpu)


_DECOMPOSERS = {
    "gemm": decompose_gemm,
    "fp4_mm": decompose_gemm,
    "scaled_mm": decompose_scaled_mm,
    "attn_prefill": decompose_prefill,
    "attn_decode": decompose_decode,
    "moe": decompose_moe,
    "moe_marlin": decompose_marlin_moe,
    "moe_trtllm": decompose_moe,
    "index_logits": _decompose_index_logits,
    **{c: decompose_rowwise for c in ("rmsnorm", "add_rmsnorm", "silu_mul", "rope", "kv_write", "quant",
                                      "embedding", "router_topk", "sampling", "gdn_prefill",
                                      "gdn_decode", "conv1d", "index_topk")},
}


@lru_cache(maxsize=4096)
def decompose(kernel: Kernel, gpu: GpuSpec) -> tuple[Launch, ...]:
    """The launches of ``kernel`` on ``gpu`` (memoised: kernels and GPUs are hashable)."""
    try:
        decomposer = _DECOMPOSERS[kernel.category]
    except KeyError:
        raise ServesimError(f"no task decomposition for kernel category {kernel.category!r}") from None
    return decomposer(kernel, gpu)


__all__ = [
    "MIN_HEAP", "PIPES", "POLICIES", "ROUND_ROBIN", "STATIC_PERSISTENT", "Launch", "LaunchConfig", "Occupancy",
    "TaskSet", "decode_splits", "decompose", "occupancy", "pipe_rate_vector",
]
