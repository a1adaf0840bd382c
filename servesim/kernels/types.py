"""Kernel and collective types: what one GPU launches during one engine step, with exact shapes and dtypes.

Every type is a frozen, keyword-only dataclass, so equal kernels hash equal and are predicted once. ``name``
(the model's module name, e.g. ``qkv_proj``) is for people and does not take part in equality: a ``qkv_proj`` and
an ``o_proj`` of the same shape are the same kernel to a predictor.

``flops()`` counts arithmetic work (a multiply-add is two FLOPs; Tensor-core work for GEMMs and attention, FP32-pipe
work for element-wise kernels). ``bytes_moved()`` is the minimal DRAM traffic: every input read once, every output
written once, weights included. Neither says anything about time.

GEMM-family, attention and quantisation kernels also say how much of that traffic L2 already holds when they
start (``l2_resident_fraction``): none in serving, where a layer's weights and KV cache were evicted by every other
layer's since its last use, but a measured kernel timed in a loop whose working set fits in L2 finds all of it
there (servesim/training/datasets.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

#: MXFP4 (OCP Microscaling v1.0): 4-bit E2M1 values with one 8-bit E8M0 scale per block of 32, 4.25 bits a weight.
MXFP4_BITS_PER_WEIGHT = 4 + 8 / 32
#: NVFP4 (NVIDIA ModelOpt): 4-bit E2M1 values with one 8-bit E4M3 scale per block of 16, 4.5 bits a weight (plus one
#: FP32 scale per tensor).
NVFP4_BITS_PER_WEIGHT = 4 + 8 / 16
#: INT4 weights with one BF16 scale per group of 128 (GPTQ/AWQ checkpoints as Marlin runs them).
INT4_BITS_PER_WEIGHT = 4 + 16 / 128
#: Weight formats whose routed experts are 4-bit and run on their format's own MoE kernel (``FusedMoE.weight_dtype``),
#: not on the BF16/FP8 one ``--moe-backend`` picks.
FOUR_BIT_EXPERT_FORMATS = ("mxfp4", "int4", "nvfp4")
#: Bytes per element of each dtype name used in this package. ``fp4`` is an E2M1 operand of FP4 Tensor-core MMAs
#: (NVFP4 activations, their block scales counted apart).
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp4": 0.5,
                                 "mxfp4": MXFP4_BITS_PER_WEIGHT / 8, "nvfp4": NVFP4_BITS_PER_WEIGHT / 8,
                                 "int4": INT4_BITS_PER_WEIGHT / 8, "int32": 4, "int64": 8}

#: The scale granularities of an FP8 scaled matrix multiply (see :class:`ScaledMM`) and the libraries that run
#: each, the first being the default: vLLM's per-tensor FP8 linear calls CUTLASS (``cutlass_scaled_mm``), SGLang's
#: its sgl-kernel build (``fp8_scaled_mm``), ``torch._scaled_mm`` cuBLASLt; both engines run block-scaled linears
#: with DeepGEMM.
SCALED_MM_LIBRARIES: dict[str, tuple[str, ...]] = {
    "tensor": ("cutlass", "sgl_kernel", "cublaslt"),
    "block": ("deepgemm",),
}
#: Every scaled-MM library, in :data:`SCALED_MM_LIBRARIES` order.
SCALED_MM_LIBRARY_NAMES: tuple[str, ...] = tuple(dict.fromkeys(
    lib for libs in SCALED_MM_LIBRARIES.values() for lib in libs))

#: Collective operations and their implementations.
COLLECTIVE_OPS = ("all_reduce", "all_gather", "send", "recv")
COLLECTIVE_IMPLEMENTATIONS = ("custom_ar", "nccl")


def dtype_bytes(dtype: str) -> float:
    return DTYPE_BYTES[dtype]


@dataclass(frozen=True, kw_only=True)
class Kernel:
    """One kernel launch (or one fused op the engine treats as a unit, such as fused MoE)."""

    category: ClassVar[str] = ""
    dtype: str = "bf16"
    name: str = field(default="", compare=False)

    def flops(self) -> float:
        raise NotImplementedError

    def bytes_moved(self) -> float:
        raise NotImplementedError

    def shape(self) -> str:
        """A short human-readable shape, e.g. ``m=2064 n=2560 k=8192``."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class Gemm(Kernel):
    """``C[m, n] = A[m, k] @ W[k, n] (+ bias)`` with A and W in ``dtype`` and C in ``out_dtype``."""

    category: ClassVar[str] = "gemm"
    m: int
    n: int
    k: int
    bias: bool = False
    out_dtype: str = "bf16"
    l2_resident_fraction: float = 0.0  # of bytes_moved(), found in L2 at the start (see the module docstring)

    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def bytes_moved(self) -> float:
        b = dtype_bytes(self.dtype)
        out = self.m * self.n * dtype_bytes(self.out_dtype)
        return (self.m * self.k + self.k * self.n + (self.n if self.bias else 0)) * b + out

    def shape(self) -> str:
        return f"m={self.m} n={self.n} k={self.k}" + (" +bias" if self.bias else "")


@dataclass(frozen=True, kw_only=True)
class Fp4Linear(Gemm):
    """An NVFP4 linear layer on Blackwell as the engines run it: the BF16 activations quantised to NVFP4 (E2M1 values,
    an E4M3 scale per 16) and multiplied with NVFP4 weights on the FP4 Tensor cores, output in ``out_dtype``
    (vLLM's and SGLang's FlashInfer NVFP4 linears: ``scaled_fp4_quant`` then the CuteDSL or CUTLASS FP4 GEMM). One
    kernel stands for both steps, as aiconfigurator's collectors time the layer: the activations are read once in
    BF16, the weights at 4.5 bits. Its tiles are the BF16 GEMM's at FP4 operand width; its efficiency is learnt
    from the measured rows (its own category)."""

    category: ClassVar[str] = "fp4_mm"
    dtype: str = "fp4"

    def __post_init__(self) -> None:
        if self.dtype != "fp4":
            raise ValueError(f"an NVFP4 linear multiplies FP4 operands, not {self.dtype}")

    def bytes_moved(self) -> float:
        out = self.m * self.n * dtype_bytes(self.out_dtype)
        bias = self.n * dtype_bytes(self.out_dtype) if self.bias else 0
        return self.m * self.k * dtype_bytes("bf16") + self.k * self.n * dtype_bytes("nvfp4") + bias + out

    def shape(self) -> str:
        return f"{super().shape()} nvfp4"


@dataclass(frozen=True, kw_only=True)
class ScaledMM(Kernel):
    """FP8 W8A8 GEMM with scales, output in ``out_dtype``.

    ``scale="tensor"``: one scale for the weight and one for the activation (vLLM ``cutlass_scaled_mm``);
    ``scale="block"``: weight scales per ``block_n`` x ``block_k`` tile and activation scales per token per
    ``block_k`` group (DeepSeek-style 128 x 128, vLLM ``w8a8_block_fp8_matmul`` / SGLang ``fp8_blockwise``).

    ``library`` names the implementation (:data:`SCALED_MM_LIBRARIES`; empty: the granularity's default). It is part
    of the kernel: the libraries tile differently (servesim/decompose/gemm.py), and the engines' per-tensor kernels
    differ in time beyond that: on the same GPU and shape, SGLang's time over vLLM's spans 0.42 to 1.20 (10th to
    90th percentile of aiconfigurator's B200 rows).
    """

    category: ClassVar[str] = "scaled_mm"
    dtype: str = "fp8"
    m: int
    n: int
    k: int
    scale: str = "tensor"
    block_n: int = 128
    block_k: int = 128
    bias: bool = False
    out_dtype: str = "bf16"
    library: str = ""
    l2_resident_fraction: float = 0.0  # of bytes_moved(), found in L2 at the start (see the module docstring)

    def __post_init__(self) -> None:
        libraries = SCALED_MM_LIBRARIES.get(self.scale)
        if libraries is None:
            raise ValueError(f"unknown scale {self.scale!r}; choose one of {', '.join(SCALED_MM_LIBRARIES)}")
        if not self.library:
            object.__setattr__(self, "library", libraries[0])
        elif self.library not in libraries:
            raise ValueError(f"no {self.scale}-scaled MM in library {self.library!r}; "
                             f"choose one of {', '.join(libraries)}")

    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def scale_count(self) -> int:
        if self.scale == "tensor":
            return 2
        k_blocks = -(-self.k // self.block_k)
        return self.m * k_blocks + -(-self.n // self.block_n) * k_blocks

    def bytes_moved(self) -> float:
        b = dtype_bytes(self.dtype)
        out = self.m * self.n * dtype_bytes(self.out_dtype)
        bias = self.n * dtype_bytes(self.out_dtype) if self.bias else 0
        return (self.m * self.k + self.k * self.n) * b + 4 * self.scale_count() + bias + out

    def shape(self) -> str:
        scale = "tensor" if self.scale == "tensor" else f"block {self.block_n}x{self.block_k}"
        return f"m={self.m} n={self.n} k={self.k} scale={scale} {self.library}" + (" +bias" if self.bias else "")


#: Engines whose dynamic FP8 quantisation kernels :class:`Quantize` models.
QUANTIZE_ENGINES = ("vllm", "sglang")


@dataclass(frozen=True, kw_only=True)
class Quantize(Kernel):
    """Dynamic FP8 quantisation of activations ahead of a :class:`ScaledMM`: ``rows`` x ``cols`` from ``in_dtype``
    to fp8 by ``engine``'s kernels; ``group=0`` for per-tensor weight scales, else one scale per ``group`` columns
    of each row.

    With per-tensor weight scales the engines scale activations differently. vLLM takes one scale for the whole
    tensor, which needs its abs-max before any element is converted, so it reads the input twice: an abs-max
    kernel, then the conversion (``dynamic_scaled_fp8_quant``). SGLang takes one scale per token
    (``apply_fp8_linear`` -> ``sgl_per_token_quant_fp8``; sgl-kernel's ``fp8_scaled_mm`` takes per-token scales),
    one kernel that reads each row once from DRAM. A per-group scale is one pass (``per_token_group_quant``)."""

    category: ClassVar[str] = "quant"
    dtype: str = "fp8"
    rows: int
    cols: int
    group: int = 0
    in_dtype: str = "bf16"
    engine: str = "vllm"
    l2_resident_fraction: float = 0.0  # of bytes_moved(), found in L2 at the start (see the module docstring)

    def __post_init__(self) -> None:
        if self.engine not in QUANTIZE_ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; choose one of {', '.join(QUANTIZE_ENGINES)}")

    @property
    def per_tensor(self) -> bool:
        """One scale for the whole tensor (vLLM's dynamic quantisation with per-tensor weights)."""
        return self.group == 0 and self.engine == "vllm"

    @property
    def input_reads(self) -> int:
        """How many times the kernels read the input: twice for a per-tensor scale (abs-max, then convert)."""
        return 2 if self.per_tensor else 1

    def flops(self) -> float:
        return 3.0 * self.rows * self.cols  # abs-max, scale, convert

    def bytes_moved(self) -> float:
        if self.per_tensor:
            scales = 1
        else:
            scales = self.rows * (1 if self.group == 0 else -(-self.cols // self.group))
        elems = self.rows * self.cols
        return elems * (self.input_reads * dtype_bytes(self.in_dtype) + dtype_bytes(self.dtype)) + 4 * scales

    def shape(self) -> str:
        scale = "per-tensor" if self.per_tensor else ("per-token" if self.group == 0 else f"group={self.group}")
        return f"{self.rows}x{self.cols} {scale} {self.engine}"


def _attended_pairs(query_len: int, kv_len: int, causal: bool, window: int = 0) -> int:
    """(query, key) pairs one request's attention scores; causal counts the triangle exactly.

    The ``query_len`` new tokens sit at the end of the ``kv_len`` keys, so query i (0-based) sees
    ``kv_len - query_len + i + 1`` keys, or at most ``window`` of them under a sliding window.
    """
    if not causal:
        return query_len * kv_len
    if not window:
        return query_len * (kv_len - query_len) + query_len * (query_len + 1) // 2
    first = kv_len - query_len + 1  # keys query 0 sees without a window
    unclipped = min(max(window - first + 1, 0), query_len)  # queries whose causal span fits the window
    return unclipped * first + unclipped * (unclipped - 1) // 2 + (query_len - unclipped) * window


class _KvLayout:
    """Key/value widths shared by the attention kernels (their fields ``head_dim``, ``v_head_dim`` with 0 meaning
    ``head_dim``, and ``kv_shared``: one cached latent read as both, multi-head latent attention)."""

    head_dim: int
    v_head_dim: int
    kv_shared: bool

    def _check_kv_layout(self) -> None:
        if self.kv_shared and self.v_head_dim > self.head_dim:
            raise ValueError("a value shared with its key cannot be wider than the key")

    @property
    def value_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def kv_elements_per_key(self) -> int:
        """Cached elements one key position holds per KV head: K and V, or the one shared latent."""
        return self.head_dim if self.kv_shared else self.head_dim + self.value_dim


@dataclass(frozen=True, kw_only=True)
class AttentionPrefill(_KvLayout, Kernel):
    """Variable-length attention over a batch whose queries are more than one token for some request.

    ``query_lens[i]`` new tokens of request i attend to ``kv_lens[i]`` keys (cached plus new, new included).
    ``kv_layout`` is ``paged`` (keys read from the paged KV cache, ``page_size`` tokens a page) or ``ragged``
    (keys taken from the contiguous new K/V of this step). ``backend`` names the engine's kernel library
    (``fa3``, ``fa2``, ``flashinfer``, ``trtllm``). ``window`` > 0 is a causal sliding window: each query sees at
    most ``window`` keys, itself included (FlashAttention's ``window_size=(window - 1, 0)``), and the kernel reads
    only the last ``query_len + window - 1`` keys of a request. ``v_head_dim`` > 0 is a value head narrower than
    the query/key head (MLA's prefill form: 192-wide Q and K, 128-wide V). ``kv_shared``: keys and values are one
    cached tensor, as in :class:`AttentionDecode` (MLA's absorbed form over the latent cache).
    """

    category: ClassVar[str] = "attn_prefill"
    query_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool = True
    kv_layout: str = "paged"
    page_size: int = 16
    backend: str = "fa3"
    l2_resident_fraction: float = 0.0  # of bytes_moved(), found in L2 at the start (see the module docstring)
    kv_dtype: str = "bf16"
    window: int = 0
    v_head_dim: int = 0  # 0: head_dim
    kv_shared: bool = False

    def __post_init__(self) -> None:
        if self.window and not self.causal:
            raise ValueError("a sliding window needs causal attention")
        self._check_kv_layout()


    def keys_read(self) -> tuple[int, ...]:
        """Keys each request's attention reads: all ``kv_lens``, or under a window the last ``q + window - 1``."""
        if not self.window:
            return self.kv_lens
        return tuple(min(kv, q + self.window - 1) for q, kv in zip(self.query_lens, self.kv_lens))

    def flops(self) -> float:
        pairs = sum(_attended_pairs(q, kv, self.causal, self.window) for q, kv in zip(self.query_lens, self.kv_lens))
        # QK^T and PV, two FLOPs per multiply-add each
        return 2.0 * self.num_heads * (self.head_dim + self.value_dim) * pairs

    def bytes_moved(self) -> float:
        tokens = sum(self.query_lens) * self.num_heads
        kv_elems = sum(self.keys_read()) * self.num_kv_heads * self.kv_elements_per_key
        q_out = tokens * (self.head_dim + self.value_dim)
        return q_out * dtype_bytes(self.dtype) + kv_elems * dtype_bytes(self.kv_dtype)

    def shape(self) -> str:
        window = f" window={self.window}" if self.window else ""
        dims = f"{self.head_dim}/{self.v_head_dim}" if self.v_head_dim else f"{self.head_dim}"
        return (
            f"{len(self.query_lens)} req q={sum(self.query_lens)} kv={sum(self.kv_lens)} "
            f"h={self.num_heads}/{self.num_kv_heads}x{dims} {self.kv_layout} {self.backend}{window}"
            + (" latent" if self.kv_shared else "")
        )


@dataclass(frozen=True, kw_only=True)
class AttentionDecode(_KvLayout, Kernel):
    """One new query token per request attending to ``kv_lens[i]`` keys (new token included) in the paged cache.

    ``kv_shared``: keys and values are one cached tensor, each value the first ``v_head_dim`` values of its key,
    read once: the absorbed decode of multi-head latent attention, an MQA (one KV head) over the 576-wide latent
    (512 compressed values and the 64-wide rotary key) whose output is the 512-wide latent (FlashMLA, CUTLASS MLA,
    FlashInfer/TRT-LLM-gen MLA, FA3 with a separate ``qv``)."""

    category: ClassVar[str] = "attn_decode"
    kv_lens: tuple[int, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int = 16
    backend: str = "fa3"
    l2_resident_fraction: float = 0.0  # of bytes_moved(), found in L2 at the start (see the module docstring)
    kv_dtype: str = "bf16"
    v_head_dim: int = 0  # 0: head_dim
    kv_shared: bool = False

    def __post_init__(self) -> None:
        self._check_kv_layout()


    def flops(self) -> float:
        return 2.0 * self.num_heads * (self.head_dim + self.value_dim) * sum(self.kv_lens)

    def bytes_moved(self) -> float:
        q_out = len(self.kv_lens) * self.num_heads * (self.head_dim + self.value_dim)
        kv_elems = sum(self.kv_lens) * self.num_kv_heads * self.kv_elements_per_key
        return q_out * dtype_bytes(self.dtype) + kv_elems * dtype_bytes(self.kv_dtype)

    def shape(self) -> str:
        dims = f"{self.head_dim}/{self.v_head_dim}" if self.v_head_dim else f"{self.head_dim}"
        return (
            f"{len(self.kv_lens)} req kv={sum(self.kv_lens)} "
            f"h={self.num_heads}/{self.num_kv_heads}x{dims} paged {self.backend}"
            + (" latent" if self.kv_shared else "")
        )


@dataclass(frozen=True, kw_only=True)
class RMSNorm(Kernel):
    """``y = x / rms(x) * w`` over ``rows`` vectors of ``dim`` (also the per-head Q/K norm of Qwen3)."""

    category: ClassVar[str] = "rmsnorm"
    rows: int
    dim: int

    def flops(self) -> float:
        return 4.0 * self.rows * self.dim  # square-accumulate, scale, weight

    def bytes_moved(self) -> float:
        return (2 * self.rows * self.dim + self.dim) * dtype_bytes(self.dtype)

    def shape(self) -> str:
        return f"{self.rows}x{self.dim}"


@dataclass(frozen=True, kw_only=True)
class AddRMSNorm(Kernel):
    """Fused ``residual += x; x = rmsnorm(residual) * w`` (vLLM/SGLang ``fused_add_rms_norm``), in place."""

    category: ClassVar[str] = "add_rmsnorm"
    rows: int
    dim: int

    def flops(self) -> float:
        return 5.0 * self.rows * self.dim

    def bytes_moved(self) -> float:
        return (4 * self.rows * self.dim + self.dim) * dtype_bytes(self.dtype)

    def shape(self) -> str:
        return f"{self.rows}x{self.dim}"


@dataclass(frozen=True, kw_only=True)
class SiluMul(Kernel):
    """``silu(gate) * up``: reads ``tokens`` x 2·``dim``, writes ``tokens`` x ``dim``."""

    category: ClassVar[str] = "silu_mul"
    tokens: int
    dim: int

    def flops(self) -> float:
        return 5.0 * self.tokens * self.dim  # negate-exp-add-divide (sigmoid), two multiplies; exp counted once

    def bytes_moved(self) -> float:
        return 3 * self.tokens * self.dim * dtype_bytes(self.dtype)

    def shape(self) -> str:
        return f"{self.tokens}x(2x{self.dim})"


@dataclass(frozen=True, kw_only=True)
class Rope(Kernel):
    """Rotary embedding applied in place to Q (``num_heads``) and K (``num_kv_heads``) of ``tokens`` tokens,
    with a cos/sin cache looked up by position (fp32, ``rotary_dim`` values per position)."""

    category: ClassVar[str] = "rope"
    tokens: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def flops(self) -> float:
        return 3.0 * self.tokens * (self.num_heads + self.num_kv_heads) * self.head_dim

    def bytes_moved(self) -> float:
        qk = 2 * self.tokens * (self.num_heads + self.num_kv_heads) * self.head_dim * dtype_bytes(self.dtype)
        return qk + self.tokens * (self.head_dim * 4 + 8)  # cos/sin row and int64 position per token

    def shape(self) -> str:
        return f"{self.tokens} tok h={self.num_heads}+{self.num_kv_heads}x{self.head_dim}"


@dataclass(frozen=True, kw_only=True)
class KvWrite(Kernel):
    """Scatter the new K and V of ``tokens`` tokens into the paged KV cache (vLLM ``reshape_and_cache_flash``,
    SGLang ``set_kv_buffer``). ``kv_shared``: one tensor per token instead of K and V (MLA's latent, vLLM
    ``concat_and_cache_mla``)."""

    category: ClassVar[str] = "kv_write"
    tokens: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: str = "bf16"
    kv_shared: bool = False

    def flops(self) -> float:
        return 0.0

    def bytes_moved(self) -> float:
        elems = (1 if self.kv_shared else 2) * self.tokens * self.num_kv_heads * self.head_dim
        return elems * (dtype_bytes(self.dtype) + dtype_bytes(self.kv_dtype)) + 8 * self.tokens  # + slot index

    def shape(self) -> str:
        return f"{self.tokens} tok kvh={self.num_kv_heads}x{self.head_dim}"


@dataclass(frozen=True, kw_only=True)
class Embedding(Kernel):
    """Token-embedding lookup of ``tokens`` ids in a (vocab-parallel) table of ``vocab_rows`` x ``hidden``."""

    category: ClassVar[str] = "embedding"
    tokens: int
    hidden: int
    vocab_rows: int

    def flops(self) -> float:
        return 0.0

    def bytes_moved(self) -> float:
        return 2 * self.tokens * self.hidden * dtype_bytes(self.dtype) + 8 * self.tokens

    def shape(self) -> str:
        return f"{self.tokens} tok x{self.hidden} of {self.vocab_rows} rows"


@dataclass(frozen=True, kw_only=True)
class RouterTopK(Kernel):
    """Softmax over ``num_experts`` router logits and top-``top_k`` selection (renormalised or not) per token.

    ``num_groups`` > 0: DeepSeek-V3's grouped selection (sigmoid scores plus a correction bias, each group scored by
    its best two, the top ``topk_groups`` groups kept, top-k within them; vLLM ``grouped_topk``), one more pass
    over the logits."""

    category: ClassVar[str] = "router_topk"
    dtype: str = "fp32"
    tokens: int
    num_experts: int
    top_k: int
    renormalize: bool
    num_groups: int = 0
    topk_groups: int = 0

    def flops(self) -> float:
        if self.num_groups:
            return 6.0 * self.tokens * self.num_experts
        return 4.0 * self.tokens * self.num_experts

    def bytes_moved(self) -> float:
        logits = self.tokens * self.num_experts * dtype_bytes(self.dtype)
        return logits + self.tokens * self.top_k * (4 + 4)  # fp32 weight and int32 id per choice

    def shape(self) -> str:
        groups = f" groups {self.topk_groups}/{self.num_groups}" if self.num_groups else ""
        return f"{self.tokens} tok E={self.num_experts} top{self.top_k}{groups}"


@dataclass(frozen=True, kw_only=True)
class FusedMoE(Kernel):
    """The routed experts of one MoE layer as the engines run them: token sort by expert (``moe_align_block_size``),
    a grouped GEMM for gate/up (``2·intermediate`` wide), SiLU&Mul, a grouped GEMM for down, and the weighted sum
    over the top-k choices (Triton ``fused_moe``).

    ``intermediate`` is this GPU's slice (TP shards every expert's intermediate dimension). ``expert_tokens[e]`` is
    how many (token, choice) pairs expert e receives; it sums to ``tokens`` x ``top_k`` and is the routing
    distribution. Experts that receive nothing are not read.

    ``weight_dtype`` (empty: ``dtype``) is how the expert weights are stored when it differs from the dtype the
    Tensor cores multiply in: ``mxfp4`` experts (gpt-oss) run weight-only, each tile dequantised to BF16 in the
    kernel and multiplied in BF16 (vLLM's MXFP4 MoE methods on Ampere and Hopper, and its default MXFP4 x BF16 one
    on Blackwell); ``nvfp4`` experts multiply activations quantised to NVFP4 (``dtype`` ``fp4``) on FP4 Tensor
    cores (:class:`TrtllmMoE`).
    """

    category: ClassVar[str] = "moe"
    tokens: int
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int
    expert_tokens: tuple[int, ...]
    scale: str = ""  # "", or the ScaledMM granularity when dtype is fp8
    weight_dtype: str = ""
    weight_group: int = 0  # INT4 weights: one BF16 scale per this many (0: 128, INT4_BITS_PER_WEIGHT)

    def routed_pairs(self) -> int:
        return sum(self.expert_tokens)

    def active_experts(self) -> int:
        return sum(1 for n in self.expert_tokens if n > 0)

    @property
    def stored_dtype(self) -> str:
        """The expert weights' storage dtype."""
        return self.weight_dtype or self.dtype

    @property
    def weight_element_bytes(self) -> float:
        """Bytes one expert weight takes, its scales' share included."""
        if self.stored_dtype == "int4" and self.weight_group:
            return (4 + 16 / self.weight_group) / 8
        return dtype_bytes(self.stored_dtype)

    def flops(self) -> float:
        return 6.0 * self.routed_pairs() * self.hidden * self.intermediate

    def bytes_moved(self) -> float:
        weights = self.active_experts() * 3 * self.hidden * self.intermediate * self.weight_element_bytes
        act = 2 * self.tokens * self.hidden * 2  # bf16 hidden in and out
        routed = self.routed_pairs() * 3 * self.intermediate * 2  # gate/up out (2I) and SiLU&Mul out (I), bf16
        return weights + act + routed

    def shape(self) -> str:
        weights = f" w={self.weight_dtype}" if self.weight_dtype else ""
        weights += f"/g{self.weight_group}" if self.weight_group else ""
        return (
            f"{self.tokens} tok E={self.num_experts} top{self.top_k} h={self.hidden} i={self.intermediate} "
            f"active={self.active_experts()}{weights}"
        )


@dataclass(frozen=True, kw_only=True)
class MarlinMoE(FusedMoE):
    """The routed experts of one MoE layer through vLLM's Marlin MoE (``fused_marlin_moe.py``): 4-bit weights
    (``weight_dtype`` ``mxfp4`` or ``int4``) dequantised to BF16 inside a GEMM built for few rows, in
    ``moe_block_size``-row blocks per expert, each block re-reading and re-dequantising its expert's weights.

    vLLM runs MXFP4 experts this way on GPUs below compute capability 9.0 and wherever
    ``VLLM_MXFP4_USE_MARLIN=1`` (``vllm/model_executor/layers/quantization/mxfp4.py``, ``get_mxfp4_backend``).
    Its own category: its efficiency is learnt from measured Marlin rows, not the Triton path's.

    ``global_experts`` (0: ``num_experts``) is how many experts the router chooses among. Under expert
    parallelism a GPU holds ``num_experts`` of them, but ``fused_marlin_moe`` still sorts the ``tokens x top_k``
    choices over all of them (``moe_align_block_size(topk_ids, block_size_m, global_num_experts, expert_map)``)
    and zeroes its output before the down GEMM (``output.zero_()`` when ``expert_map`` is set).
    """

    category: ClassVar[str] = "moe_marlin"
    global_experts: int = 0

    def __post_init__(self) -> None:
        if self.weight_dtype not in ("mxfp4", "int4"):
            raise ValueError(f"Marlin MoE runs 4-bit weights (mxfp4 or int4), not {self.weight_dtype or self.dtype!r}")
        if self.global_experts and self.global_experts < self.num_experts:
            raise ValueError(f"global_experts ({self.global_experts}) below this GPU's {self.num_experts} experts")

    def router_experts(self) -> int:
        """The experts the router chooses among: ``global_experts``, else this GPU's ``num_experts``."""
        return self.global_experts or self.num_experts

    def shape(self) -> str:
        ep = f" of {self.global_experts}" if self.global_experts and self.global_experts != self.num_experts else ""
        return f"{super().shape()}{ep} marlin"


@dataclass(frozen=True, kw_only=True)
class TrtllmMoE(FusedMoE):
    """The routed experts of one MoE layer through FlashInfer's TensorRT-LLM fused MoE
    (``trtllm_fp8_block_scale_moe``, its BF16 sibling and ``trtllm_fp4_block_scale_moe``), which SGLang runs on
    Blackwell (compute capability 10.x) for the DeepSeek, GLM, Kimi and Qwen3-MoE/Qwen3.5 families
    (``--moe-runner-backend flashinfer_trtllm``, the default 0.5.9 and 0.5.10 pick for them in
    ``srt/server_args.py``), and both engines run on Blackwell for MXFP4 experts (gpt-oss: ``weight_dtype`` mxfp4,
    activations BF16, or FP8 for vLLM's MXFP4 x MXFP8 path) and NVFP4 experts (``weight_dtype`` nvfp4, activations
    quantised to NVFP4: ``dtype`` fp4). One launch sorts, runs both grouped GEMMs with its own tiles and sums the
    top-k choices; servesim lays out its work as the Triton path's grouped GEMMs and learns the kernel's efficiency
    from its measured rows (its own category)."""

    category: ClassVar[str] = "moe_trtllm"

    def __post_init__(self) -> None:
        if self.weight_dtype not in ("", "mxfp4", "nvfp4"):
            raise ValueError(f"the TRT-LLM fused MoE is modelled for FP8, BF16, MXFP4 and NVFP4 experts, not "
                             f"{self.weight_dtype!r}")
        if (self.weight_dtype == "nvfp4") != (self.dtype == "fp4"):
            raise ValueError("NVFP4 experts multiply NVFP4 activations: weight_dtype nvfp4 goes with dtype fp4")

    def shape(self) -> str:
        return f"{super().shape()} trtllm"


@dataclass(frozen=True, kw_only=True)
class Sampling(Kernel):
    """Turning ``rows`` rows of ``vocab`` logits into tokens: temperature, softmax, top-k/top-p, draw (fp32)."""

    category: ClassVar[str] = "sampling"
    dtype: str = "fp32"
    rows: int
    vocab: int

    def flops(self) -> float:
        return 5.0 * self.rows * self.vocab

    def bytes_moved(self) -> float:
        return self.rows * self.vocab * dtype_bytes(self.dtype) + 8 * self.rows

    def shape(self) -> str:
        return f"{self.rows}x{self.vocab}"


@dataclass(frozen=True, kw_only=True)
class IndexLogitsDecode(AttentionDecode):
    """DSA's indexer logits for decoding requests (DeepGEMM ``fp8_paged_mqa_logits``): each request's one query of
    ``num_heads`` FP8 heads scores each of its ``kv_lens`` cached FP8 keys (one key head, ``head_dim`` values and an
    FP32 scale each; 64-token pages), each head's ReLU'd dot product weighted by its gate and summed into one FP32
    logit per key. An MQA without softmax or values: QK only."""

    category: ClassVar[str] = "index_logits"

    def flops(self) -> float:
        return 2.0 * self.num_heads * self.head_dim * sum(self.kv_lens)

    def bytes_moved(self) -> float:
        keys = sum(self.kv_lens)
        queries = len(self.kv_lens) * self.num_heads * (self.head_dim + 4)  # FP8 query and its FP32 gate per head
        return queries + keys * (self.head_dim + 4) + keys * 4  # keys with their scales, FP32 logits out


@dataclass(frozen=True, kw_only=True)
class IndexLogitsPrefill(AttentionPrefill):
    """DSA's indexer logits for prompt chunks (DeepGEMM ``fp8_mqa_logits`` over the requests' gathered FP8 keys):
    every new token's ``num_heads`` FP8 heads score each key it sees causally, as :class:`IndexLogitsDecode`."""

    category: ClassVar[str] = "index_logits"

    def flops(self) -> float:
        pairs = sum(_attended_pairs(q, kv, self.causal, 0) for q, kv in zip(self.query_lens, self.kv_lens))
        return 2.0 * self.num_heads * self.head_dim * pairs

    def bytes_moved(self) -> float:
        pairs = sum(_attended_pairs(q, kv, self.causal, 0) for q, kv in zip(self.query_lens, self.kv_lens))
        queries = sum(self.query_lens) * self.num_heads * (self.head_dim + 4)
        return queries + sum(self.kv_lens) * (self.head_dim + 4) + pairs * 4


@dataclass(frozen=True, kw_only=True)
class IndexTopK(Kernel):
    """DeepSeek Sparse Attention's top-k: each of ``rows`` queries keeps the ``top_k`` highest of its FP32 indexer
    logits (``keys`` of them over all queries) and writes their int32 token positions (SGLang
    ``fast_topk_transform_fused``, sgl-kernel ``csrc/elementwise/topk.cu``; vLLM ``top_k_per_row``): a radix
    select, a few passes over each row's logits."""

    category: ClassVar[str] = "index_topk"
    dtype: str = "fp32"
    rows: int
    keys: int  # logits over all rows
    top_k: int

    def flops(self) -> float:
        return 4.0 * self.keys  # histogram and compare passes over every logit

    def bytes_moved(self) -> float:
        return self.keys * dtype_bytes(self.dtype) + self.rows * self.top_k * 4

    def shape(self) -> str:
        return f"{self.rows} rows {self.keys} logits top{self.top_k}"


#: Tokens per chunk of the chunked gated delta rule (fla ``chunk_gated_delta_rule``: ``BT = 64``).
GDN_CHUNK_TOKENS = 64


@dataclass(frozen=True, kw_only=True)
class _GatedDeltaRule:
    """Gated DeltaNet's recurrence over ``tokens`` new tokens of ``requests`` requests on one GPU: per value head a
    ``key_head_dim x value_head_dim`` state S, decayed by g, corrected by the delta rule with strength beta, read
    by the query (``o = q S``). Query and key heads are shared by ``value_heads / key_heads`` value heads. The gate
    and beta (fused_gdn_gating) are read as FP32, and each request's state is read and written once in
    ``state_dtype``."""

    tokens: int
    requests: int
    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    state_dtype: str = "fp32"
    l2_resident_fraction: float = 0.0  # of bytes_moved(), found in L2 at the start (see the module docstring)

    def _io_bytes(self) -> float:
        b = dtype_bytes(self.dtype)
        qk = 2 * self.tokens * self.key_heads * self.key_head_dim * b
        vo = 2 * self.tokens * self.value_heads * self.value_head_dim * b
        return qk + vo + 2 * 4 * self.tokens * self.value_heads

    def _state_bytes(self) -> float:
        return self.value_heads * self.key_head_dim * self.value_head_dim * dtype_bytes(self.state_dtype)

    def shape(self) -> str:
        return (f"{self.tokens} tok {self.requests} req hk={self.key_heads}x{self.key_head_dim} "
                f"hv={self.value_heads}x{self.value_head_dim}")


@dataclass(frozen=True, kw_only=True)
class GatedDeltaRuleChunk(_GatedDeltaRule, Kernel):
    """The chunked form prompt chunks run (fla ``chunk_gated_delta_rule``, in vLLM and SGLang): chunks of
    :data:`GDN_CHUNK_TOKENS` tokens (``chunks``, each request's counted apart), in which a masked C x C attention
    and the WY representation (K K^T, its triangular inverse, W and U) replace the token-by-token updates, and one
    state update per chunk carries S forward; each chunk's state is written out in 16 bits and read back by the
    output pass. On the Tensor cores. Per value head and chunk: 6·C·dk·dv + C²·(6·dk + 4·dv) FLOPs."""

    category: ClassVar[str] = "gdn_prefill"
    chunks: int

    def flops(self) -> float:
        c, dk, dv = GDN_CHUNK_TOKENS, self.key_head_dim, self.value_head_dim
        return float(self.chunks * self.value_heads * (6 * c * dk * dv + c * c * (6 * dk + 4 * dv)))

    def bytes_moved(self) -> float:
        b = dtype_bytes(self.dtype)
        wu = 2 * self.tokens * self.value_heads * (self.key_head_dim + self.value_head_dim) * b  # written, read
        chunk_states = 2 * self.chunks * self.value_heads * self.key_head_dim * self.value_head_dim * b
        return self._io_bytes() + wu + chunk_states + 2 * self.requests * self._state_bytes()


@dataclass(frozen=True, kw_only=True)
class GatedDeltaRuleDecode(_GatedDeltaRule, Kernel):
    """The recurrent form decoding requests run, one token each (vLLM ``fused_recurrent_gated_delta_rule``,
    SGLang ``fused_sigmoid_gating_delta_rule_update``): each request's state read, updated and written back, about
    seven FLOPs per state element (decay, k^T S, the rank-1 update, q S), on the FMA pipe."""

    category: ClassVar[str] = "gdn_decode"

    def flops(self) -> float:
        return 7.0 * self.tokens * self.value_heads * self.key_head_dim * self.value_head_dim

    def bytes_moved(self) -> float:
        return self._io_bytes() + 2 * self.tokens * self._state_bytes()


@dataclass(frozen=True, kw_only=True)
class CausalConv1d(Kernel):
    """Gated DeltaNet's depthwise causal convolution (width ``kernel_width``) and SiLU over ``channels`` channels
    of ``tokens`` new tokens of ``requests`` requests (vLLM/SGLang ``causal_conv1d_fn`` for prompt chunks,
    ``causal_conv1d_update`` for decodes): each request's last ``kernel_width - 1`` inputs read from and written
    back to its conv state."""

    category: ClassVar[str] = "conv1d"
    tokens: int
    requests: int
    channels: int
    kernel_width: int

    def flops(self) -> float:
        return float(self.tokens * self.channels * (2 * self.kernel_width + 5))

    def bytes_moved(self) -> float:
        b = dtype_bytes(self.dtype)
        state = 2 * self.requests * self.channels * (self.kernel_width - 1) * b
        return 2 * self.tokens * self.channels * b + state + self.channels * self.kernel_width * b

    def shape(self) -> str:
        return f"{self.tokens} tok {self.requests} req x{self.channels} w={self.kernel_width}"


@dataclass(frozen=True, kw_only=True)
class Collective:
    """A collective among ``group_size`` GPUs.

    ``bytes`` is the size of the tensor each rank holds when the operation completes: the reduced buffer of an
    all-reduce, the gathered output of an all-gather, the tensor a send/recv moves (nccl-tests' "size").
    ``implementation`` is ``custom_ar`` (vLLM/SGLang one-shot/two-shot custom all-reduce over NVLink/P2P) or
    ``nccl``.
    """

    op: str
    bytes: int
    group_size: int
    implementation: str = "nccl"
    dtype: str = "bf16"
    name: str = field(default="", compare=False)

    category: ClassVar[str] = "collective"

    def shape(self) -> str:
        return f"{self.bytes / 1e6:.2f} MB over {self.group_size} GPUs, {self.implementation}"


#: Every kernel type, by category.
KERNEL_TYPES: dict[str, type[Kernel]] = {
    cls.category: cls
    for cls in (
        Gemm,
        ScaledMM,
        Quantize,
        AttentionPrefill,
        AttentionDecode,
        RMSNorm,
        AddRMSNorm,
        SiluMul,
        Rope,
        KvWrite,
        Embedding,
        RouterTopK,
        FusedMoE,
        Sampling,
    )
}
#: DeepSeek Sparse Attention's kernels without a kernel type of their own elsewhere (DeepSeek-V3.2, GLM-5), by
#: category; tested in tests/test_models_dsa.py.
DSA_KERNEL_TYPES: dict[str, type[Kernel]] = {IndexTopK.category: IndexTopK, "index_logits (decode)": IndexLogitsDecode,
                                             "index_logits (prefill)": IndexLogitsPrefill}
#: The linear-attention kernels (Qwen3-Next, Qwen3.5), by category; their bounds are tested in
#: tests/test_models_hybrid.py.
LINEAR_ATTENTION_KERNEL_TYPES: dict[str, type[Kernel]] = {
    cls.category: cls for cls in (GatedDeltaRuleChunk, GatedDeltaRuleDecode, CausalConv1d)
}
