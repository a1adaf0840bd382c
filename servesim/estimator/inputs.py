"""What the per-category MLPs see: the SynPerf features, plus, for attention, the kernel's own description.

Two attention kernels with the same SynPerf features can differ in measured time by the library that runs them
(vLLM's and SGLang's FlashAttention-3 builds choose different KV splits; SGLang's ``trtllm_mha`` and vLLM's
FlashInfer wrappers launch different kernels around the TRT-LLM-gen core) and by the KV-cache page size, which
the engines set differently (vLLM 16, SGLang 1, or 64 with ``trtllm_mha``). Attention categories therefore also
get the backend (one-hot), page size, KV layout and the shape the backends' split heuristics branch on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servesim.decompose.attention import BACKENDS
from servesim.features import FeatureMatrix, kernel_features
from servesim.hardware.spec import GpuSpec
from servesim.kernels.types import AttentionPrefill, Kernel, dtype_bytes

ATTENTION_CATEGORIES = frozenset({"attn_prefill", "attn_decode"})
ATTENTION_DESCRIPTORS = (
    "requests", "query_tokens_mean", "kv_tokens_mean", "kv_tokens_max", "head_dim", "num_kv_heads", "gqa_group",
    "kv_bytes_per_element", "page_size", "ragged_kv", *(f"backend_{b}" for b in BACKENDS),
)


def _attention_descriptors(kernels: Sequence[Kernel]) -> np.ndarray:
    rows = []
    for k in kernels:
        requests = len(k.kv_lens)
        prefill = isinstance(k, AttentionPrefill)
        rows.append((requests, sum(k.query_lens) / requests if prefill else 1.0, sum(k.kv_lens) / requests,
                     max(k.kv_lens), k.head_dim, k.num_kv_heads, k.num_heads // k.num_kv_heads,
                     dtype_bytes(k.kv_dtype), k.page_size, float(prefill and k.kv_layout == "ragged"),
                     *(float(k.backend == b) for b in BACKENDS)))
    return np.array(rows, dtype=np.float64).reshape(len(kernels), len(ATTENTION_DESCRIPTORS))


def estimator_inputs(kernels: Sequence[Kernel], gpu: GpuSpec) -> FeatureMatrix:
    """The MLP inputs of a batch of kernels of one category on ``gpu``: :func:`kernel_features`, then for
    attention the :data:`ATTENTION_DESCRIPTORS`."""
    matrix = kernel_features(kernels, gpu)
    if not kernels or kernels[0].category not in ATTENTION_CATEGORIES:
        return matrix
    return FeatureMatrix((*matrix.names, *ATTENTION_DESCRIPTORS),
                         np.hstack([matrix.values, _attention_descriptors(kernels)]))
