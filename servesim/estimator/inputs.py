"""What the per-category MLPs see: the SynPerf features, plus, for attention, the kernel's own description.

Two attention kernels with the same SynPerf features can differ in measured time by the library that runs them
(vLLM's and SGLang's FlashAttention-3 builds choose different KV splits; SGLang's ``trtllm_mha`` and vLLM's
FlashInfer wrappers launch different kernels around the TRT-LLM-gen core) and by the KV-cache page size, which
the engines set differently (vLLM 16, SGLang 1, or 64 with ``trtllm_mha``). Attention categories therefore also
get the backend (one-hot), page size, KV layout and the shape the backends' split heuristics branch on.

Likewise the engines' per-tensor FP8 linears (vLLM's ``cutlass_scaled_mm``, SGLang's sgl-kernel build) differ in
time by more than their tiles explain, so scaled MMs also get their library (one-hot).

The BF16 GEMM network does not see the GPU's spec vector (``SPEC_FEATURES``): the SynPerf features already carry the
GPU through its pipe times and wave counts, and with the raw spec besides, a GPU outside the nine measured ones (the
H20: 78 SMs, under a quarter of an H100's tensor rate per SM) lands where no training row was. There, networks that
differed only in their training seed disagreed by a median 54 % on the H20, against 13 % without the spec vector, at
about the same MAPE on measured GPUs (``experiments/seed_spread.py``, ``experiments/ablate_spec_features.py``,
docs/accuracy.md). The FP8 scaled-MM network keeps most of it: without any of it, its MAPE on measured GPUs'
held-out shapes rose from 9.2 to 10.7 % (the L40S from 13.0 to 19.6 %). It leaves out the SM count and the Tensor
rate per SM, which place the L4, L20 and H20 outside the FP8 training range (their FP8 prefill linears came out
slower than their BF16 ones) and which, left out on GPUs outside the test set, cost nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np

from servesim.decompose.attention import BACKENDS
from servesim.features import SPEC_FEATURES, FeatureMatrix, kernel_features
from servesim.hardware.spec import GpuSpec
from servesim.kernels.types import SCALED_MM_LIBRARY_NAMES, AttentionPrefill, Kernel, ScaledMM, dtype_bytes

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


SCALED_MM_DESCRIPTORS = tuple(f"library_{lib}" for lib in SCALED_MM_LIBRARY_NAMES)


def _scaled_mm_descriptors(kernels: Sequence[ScaledMM]) -> np.ndarray:
    library = np.array([k.library for k in kernels])
    return (library[:, None] == np.array(SCALED_MM_LIBRARY_NAMES)[None, :]).astype(np.float64)


#: Category -> the names of the kernel's own descriptors and the function that computes them.
_DESCRIPTORS = {
    "attn_prefill": (ATTENTION_DESCRIPTORS, _attention_descriptors),
    "attn_decode": (ATTENTION_DESCRIPTORS, _attention_descriptors),
    "scaled_mm": (SCALED_MM_DESCRIPTORS, _scaled_mm_descriptors),
}


#: The spec inputs each category's network is trained and run without (see the module docstring): the whole
#: vector for BF16 GEMM and for NVFP4 linears (measured on the four Blackwell data-centre GPUs alone); for FP8
#: scaled MM the SM count and Tensor rate per SM, the two figures that put GPUs nobody measured (the L4's, H20's and
#: L20's SMs, the L20's and H20's rate) outside the FP8 training GPUs' range. The tiles' waves and Tensor cycles
#: carry both.
SPEC_INPUTS_LEFT_OUT: Mapping[str, frozenset[str]] = MappingProxyType({
    "gemm": frozenset(SPEC_FEATURES),
    "fp4_mm": frozenset(SPEC_FEATURES),
    "scaled_mm": frozenset({"spec_sm_count", "spec_tensor_per_sm_cycle"}),
})


def candidate_inputs(kernels: Sequence[Kernel], gpu: GpuSpec) -> FeatureMatrix:
    """Every input a network of the kernels' category may see, on ``gpu``: :func:`kernel_features` (the spec
    vector included), then the category's descriptors (:data:`ATTENTION_DESCRIPTORS`,
    :data:`SCALED_MM_DESCRIPTORS`), if it has any."""
    matrix = kernel_features(kernels, gpu)
    if not kernels or kernels[0].category not in _DESCRIPTORS:
        return matrix
    names, describe = _DESCRIPTORS[kernels[0].category]
    return FeatureMatrix((*matrix.names, *names), np.hstack([matrix.values, describe(kernels)]))


def input_names(category: str, candidate_names: Sequence[str]) -> tuple[str, ...]:
    """Which of a category's candidate inputs its network sees: all but its :data:`SPEC_INPUTS_LEFT_OUT`."""
    left_out = SPEC_INPUTS_LEFT_OUT.get(category, frozenset())
    return tuple(name for name in candidate_names if name not in left_out)


def estimator_inputs(kernels: Sequence[Kernel], gpu: GpuSpec) -> FeatureMatrix:
    """The MLP inputs of a batch of kernels of one category on ``gpu``: :func:`candidate_inputs`, selected by
    :func:`input_names`."""
    matrix = candidate_inputs(kernels, gpu)
    return matrix.select(input_names(kernels[0].category, matrix.names)) if kernels else matrix
