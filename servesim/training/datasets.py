"""Training samples for the kernel estimator: measured kernel tables turned into kernel objects, their SynPerf
feature matrices and efficiency targets (theoretical time / measured time).

Each category reads its measured rows (aiconfigurator-core tables, Vidur's per-op CSVs, our own collections),
keeps the rows servesim has a kernel model for, and maps every row to the kernel object the step model builds for
the same work: the engine's attention backend and page size for attention, the local experts' share of the
routed tokens for fused MoE. :func:`category_frame` says which rows were dropped and why.

Rows are split by *shape*, not by row: a shape's measurements on every GPU and by every engine fall on the same
side, so "seen GPU, held-out shape" accuracy never scores a shape the model trained on. The split of a shape is
a hash of its values and the seed, so it does not depend on which other rows were loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pandas as pd

from servesim.data.vidur import DEFAULT_VIDUR_ROOT
from servesim.errors import ServesimError, suggest
from servesim.estimator.inputs import candidate_inputs
from servesim.estimator.roofline import roofline_us
from servesim.features import FeatureMatrix
from servesim.hardware import get_gpu
from servesim.kernels.engines import get_engine_kernels
from servesim.kernels.types import (
    GDN_CHUNK_TOKENS,
    AttentionDecode,
    AttentionPrefill,
    CausalConv1d,
    Fp4Linear,
    FusedMoE,
    GatedDeltaRuleChunk,
    GatedDeltaRuleDecode,
    Gemm,
    IndexLogitsDecode,
    IndexLogitsPrefill,
    IndexTopK,
    Kernel,
    MarlinMoE,
    TrtllmMoE,
    Quantize,
    RMSNorm,
    Rope,
    ScaledMM,
    SiluMul,
    dtype_bytes,
)

#: ``system`` of rows from our own GPU collections (``--extra-data``); eval reports them as their own rows.
LOCAL_SYSTEM = "local"


@dataclass(frozen=True)
class DataOptions:
    """Where measured rows beyond aiconfigurator-core come from: Vidur's per-op CSVs (element-wise categories;
    a relative path is taken from the current directory) and an optional folder of our own GPU collections."""

    vidur_root: Path = DEFAULT_VIDUR_ROOT
    extra_data: Path | None = None


@dataclass(frozen=True, eq=False)
class KernelSamples:
    """Measured kernels of one category: row i is ``kernels[i]`` timed on ``gpu[i]`` in ``measured_us[i]``."""

    category: str
    kernels: tuple[Kernel, ...]
    gpu: np.ndarray  # catalogue GPU name per row
    shape_id: np.ndarray  # uint64 hash of the shape's values, equal across GPUs and engines
    features: FeatureMatrix
    measured_us: np.ndarray
    group: np.ndarray  # the row's report group: the GPU, or "<GPU> (local)" for our own collections
    kernel_source: np.ndarray  # "<engine> <kernel or code path timed>" per row

    def __len__(self) -> int:
        return len(self.kernels)

    @property
    def theoretical_us(self) -> np.ndarray:
        return self.features.column("theoretical_time_us")

    @property
    def efficiency(self) -> np.ndarray:
        """The estimator's target: theoretical time / measured time (above 1 where the model is pessimistic)."""
        return self.theoretical_us / self.measured_us

    def subset(self, mask: np.ndarray) -> KernelSamples:
        return self.take(np.flatnonzero(mask))

    def take(self, rows: np.ndarray) -> KernelSamples:
        """The samples at row indices ``rows``, in that order, repeats allowed."""
        return KernelSamples(
            category=self.category,
            kernels=tuple(self.kernels[i] for i in rows),
            gpu=self.gpu[rows],
            shape_id=self.shape_id[rows],
            features=FeatureMatrix(self.features.names, self.features.values[rows]),
            measured_us=self.measured_us[rows],
            group=self.group[rows],
            kernel_source=self.kernel_source[rows],
        )


def require_measured(samples: KernelSamples, gpu_names: Sequence[str], option: str = "--holdout") -> None:
    """Refuse GPUs given by ``option`` with no rows in the samples: a GPU held out without rows would score
    nothing without a word."""
    measured = set(samples.gpu)
    unmeasured = [gpu_name for gpu_name in gpu_names if gpu_name not in measured]
    if unmeasured:
        raise ServesimError(f"{option} {', '.join(unmeasured)}: no {samples.category} rows measured on it "
                            f"(measured: {', '.join(sorted(measured))}); choose a measured GPU, or score "
                            f"{samples.category} without it")


@dataclass(frozen=True)
class ShapeSplit:
    """Boolean row masks of a split by shape."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


def split_by_shape(shape_id: np.ndarray, seed: int, val_fraction: float = 0.1,
                   test_fraction: float = 0.1) -> ShapeSplit:
    """Assign each shape to train, validation or test from a hash of (shape, seed)."""
    salted = pd.util.hash_array(shape_id.astype(np.uint64) ^ np.uint64(seed * 0x9E3779B97F4A7C15 % 2**64))
    u = salted.astype(np.float64) / 2.0**64
    test = u < test_fraction
    val = (u >= test_fraction) & (u < test_fraction + val_fraction)
    return ShapeSplit(train=~(test | val), val=val, test=test)


@dataclass(frozen=True, eq=False)
class CategoryFrame:
    """A category's usable measured rows (columns: gpu, system, backend, kernel_source, the shape columns,
    latency_us) and the rows left out, as ``reason -> count``."""

    frame: pd.DataFrame
    dropped: Mapping[str, int]


def _drop(frame: pd.DataFrame, keep: pd.Series, reason: str, dropped: dict[str, int]) -> pd.DataFrame:
    if (~keep).any():
        dropped[reason] = dropped.get(reason, 0) + int((~keep).sum())
    return frame[keep]


def _sources(frame: pd.DataFrame) -> pd.Series:
    return frame["kernel_source"].astype(str)


# --- GEMM family -----------------------------------------------------------------------------------------------


def _read_gemm(options: DataOptions) -> pd.DataFrame:
    from servesim.data.aiconfigurator import load_gemm

    return load_gemm(dtypes=("bf16",))


def _prepare_gemm(frame: pd.DataFrame, dropped: dict[str, int]) -> pd.DataFrame:
    return _drop(frame, frame["dtype"].astype(str) == "bf16", "not BF16 (FP8 rows are scaled_mm)", dropped)


#: How many copies of a kernel aiconfigurator's timing loop runs in turn, by category: its GEMM collectors (vLLM's
#: and SGLang's ``collect_gemm.py``) time six copies of the layer, each with its own weights, and divide by six; its
#: attention collectors time one layer's kernel again and again on one KV cache.
HARNESS_COPIES: Mapping[str, int] = MappingProxyType({"gemm": 6, "fp4_mm": 6, "scaled_mm": 6, "attn_prefill": 1,
                                                      "attn_decode": 1, "index_logits": 1})


def harness_l2_fills(kernels: Sequence[Kernel], gpus: Sequence[str], copies: int) -> np.ndarray:
    """How many times the timing loop's working set (``copies`` kernels' ``bytes_moved()``) fills the L2 of each
    row's GPU."""
    return copies * np.array([k.bytes_moved() for k in kernels]) / _l2_bytes(gpus)


def _l2_bytes(gpus: Sequence[str]) -> np.ndarray:
    """The L2 size in bytes of each row's GPU."""
    sizes = {name: get_gpu(name).l2_cache_bytes for name in set(gpus)}
    return np.array([sizes[g] for g in gpus], dtype=float)


def _with_harness_l2(frame: pd.DataFrame, kernels: list[Kernel], category: str) -> list[Kernel]:
    """``kernels`` as the measuring loop ran them: when the loop's working set fits in L2, each run finds all of
    its own there; when it does not, a cyclic sweep evicts each copy before its next turn (least-recently-used
    replacement) and the run is cold, as in serving. Without it the measured rows are warm where serving is cold:
    on the L40S, FP8 linears of m ≤ 64 whose six copies fit in its 96 MiB L2 run several times faster than their
    weights can come from DRAM, and so does decode attention whose KV cache fits (``experiments/harness_l2.py``). Our
    own collections flush L2 before every repetition."""
    fills = harness_l2_fills(kernels, frame["gpu"].astype(str).tolist(), HARNESS_COPIES[category])
    return [k if cold else replace(k, l2_resident_fraction=float(fill <= 1.0))
            for k, fill, cold in zip(kernels, fills, _local(frame))]


def _gemm_kernels(frame: pd.DataFrame) -> list[Kernel]:
    return _with_harness_l2(frame, [Gemm(m=int(m), n=int(n), k=int(k), dtype=str(d))
                                    for m, n, k, d in zip(frame["m"], frame["n"], frame["k"], frame["dtype"])],
                            "gemm")


def _read_fp4_gemm(options: DataOptions) -> pd.DataFrame:
    from servesim.data.aiconfigurator import load_gemm

    return load_gemm(dtypes=("nvfp4",))


#: The NVFP4 linears of compute capability 10.x as each engine's collector names them (FlashInfer's CuteDSL FP4
#: GEMM behind both); the RTX PRO 6000's (SM120, FlashInfer's CUTLASS kernel) are another kernel on a GPU the
#: engines' NVFP4 MoE is not modelled on.
FP4_LINEAR_SOURCES = frozenset({"FlashInferCuteDslNvFp4LinearKernel", "sglang_flashinfer_cutedsl_nvfp4"})


def _prepare_fp4_mm(frame: pd.DataFrame, dropped: dict[str, int]) -> pd.DataFrame:
    return _drop(frame, _sources(frame).isin(FP4_LINEAR_SOURCES),
                 "NVFP4 linears of other kernels (FlashInfer CUTLASS on SM120)", dropped)


def _fp4_mm_kernels(frame: pd.DataFrame) -> list[Kernel]:
    return _with_harness_l2(frame, [Fp4Linear(m=int(m), n=int(n), k=int(k))
                                    for m, n, k in zip(frame["m"], frame["n"], frame["k"])], "fp4_mm")


def _read_fp8_gemm(options: DataOptions) -> pd.DataFrame:
    from servesim.data.aiconfigurator import load_gemm

    return load_gemm(dtypes=("fp8",))


def _scaled_mms(frame: pd.DataFrame) -> list[ScaledMM]:
    """Each FP8 row's scaled MM, with nothing in L2."""
    return [ScaledMM(m=int(m), n=int(n), k=int(k), scale=str(s), library=str(lib))
            for m, n, k, s, lib in zip(frame["m"], frame["n"], frame["k"], frame["scaling"], frame["library"])]


def _scaled_mm_kernels(frame: pd.DataFrame) -> list[Kernel]:
    return _with_harness_l2(frame, _scaled_mms(frame), "scaled_mm")


#: How many layers' buffers aiconfigurator's FP8 timing loop touches between two quantisations of one activation
#: tensor: vLLM's collector passes one tensor to all six copies of the layer, SGLang's gives each copy its own.
QUANTIZE_INPUT_REUSE_LAYERS: Mapping[str, int] = MappingProxyType({"vllm": 1, "sglang": HARNESS_COPIES["scaled_mm"]})


def harness_quantize_kernels(frame: pd.DataFrame) -> list[Kernel]:
    """The activation quantisation each aiconfigurator FP8 row also timed, by its engine's kernels (see
    :func:`_prepare_scaled_mm`), as its timing loop ran it: when the buffers of the layers it runs between two
    quantisations of one input (each its input, FP8 copy, weights and output; :data:`QUANTIZE_INPUT_REUSE_LAYERS`)
    fit in L2, the quantisation finds all its traffic there. With vLLM's shared input that is one layer: on the
    L40S, vLLM's 4096 x 4096 layer of 32 output columns takes 67 us, less than its two reads of the 32 MiB input
    and its FP8 write take from DRAM (97 us), and SGLang's, which reads the input once, takes 99 us."""
    kernels = [Quantize(rows=int(m), cols=int(k), group=128 if s == "block" else 0, engine=str(engine))
               for m, k, s, engine in zip(frame["m"], frame["k"], frame["scaling"], frame["backend"])]
    layer_bytes = np.array([q.rows * q.cols * dtype_bytes(q.in_dtype) + mm.bytes_moved()
                            for q, mm in zip(kernels, _scaled_mms(frame))])
    layers = frame["backend"].astype(str).map(QUANTIZE_INPUT_REUSE_LAYERS).to_numpy()
    fills = layers * layer_bytes / _l2_bytes(frame["gpu"].astype(str).tolist())
    return [replace(q, l2_resident_fraction=float(fill <= 1.0)) for q, fill in zip(kernels, fills)]


#: vLLM 0.24's block-scaled FP8 linears take 60 us (Hopper) to 800 us (GB200) whatever the shape up to m = 2048,
#: where SGLang's DeepGEMM path on the same GPUs takes 10 us: the timing is bound by per-call host work.
_HOST_BOUND_FP8_SOURCES = frozenset({
    "DeepGemmFp8BlockScaledMMKernel", "CutlassFp8BlockScaledMMKernel", "FlashInferFp8BlockScaledMMKernel",
    "TritonFp8BlockScaledMMKernel",
})


#: aiconfigurator's FP8 kernel_source -> the ScaledMM library that ran it. Our collections time
#: ``torch._scaled_mm``, which calls cuBLASLt.
SCALED_MM_LIBRARY_OF_SOURCE: Mapping[str, str] = MappingProxyType({
    "CutlassFP8ScaledMMLinearKernel": "cutlass",
    "sglang_sgl_kernel_fp8_scaled_mm": "sgl_kernel",
    "sglang_deepgemm_gemm_nt_f8f8bf16": "deepgemm",
})


#: A scaled-MM target that is the measured layer time less the modelled quantisation must keep at least this share
#: of the layer's time: a smaller remainder is within the two times' errors, and relative to it they are unbounded
#: (mostly vLLM's rows on the GDDR GPUs whose loop's buffers overfill L2 and still run partly from it, and short-k
#: rows on the B200 whose per-row atomics the stall model overstates).
MIN_SCALED_MM_SHARE = 0.2


def _fp8_linears(frame: pd.DataFrame, dropped: dict[str, int]) -> pd.DataFrame:
    """The FP8 rows of modelled linear layers, each with the ScaledMM library that ran it."""
    frame = _drop(frame, frame["dtype"].astype(str) == "fp8", "not FP8", dropped)
    frame = _drop(frame, ~_sources(frame).isin(_HOST_BOUND_FP8_SOURCES),
                  "vLLM block-scaled FP8 linears (flat in m, several times SGLang's DeepGEMM: host-bound)",
                  dropped).reset_index(drop=True)
    local = _local(frame)
    unknown = sorted(set(_sources(frame)[~local]) - set(SCALED_MM_LIBRARY_OF_SOURCE))
    if unknown:
        raise ServesimError(f"unknown FP8 kernel source(s) {', '.join(unknown)}; map them in "
                            "servesim.training.datasets.SCALED_MM_LIBRARY_OF_SOURCE")
    return frame.assign(library=np.where(local, "cublaslt", _sources(frame).map(SCALED_MM_LIBRARY_OF_SOURCE)))


def fp8_linear_rows(options: DataOptions = DataOptions()) -> pd.DataFrame:
    """aiconfigurator's FP8 rows of the linear layers the scaled-MM category models, with their measured time of
    the whole layer (activation quantisation included; the scaled-MM category's own target takes it off)."""
    return _fp8_linears(_read_fp8_gemm(options), {})


def quantize_us(frame: pd.DataFrame) -> np.ndarray:
    """The step model's time of the activation quantisation each aiconfigurator FP8 row also timed (its engine's
    kernels, roofline and stall); 0 for rows of our own collections, which time the scaled MM alone."""
    local = _local(frame)
    out = np.zeros(len(frame))
    out[~local] = roofline_us(harness_quantize_kernels(frame[~local]), frame["gpu"][~local].astype(str).tolist())
    return out


def _prepare_scaled_mm(frame: pd.DataFrame, dropped: dict[str, int]) -> pd.DataFrame:
    """aiconfigurator's FP8 rows time the engine's linear layer: dynamic activation quantisation, then the scaled
    MM. The step model has the quantisation as its own ``Quantize`` kernel, so their scaled-MM target is the
    measured time less that kernel's time (:func:`quantize_us`); rows where less than :data:`MIN_SCALED_MM_SHARE`
    of it is left are dropped. Our collections time the scaled MM alone."""
    frame = _fp8_linears(frame, dropped)
    remainder_us = frame["latency_us"] - quantize_us(frame)
    return _drop(frame.assign(latency_us=remainder_us), remainder_us > MIN_SCALED_MM_SHARE * frame["latency_us"],
                 f"less than {MIN_SCALED_MM_SHARE:.0%} of the measured time left after the Quantize kernel's", dropped)


# --- attention ---------------------------------------------------------------------------------------------------

#: Measured kernel_source -> the servesim attention backend whose kernels it ran.
ATTENTION_BACKENDS: Mapping[str, str] = MappingProxyType({
    "vllm_flash_attn": "fa2",  # A100, vLLM 0.14: FlashAttention-2
    "flash_attention": "fa2",  # A100, SGLang 0.5.10: FlashAttention on Ampere
    "vllm_flash_attn_fa2": "fa2",
    "vllm_flash_attn_fa3": "fa3",
    "fa3": "fa3",
    "flashinfer": "flashinfer",
    "vllm_flashinfer_fiprefill": "flashinfer",
    "vllm_flashinfer_fidecode": "flashinfer",
    # vLLM's FlashInfer backend on Blackwell dispatches to the TRT-LLM-gen kernels.
    "vllm_flashinfer_trtllmprefill": "flashinfer",
    "vllm_flashinfer_trtllmdecode": "flashinfer",
    "trtllm_mha": "trtllm_mha",
})
#: Context-table rows of 1-token queries that vLLM's FlashInfer backend times with its decode kernels.
_DECODE_KERNELS_IN_CONTEXT = frozenset({"vllm_flashinfer_trtllmdecode", "vllm_flashinfer_fidecode"})
#: Measured kernel sources servesim has no kernel model for (neither engine's default backend).
UNMODELLED_ATTENTION = frozenset({"triton", "vllm_triton_attn", "vllm_flash_attn_fa4"})


def _local(frame: pd.DataFrame) -> np.ndarray:
    return (frame["system"].astype(str) == LOCAL_SYSTEM).to_numpy()


#: Page size of our collections' attention rows: FlashInfer decode is timed on 16-token pages, the other
#: implementations read contiguous KV, which the paged decomposition with the kernels' default pages stands for.
_COLLECTED_PAGE_SIZE = 16


def _collected_backend(collection: str, kernel_source: str) -> str:
    from servesim.collect.implementations import by_kernel_source

    implementation = by_kernel_source(collection, kernel_source)
    if implementation is None or not implementation.attention_backend:
        raise ServesimError(f"unknown {collection} implementation {kernel_source!r} in a collection; re-collect it "
                            "with this servesim")
    return implementation.attention_backend


def _prepare_attention(collection: str) -> Callable[[pd.DataFrame, dict[str, int]], pd.DataFrame]:
    """Full-attention rows of modelled kernels, with the servesim backend and page size: the engine's for
    aiconfigurator rows, the collector implementation's for our own (``collection`` names their category)."""

    def prepare(frame: pd.DataFrame, dropped: dict[str, int]) -> pd.DataFrame:
        local = _local(frame)
        unknown = sorted(set(_sources(frame)[~local]) - set(ATTENTION_BACKENDS) - UNMODELLED_ATTENTION)
        if unknown:
            raise ServesimError(
                f"unknown attention kernel source(s) {', '.join(unknown)}; map them in "
                "servesim.training.datasets.ATTENTION_BACKENDS"
            )
        frame = _drop(frame, ~_sources(frame).isin(UNMODELLED_ATTENTION),
                      "Triton or FA4 attention (no kernel model)", dropped)
        frame = _drop(frame, frame["window_size"] == 0, "sliding-window attention (no kernel model)", dropped)
        local = _local(frame)
        backend = [_collected_backend(collection, s) if is_local else ATTENTION_BACKENDS[s]
                   for s, is_local in zip(_sources(frame), local)]
        page_size = [_COLLECTED_PAGE_SIZE if is_local else get_engine_kernels(str(e)).page_size(b)
                     for e, b, is_local in zip(frame["backend"], backend, local)]
        return frame.assign(attention_backend=backend, page_size=page_size)

    return prepare


def _read_context_attention(options: DataOptions) -> pd.DataFrame:
    from servesim.data.aiconfigurator import load_context_attention

    return load_context_attention()


def _prepare_prefill(frame: pd.DataFrame, dropped: dict[str, int]) -> pd.DataFrame:
    frame = _prepare_attention("context_attention")(frame, dropped)
    frame = _drop(frame, ~_sources(frame).isin(_DECODE_KERNELS_IN_CONTEXT),
                  "decode kernels in the context table (vLLM's FlashInfer backend runs 1-token queries as decodes)",
                  dropped)
    # SGLang's FlashInfer backend runs new tokens with nothing cached as a ragged kernel (no KV pages); our
    # collections time contiguous K/V.
    ragged = [is_local or b in get_engine_kernels(str(e)).ragged_prefix_split
              for e, b, is_local in zip(frame["backend"], frame["attention_backend"], _local(frame))]
    return frame.assign(kv_layout=np.where(ragged, "ragged", "paged"))


def _prefill_kernels(frame: pd.DataFrame) -> list[Kernel]:
    columns = ("batch", "seq_len", "prefix_len", "num_heads", "num_kv_heads", "head_dim", "dtype", "kv_dtype",
               "attention_backend", "page_size", "kv_layout")
    return _with_harness_l2(frame, [
        AttentionPrefill(query_lens=(int(s),) * int(b), kv_lens=(int(s + p),) * int(b), num_heads=int(h),
                         num_kv_heads=int(kvh), head_dim=int(d), dtype=str(dt), kv_dtype=str(kvd), backend=str(be),
                         page_size=int(ps), kv_layout=str(lay))
        for b, s, p, h, kvh, d, dt, kvd, be, ps, lay in zip(*(frame[c] for c in columns))
    ], "attn_prefill")


def _read_generation_attention(options: DataOptions) -> pd.DataFrame:
    from servesim.data.aiconfigurator import load_generation_attention

    return load_generation_attention()


def _decode_kernels(frame: pd.DataFrame) -> list[Kernel]:
    columns = ("batch", "kv_len", "num_heads", "num_kv_heads", "head_dim", "dtype", "kv_dtype", "attention_backend",
               "page_size")
    return _with_harness_l2(frame, [
        AttentionDecode(kv_lens=(int(kv),) * int(b), num_heads=int(h), num_kv_heads=int(kvh), head_dim=int(d),
                        dtype=str(dt), kv_dtype=str(kvd), backend=str(be), page_size=int(ps))
        for b, kv, h, kvh, d, dt, kvd, be, ps in zip(*(frame[c] for c in columns))
    ], "attn_decode")


# --- fused MoE ---------------------------------------------------------------------------------------------------

#: The Triton fused-MoE path the FusedMoE kernel models (docs/kernels.md); other rows time FlashInfer/TRT-LLM
#: expert kernels.
TRITON_MOE_SOURCES = frozenset({
    "sglang_fused_moe_triton", "vllm_fused_moe", "vllm_unquantizedfusedmoe_triton_tritonexperts",
    "vllm_fp8moe_triton_tritonexperts", "vllm_modeloptfp8moe_triton_tritonexperts",
})


def _read_moe(options: DataOptions) -> pd.DataFrame:
    from servesim.data.aiconfigurator import load_moe

    return load_moe()


def _balanced_only(frame: pd.DataFrame, dropped: dict[str, int]) -> pd.DataFrame:
    return _drop(frame, frame["distribution"].astype(str) == "balanced",
                 "power-law routing (the step model routes evenly)", dropped)


def _prepare_moe(frame: pd.DataFrame, dropped: dict[str, int]) -> pd.DataFrame:
    frame = _drop(frame, _sources(frame).isin(TRITON_MOE_SOURCES),
                  "FlashInfer/TRT-LLM expert kernels (FusedMoE models the Triton path)", dropped)
    return _balanced_only(frame, dropped)


def collector_routing(tokens: int, experts: int, top_k: int, local_experts: int) -> np.ndarray:
    """(token, choice) pairs per expert of EP rank 0 (experts ``[0, local_experts)``) under the routing
    aiconfigurator's MoE collectors time as ``balanced`` (``collector/helper.py`` ``balanced_logits``): with
    ``stride = ceil(experts / top_k)``, token ``i``'s choice ``j`` is expert ``(i + j * stride) % experts`` when
    ``tokens >= stride``, else ``floor(i * stride / tokens + j * stride) % experts``. Fewer tokens than the stride
    are spread over the whole expert range, so rank 0 of an expert-parallel run gets only its share of them, not
    the first ``local_experts`` experts' worth."""
    stride = -(-experts // top_k)
    token = np.arange(tokens)[:, None]
    choice = np.arange(top_k)[None, :] * stride
    if tokens >= stride:
        chosen = (token + choice) % experts
    else:
        chosen = np.floor(token * stride / tokens + choice).astype(np.int64) % experts
    return np.bincount(chosen[chosen < local_experts], minlength=local_experts)


def _local_experts(frame: pd.DataFrame) -> list[dict[str, object]]:
    """Each MoE row's shape on one GPU of ``moe_tp`` x ``moe_ep``: every expert's intermediate width over
    ``moe_tp``, the first ``num_experts / moe_ep`` experts local, receiving the (token, choice) pairs the
    collector's routing sends them (:func:`collector_routing`)."""
    columns = ("num_tokens", "hidden", "intermediate", "num_experts", "topk", "moe_tp", "moe_ep")
    shapes = []
    for t, h, inter, e, topk, tp, ep in zip(*(frame[c] for c in columns)):
        local = int(e) // int(ep)
        shapes.append({
            "tokens": int(t), "num_experts": local, "top_k": int(topk), "hidden": int(h),
            "intermediate": int(inter) // int(tp),
            "expert_tokens": tuple(int(n) for n in collector_routing(int(t), int(e), int(topk), local)),
        })
    return shapes


#: A 4-bit MoE row's precision (servesim.data.aiconfigurator ``dtype``) -> (activation dtype, weight dtype): MXFP4
#: experts with BF16 or MXFP8 activations, NVFP4 experts with NVFP4 activations.
_FP4_ROW_DTYPES = {"mxfp4": ("bf16", "mxfp4"), "mxfp4_mxfp8": ("fp8", "mxfp4"), "nvfp4": ("fp4", "nvfp4")}


def _moe_kernels(frame: pd.DataFrame, kernel_class: type[FusedMoE] = FusedMoE) -> list[Kernel]:
    """Each row's routed experts; 4-bit experts keep their format in ``weight_dtype`` and multiply BF16, FP8
    (MXFP8) or FP4 (NVFP4) activations, their block scales inside the kernel."""
    kernels: list[Kernel] = []
    for shape, dtype, scaling in zip(_local_experts(frame), frame["dtype"], frame["scaling"]):
        act, weights = _FP4_ROW_DTYPES.get(str(dtype), (str(dtype), ""))
        scale = "" if weights or scaling == "none" else str(scaling)
        kernels.append(kernel_class(**shape, dtype=act, scale=scale, weight_dtype=weights))
    return kernels


#: FlashInfer's TensorRT-LLM fused MoE as each engine's collector names it (FP8 block and per-tensor, BF16, MXFP4
#: experts with BF16 or MXFP8 activations, and NVFP4 experts).
TRTLLM_MOE_SOURCES = frozenset({
    "sglang_flashinfer_trtllm_moe", "vllm_fp8moe_flashinfer_trtllm_trtllmfp8expertsmodular",
    "vllm_fp8moe_flashinfer_trtllm_trtllmfp8expertsmonolithic",
    "vllm_modeloptfp8moe_flashinfer_trtllm_trtllmfp8expertsmonolithic",
    "vllm_unquantizedfusedmoe_flashinfer_trtllm_trtllmbf16experts",
    "vllm_gptossmxfp4moe_flashinfer_trtllm_mxfp4_bf16_trtllmmxfp4expertsmonolithic",
    "vllm_mxfp4moe_flashinfer_trtllm_mxfp4_mxfp8_trtllmmxfp4expertsmodular",
    "vllm_compressedtensorsw4a4nvfp4moe_flashinfer_trtllm_trtllmnvfp4expertsmonolithic",
    "vllm_compressedtensorsw4a4nvfp4moe_flashinfer_trtllm_trtllmnvfp4expertsmodular",
})

def _read_trtllm_moe(options: DataOptions) -> pd.DataFrame:
    from servesim.data.aiconfigurator import load_moe

    return load_moe(dtypes=("bf16", "fp8", *_FP4_ROW_DTYPES))


def _prepare_trtllm_moe(frame: pd.DataFrame, dropped: dict[str, int]) -> pd.DataFrame:
    frame = _drop(frame, _sources(frame).isin(TRTLLM_MOE_SOURCES),
                  "other expert kernels (Triton, FlashInfer CUTLASS, Marlin)", dropped)
    return _balanced_only(frame, dropped)


def _trtllm_moe_kernels(frame: pd.DataFrame) -> list[Kernel]:
    return _moe_kernels(frame, TrtllmMoE)


def _read_marlin_moe(options: DataOptions) -> pd.DataFrame:
    from servesim.data.aiconfigurator import load_moe

    return load_moe(dtypes=("int4", "mxfp4"))


#: Kimi-K3's MoE layer (hidden, intermediate, experts, top-k). aiconfigurator-core's vLLM 0.24 tables time its
#: Marlin rows with a stand-in: its ``collection_meta.yaml`` says they were collected in a Kimi-K3 preview runtime
#: (B200, B300: its SiTU activation, "stock 0.24.0 lacks SITU and would dispatch a different kernel") or in stock
#: 0.24.0 "via the owner-approved situ-as-silu Marlin approximation + EP-local shim" (H100, H200, GB200, GB300).
_KIMI_K3_MOE = (3584, 3072, 896, 16)


def _prepare_marlin_moe(frame: pd.DataFrame, dropped: dict[str, int]) -> pd.DataFrame:
    frame = _drop(frame, _sources(frame).str.contains("marlin", regex=False),
                  "4-bit MoE kernels other than Marlin (Triton matmul_ogs, FlashInfer)", dropped)
    kimi_k3 = np.logical_and.reduce([frame[column].to_numpy() == value for column, value in
                                     zip(("hidden", "intermediate", "num_experts", "topk"), _KIMI_K3_MOE)])
    frame = _drop(frame, ~kimi_k3, "Kimi-K3 rows timed through a preview runtime or an approximation shim", dropped)
    return _balanced_only(frame, dropped)


def _marlin_moe_kernels(frame: pd.DataFrame) -> list[Kernel]:
    """The Marlin path: BF16 activations times the row's 4-bit weights; the choices are sorted over all the
    row's ``num_experts`` (``global_experts``), not only rank 0's."""
    return [MarlinMoE(**shape, dtype="bf16", weight_dtype=str(dtype), global_experts=int(experts))
            for shape, dtype, experts in zip(_local_experts(frame), frame["dtype"], frame["num_experts"])]


# --- DeepSeek Sparse Attention ---------------------------------------------------------------------------------

#: The model aiconfigurator's DSA kernel tables measure (servesim/data/aiconfigurator.py ``DSA_KERNEL_TABLES``).
_DSA_TABLE_MODEL = "glm-5"


def _read_dsa(table: str) -> Callable[[DataOptions], pd.DataFrame]:
    def read(options: DataOptions) -> pd.DataFrame:
        from servesim.data.aiconfigurator import load_dsa_kernel

        return load_dsa_kernel(table)

    return read


def _prepare_index_topk(frame: pd.DataFrame, dropped: dict[str, int]) -> pd.DataFrame:
    frame = _drop(frame, frame["score_mode"].astype(str) == "flat",
                  "context-parallel logits layout (top_last), which servesim does not model", dropped)
    return _drop(frame, frame["latency_us"] > 0,
                 "no query with more than index_topk keys: no top-k runs (timed as 0)", dropped)


def _prepare_index_logits(frame: pd.DataFrame, dropped: dict[str, int]) -> pd.DataFrame:
    return _drop(frame, frame["latency_us"] > 0, "timed as 0", dropped)


def _dsa_lengths(frame: pd.DataFrame) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each row's (query lengths, key lengths): ``batch`` requests of ``query_len`` new tokens after
    ``prefix_len`` cached."""
    return [((int(q),) * int(b), (int(q) + int(p),) * int(b))
            for b, q, p in zip(frame["batch"], frame["query_len"], frame["prefix_len"])]


def _index_topk_kernels(frame: pd.DataFrame) -> list[Kernel]:
    from servesim.kernels.expand import causal_keys
    from servesim.models import get_model

    top_k = get_model(_DSA_TABLE_MODEL).index_topk
    return [IndexTopK(rows=sum(q), keys=causal_keys(q, kv), top_k=top_k) for q, kv in _dsa_lengths(frame)]


def _index_logits_kernels(frame: pd.DataFrame) -> list[Kernel]:
    """The indexer of the tables' model on each row's GPU, with the attention backend SGLang takes there (the
    decomposition follows it)."""
    from servesim.kernels.expand import indexer_logits_args
    from servesim.models import get_model

    model = get_model(_DSA_TABLE_MODEL)
    sglang = get_engine_kernels("sglang")
    backends = {name: sglang.attention_backend(get_gpu(name).architecture)
                for name in frame["gpu"].astype(str).unique()}
    kernels: list[Kernel] = []
    for (q, kv), gpu in zip(_dsa_lengths(frame), frame["gpu"].astype(str)):
        common = indexer_logits_args(model, backends[gpu])
        kernels.append(IndexLogitsDecode(kv_lens=kv, **common) if max(q) == 1 else
                       IndexLogitsPrefill(query_lens=q, kv_lens=kv, kv_layout="ragged", **common))
    return _with_harness_l2(frame, kernels, "index_logits")


# --- Gated DeltaNet ----------------------------------------------------------------------------------------------

#: vLLM 0.24's own Gated DeltaNet prompt kernel (FlashInfer's, on Hopper and Blackwell), which the vLLM releases
#: servesim models do not run: they, and SGLang everywhere, run fla's Triton ``chunk_gated_delta_rule``.
_FLASHINFER_GDN_SOURCE = "chunk_gated_delta_rule_flashinfer"

#: The state dtype of the tables' models (Qwen3.5's configs: ``mamba_ssm_dtype`` float32).
_GDN_TABLE_STATE_DTYPE = "fp32"


def _read_gdn(category: str) -> Callable[[DataOptions], pd.DataFrame]:
    def read(options: DataOptions) -> pd.DataFrame:
        from servesim.data.aiconfigurator import GDN_KERNEL_SOURCES, load_gdn

        frame = load_gdn()
        return frame[frame["kernel_source"].astype(str).isin(GDN_KERNEL_SOURCES[category])].reset_index(drop=True)

    return read


#: New tokens beyond which a Gated DeltaNet row is left out: no step of either engine holds more (their token
#: budgets, ``--max-num-batched-tokens`` and ``--chunked-prefill-size``, stay below it), and the widest rows' launches
#: would pass the tasks servesim decomposes.
_GDN_MAX_STEP_TOKENS = 65536


def _prepare_gdn(frame: pd.DataFrame, dropped: dict[str, int]) -> pd.DataFrame:
    frame = _drop(frame, frame["kernel_source"].astype(str) != _FLASHINFER_GDN_SOURCE,
                  "FlashInfer's Gated DeltaNet prompt kernel (vLLM 0.24 on Hopper and Blackwell), which the modelled "
                  "releases do not run", dropped)
    return _drop(frame, frame["batch"] * frame["seq_len"] <= _GDN_MAX_STEP_TOKENS,
                 f"more than {_GDN_MAX_STEP_TOKENS:,} new tokens, more than a step holds", dropped)


def _gdn_heads(row: Mapping[str, object]) -> dict[str, object]:
    return dict(key_heads=int(row["num_k_heads"]), value_heads=int(row["num_v_heads"]),
                key_head_dim=int(row["head_k_dim"]), value_head_dim=int(row["head_v_dim"]), dtype="bf16",
                state_dtype=_GDN_TABLE_STATE_DTYPE)


def _gdn_prefill_kernels(frame: pd.DataFrame) -> list[Kernel]:
    """``batch`` requests of ``seq_len`` new tokens each, chunked as fla chunks them."""
    return [GatedDeltaRuleChunk(tokens=int(r["batch"]) * int(r["seq_len"]), requests=int(r["batch"]),
                                chunks=int(r["batch"]) * -(-int(r["seq_len"]) // GDN_CHUNK_TOKENS), **_gdn_heads(r))
            for r in frame.to_dict("records")]


def _gdn_decode_kernels(frame: pd.DataFrame) -> list[Kernel]:
    return [GatedDeltaRuleDecode(tokens=int(r["batch"]), requests=int(r["batch"]), **_gdn_heads(r))
            for r in frame.to_dict("records")]


def _conv1d_kernels(frame: pd.DataFrame) -> list[Kernel]:
    """The convolution over the query, key and value channels (``2 * key heads * key dim + value heads * value
    dim``), as the models' ``linear_conv_dim`` gives it."""
    return [CausalConv1d(tokens=int(r["batch"]) * int(r["seq_len"]), requests=int(r["batch"]),
                         channels=2 * int(r["num_k_heads"]) * int(r["head_k_dim"])
                         + int(r["num_v_heads"]) * int(r["head_v_dim"]),
                         kernel_width=int(r["d_conv"]), dtype="bf16")
            for r in frame.to_dict("records")]


_GDN_SHAPE = ("phase", "batch", "seq_len", "num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim")


# --- element-wise ------------------------------------------------------------------------------------------------

#: Columns each element-wise category's rows need, as our collections store them: ``hidden`` is the width the
#: op works on (the model's hidden size for RMSNorm, the per-GPU intermediate size for SiLU&Mul's output).
_ELEMENTWISE_COLUMNS = {"rmsnorm": ("num_tokens", "hidden"), "silu_mul": ("num_tokens", "hidden"),
                        "rope": ("num_tokens", "num_heads", "num_kv_heads", "head_dim")}


def _read_vidur(category: str) -> Callable[[DataOptions], pd.DataFrame]:
    def read(options: DataOptions) -> pd.DataFrame:
        from servesim.data.vidur import load_vidur_ops

        ops = load_vidur_ops(options.vidur_root)
        ops = ops[ops["op"] == category]
        tp = ops["tp"]
        return pd.DataFrame({
            "gpu": ops["gpu"], "system": "vidur", "backend": "vidur", "kernel_source": "vidur " + ops["vidur_op"],
            "num_tokens": ops["num_tokens"],
            "hidden": ops["n_expanded_embd"] // tp if category == "silu_mul" else ops["n_embd"],
            "num_heads": ops["n_head"] // tp, "num_kv_heads": np.maximum(ops["n_kv_head"] // tp, 1),
            "head_dim": ops["n_embd"] // ops["n_head"], "dtype": "bf16", "latency_us": ops["latency_us"],
        })

    return read


def _prepare_elementwise(category: str) -> Callable[[pd.DataFrame, dict[str, int]], pd.DataFrame]:
    def prepare(frame: pd.DataFrame, dropped: dict[str, int]) -> pd.DataFrame:
        missing = [c for c in _ELEMENTWISE_COLUMNS[category] if c not in frame.columns or frame[c].isna().any()]
        if missing:
            raise ServesimError(f"{category} rows lack {', '.join(missing)}; re-collect them with this servesim")
        return frame

    return prepare


def _rmsnorm_kernels(frame: pd.DataFrame) -> list[Kernel]:
    return [RMSNorm(rows=int(t), dim=int(h)) for t, h in zip(frame["num_tokens"], frame["hidden"])]


def _silu_mul_kernels(frame: pd.DataFrame) -> list[Kernel]:
    return [SiluMul(tokens=int(t), dim=int(d)) for t, d in zip(frame["num_tokens"], frame["hidden"])]


def _rope_kernels(frame: pd.DataFrame) -> list[Kernel]:
    columns = _ELEMENTWISE_COLUMNS["rope"]
    return [Rope(tokens=int(t), num_heads=int(h), num_kv_heads=int(kvh), head_dim=int(d))
            for t, h, kvh, d in zip(*(frame[c] for c in columns))]


# --- the registry ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CategorySource:
    """One category's measurements: ``read`` returns the measured rows in the loaders' columns, ``prepare`` keeps
    the rows servesim models (recording the others in the dict it is given) and adds what ``to_kernels`` needs.
    ``collection`` names the category in our own collections (None: not collected)."""

    read: Callable[[DataOptions], pd.DataFrame]
    prepare: Callable[[pd.DataFrame, dict[str, int]], pd.DataFrame]
    shape_columns: tuple[str, ...]
    to_kernels: Callable[[pd.DataFrame], list[Kernel]]
    collection: str | None


_ATTENTION_SHAPE = ("batch", "num_heads", "num_kv_heads", "head_dim", "dtype", "kv_dtype")
#: The shape columns of aiconfigurator's fused-MoE rows (Triton and TRT-LLM kernels alike).
_MOE_SHAPE = ("num_tokens", "hidden", "intermediate", "num_experts", "topk", "moe_tp", "moe_ep", "dtype", "scaling")

#: Categories with measured training data, named as the kernels' ``category``.
SOURCES: dict[str, CategorySource] = {
    "gemm": CategorySource(_read_gemm, _prepare_gemm, ("m", "n", "k", "dtype"), _gemm_kernels, "gemm"),
    "scaled_mm": CategorySource(_read_fp8_gemm, _prepare_scaled_mm, ("m", "n", "k", "scaling"), _scaled_mm_kernels,
                                "scaled_mm"),
    "fp4_mm": CategorySource(_read_fp4_gemm, _prepare_fp4_mm, ("m", "n", "k"), _fp4_mm_kernels, None),
    "attn_prefill": CategorySource(_read_context_attention, _prepare_prefill, ("seq_len", "prefix_len",
                                   *_ATTENTION_SHAPE), _prefill_kernels, "context_attention"),
    "attn_decode": CategorySource(_read_generation_attention, _prepare_attention("generation_attention"),
                                  ("kv_len", *_ATTENTION_SHAPE),
                                  _decode_kernels, "generation_attention"),
    "moe": CategorySource(_read_moe, _prepare_moe, _MOE_SHAPE, _moe_kernels, None),
    "moe_trtllm": CategorySource(_read_trtllm_moe, _prepare_trtllm_moe, _MOE_SHAPE, _trtllm_moe_kernels, None),
    "moe_marlin": CategorySource(_read_marlin_moe, _prepare_marlin_moe, ("num_tokens", "hidden", "intermediate",
                                                                       "num_experts", "topk", "moe_tp", "moe_ep",
                                                                       "dtype"), _marlin_moe_kernels, None),
    "index_topk": CategorySource(_read_dsa("glm5_topk_module_perf"), _prepare_index_topk,
                                 ("batch", "query_len", "prefix_len"), _index_topk_kernels, None),
    "index_logits": CategorySource(_read_dsa("glm5_mqa_logits_module_perf"), _prepare_index_logits,
                                   ("batch", "query_len", "prefix_len"), _index_logits_kernels, None),
    **{
        category: CategorySource(_read_gdn(category), _prepare_gdn, _GDN_SHAPE, kernels, None)
        for category, kernels in (("gdn_prefill", _gdn_prefill_kernels), ("gdn_decode", _gdn_decode_kernels),
                                  ("conv1d", _conv1d_kernels))
    },
    **{
        category: CategorySource(_read_vidur(category), _prepare_elementwise(category),
                                 _ELEMENTWISE_COLUMNS[category], kernels, category)
        for category, kernels in (("rmsnorm", _rmsnorm_kernels), ("silu_mul", _silu_mul_kernels),
                                  ("rope", _rope_kernels))
    },
}


def read_rows(category: str, options: DataOptions = DataOptions()) -> pd.DataFrame:
    """The measured rows of ``category``, with our own collection's rows (``system`` = local) when
    ``options.extra_data`` is given."""
    source = category_source(category)
    frame = source.read(options)
    if options.extra_data is None or source.collection is None:
        return frame
    try:
        from servesim.collect import load_collection
    except ImportError:
        raise ServesimError("--extra-data needs servesim.collect, which this servesim lacks") from None
    local = load_collection(options.extra_data, source.collection).assign(system=LOCAL_SYSTEM)
    return pd.concat([frame, local], ignore_index=True)


def prepare_frame(category: str, frame: pd.DataFrame) -> CategoryFrame:
    """The rows of a measured frame (loader columns) servesim models, ready for :func:`samples_from_frame`, and
    the counts of rows left out, by reason."""
    dropped: dict[str, int] = {}
    frame = category_source(category).prepare(frame, dropped)
    frame = _drop(frame, frame["latency_us"] > 0, "no positive latency", dropped)
    return CategoryFrame(frame.reset_index(drop=True), MappingProxyType(dropped))


def category_frame(category: str, options: DataOptions = DataOptions()) -> CategoryFrame:
    """The usable measured rows of ``category`` and the counts of rows left out, by reason."""
    return prepare_frame(category, read_rows(category, options))


def samples_from_frame(category: str, frame: pd.DataFrame) -> KernelSamples:
    """Kernels, candidate estimator inputs (``inputs.candidate_inputs``, which the baselines read too) and measured
    times of a measured frame's rows (computed per GPU, batched)."""
    source = category_source(category)
    frame = frame.reset_index(drop=True)
    kernels = source.to_kernels(frame)
    values = np.empty((len(frame), 0))
    names: tuple[str, ...] = ()
    for gpu_name, rows in frame.groupby("gpu", observed=True).indices.items():
        matrix = candidate_inputs([kernels[i] for i in rows], get_gpu(str(gpu_name)))
        if not names:
            names, values = matrix.names, np.empty((len(frame), len(matrix.names)))
        values[rows] = matrix.values
    shape_id = pd.util.hash_pandas_object(frame[list(source.shape_columns)], index=False).to_numpy()
    gpu = frame["gpu"].astype(str).to_numpy()
    local = frame["system"].astype(str).to_numpy() == LOCAL_SYSTEM
    return KernelSamples(
        category=category,
        kernels=tuple(kernels),
        gpu=gpu,
        shape_id=shape_id,
        features=FeatureMatrix(names, values),
        measured_us=frame["latency_us"].to_numpy(dtype=np.float64),
        group=np.where(local, np.char.add(gpu.astype(str), " (local)"), gpu),
        kernel_source=(frame["backend"].astype(str) + " " + frame["kernel_source"].astype(str)).to_numpy(),
    )


def sample_frame(frame: pd.DataFrame, max_rows: int | None = None, seed: int = 0,
                 gpus: Sequence[str] | None = None) -> pd.DataFrame:
    """The rows of a measured frame (optionally only those of ``gpus``), a seeded random ``max_rows`` of them at
    most."""
    if gpus is not None:
        frame = frame[frame["gpu"].isin(list(gpus))]
    if max_rows is not None and len(frame) > max_rows:
        frame = frame.sample(n=max_rows, random_state=seed)
    return frame


def load_samples(category: str, max_rows: int | None = None, seed: int = 0, gpus: Sequence[str] | None = None,
                 options: DataOptions = DataOptions()) -> KernelSamples:
    """Measured samples of ``category`` (optionally only ``gpus``), a seeded random ``max_rows`` of them at most."""
    return samples_from_frame(category, sample_frame(category_frame(category, options).frame, max_rows, seed, gpus))


def category_source(category: str) -> CategorySource:
    """Where ``category``'s measurements come from; a one-line error naming the nearest category otherwise."""
    try:
        return SOURCES[category]
    except KeyError:
        raise ServesimError(
            f"no measured training data for kernel category {category!r}.{suggest(category, SOURCES)} "
            f"Available: {', '.join(SOURCES)}."
        ) from None
