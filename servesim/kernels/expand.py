"""Expanding one engine step into the kernels one GPU of one pipeline stage launches, with its collectives.

The layer bodies follow the engines' model code (vLLM ``model_executor/models/{llama,qwen2,qwen3,qwen3_moe,
mixtral,minimax_m2,gpt_oss,deepseek_v2}.py``, SGLang ``srt/models/...``), which is the same sequence in both engines
for these architectures; the engines differ in the attention kernels, CUDA-graph padding and where the LM head runs
(``engines.py``). docs/kernels.md lists every choice with the file it follows; docs/models.md what each model
family adds.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from typing import Union

from servesim.errors import ServesimError
from servesim.hardware.spec import GpuSpec
from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.kernels.engines import EngineKernels, GpuTraits, GraphPlan, get_engine_kernels, gpu_traits
from servesim.kernels.types import (
    FOUR_BIT_EXPERT_FORMATS,
    GDN_CHUNK_TOKENS,
    AddRMSNorm,
    AttentionDecode,
    AttentionPrefill,
    CausalConv1d,
    Collective,
    Embedding,
    Fp4Linear,
    FusedMoE,
    GatedDeltaRuleChunk,
    GatedDeltaRuleDecode,
    Gemm,
    IndexLogitsDecode,
    IndexLogitsPrefill,
    IndexTopK,
    Kernel,
    KvWrite,
    MarlinMoE,
    Quantize,
    RMSNorm,
    Rope,
    RouterTopK,
    Sampling,
    ScaledMM,
    SiluMul,
    TrtllmMoE,
    dtype_bytes,
)
from servesim.models.config import ModelConfig
from servesim.models.memory import NVFP4_LINEAR_ROLES, linear_dtype
from servesim.models.parallel import Parallelism, padded_vocab, stage_layers, validate_parallelism

#: Weight formats: ``bf16``/``fp16`` unquantised; ``fp8`` W8A8 with per-tensor scales (vLLM/SGLang ``fp8``
#: quantisation, dynamic activation scale); ``fp8-block`` W8A8 with 128x128 weight blocks and 1x128 activation
#: groups (Qwen3-FP8 / DeepSeek-style checkpoints); ``mxfp4`` a checkpoint whose MoE experts are MXFP4 and the rest
#: BF16 (gpt-oss), the experts run weight-only (:class:`servesim.kernels.types.FusedMoE`); ``int4`` a checkpoint
#: whose routed experts are INT4 with 16-bit activations and the rest BF16 (Kimi-K2.5's compressed-tensors
#: ``pack-quantized``), the experts run on Marlin MoE (:class:`servesim.kernels.types.MarlinMoE`); ``nvfp4`` a
#: ModelOpt checkpoint (NVIDIA's NVFP4 releases) whose routed experts and the linears its family's checkpoint
#: quantises (servesim.models.memory.NVFP4_LINEAR_ROLES) are NVFP4, the rest BF16: the experts run W4A4 on
#: FlashInfer's TRT-LLM FP4 MoE (:class:`servesim.kernels.types.TrtllmMoE`), the linears as
#: :class:`servesim.kernels.types.Fp4Linear`.
WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "fp8-block", "mxfp4", "int4", "nvfp4")
#: The FP8 weight formats and the scale granularity of their linears.
_FP8_SCALES = {"fp8": "tensor", "fp8-block": "block"}
#: KV-cache formats, as the engines' ``--kv-cache-dtype``: ``auto`` stores K and V in the activation dtype, ``fp8``
#: in FP8 E4M3 with per-tensor scales (the attention kernels read FP8 pages and the cache write quantises).
KV_CACHE_DTYPES = ("auto", "fp8")

Op = Union[Kernel, Collective]


@dataclass(frozen=True)
class StepOp:
    """One entry of a step's sequence: the model layer it belongs to (None outside the layers) and the op."""

    layer: int | None
    op: Op


@dataclass(frozen=True)
class OpRun:
    """Ops that run once in each layer of ``layers`` in turn, or once outside the layers (``layers`` None).

    A step is a handful of runs (stage input, layer 0, the repeated body, stage output), so consumers that only
    need totals, such as step times, work on the few distinct ops instead of every layer's copy.
    """

    layers: range | None
    ops: tuple[Op, ...]

    @property
    def repeats(self) -> int:
        return 1 if self.layers is None else len(self.layers)


@dataclass(frozen=True)
class StepKernels:
    """The ordered kernels and collectives of one engine step on one GPU of one pipeline stage."""

    engine: str
    engine_version: str
    model: str
    tp: int
    pp: int
    stage: int
    dtype: str
    first_layer: int
    end_layer: int  # exclusive
    attention_backend: str
    graph_mode: str  # full | piecewise | none
    padded_tokens: int  # tokens the graphed kernels see (the batch's tokens when eager)
    runs: tuple[OpRun, ...]

    @property
    def in_cuda_graph(self) -> bool:
        return self.graph_mode != "none"

    @functools.cached_property
    def ops(self) -> tuple[StepOp, ...]:
        """Every op in launch order, tagged with its layer."""
        return tuple(
            StepOp(layer, op)
            for run in self.runs
            for layer in (run.layers if run.layers is not None else (None,))
            for op in run.ops
        )

    @functools.cached_property
    def op_counts(self) -> tuple[tuple[Op, int], ...]:
        """Each distinct op of the step with the number of times it runs, in first-launch order."""
        counts: dict[Op, int] = {}
        for run in self.runs:
            for op in run.ops:
                counts[op] = counts.get(op, 0) + run.repeats
        return tuple(counts.items())

    @property
    def kernels(self) -> tuple[StepOp, ...]:
        return tuple(s for s in self.ops if isinstance(s.op, Kernel))

    @property
    def collectives(self) -> tuple[StepOp, ...]:
        return tuple(s for s in self.ops if isinstance(s.op, Collective))

    @functools.cached_property
    def flops(self) -> float:
        return float(sum(op.flops() * n for op, n in self.op_counts if isinstance(op, Kernel)))

    @functools.cached_property
    def bytes_moved(self) -> float:
        return float(sum(op.bytes_moved() * n for op, n in self.op_counts if isinstance(op, Kernel)))

    @functools.cached_property
    def collective_bytes(self) -> float:
        return float(sum(op.bytes * n for op, n in self.op_counts if isinstance(op, Collective)))

    def layer_ops(self, layer: int) -> tuple[Op, ...]:
        for run in self.runs:
            if run.layers is not None and layer in run.layers:
                return run.ops
        return ()

    def layer_runs(self) -> list[tuple[int, int, tuple[Op, ...]]]:
        """Consecutive layers with identical sequences as ``(first, last, ops)``, e.g. ``(1, 79, ...)``."""
        runs: list[tuple[int, int, tuple[Op, ...]]] = []
        for layer in range(self.first_layer, self.end_layer):
            ops = self.layer_ops(layer)
            if runs and runs[-1][2] == ops and _names(runs[-1][2]) == _names(ops):
                runs[-1] = (runs[-1][0], layer, ops)
            else:
                runs.append((layer, layer, ops))
        return runs


def _names(ops: tuple[Op, ...]) -> tuple[str, ...]:
    return tuple(op.name for op in ops)


def check_parallelism(model: ModelConfig, tp: int, pp: int, stage: int, ep: int = 1, dp: int = 1) -> None:
    """Raise a ServesimError for a TP/PP/EP/DP layout the engines refuse or a stage outside it."""
    validate_parallelism(model, Parallelism(tp, pp, ep, dp))
    if not 0 <= stage < pp:
        raise ServesimError(f"--stage {stage} is outside 0..{pp - 1} for pp={pp}")


#: The role of each linear layer the expansion names (servesim.models.memory.linear_dtype); other linears (MLA's
#: latent projections, the indexer's, linear attention's) are ``other``.
_LINEAR_ROLES = {"qkv_proj": "qkv_proj", "o_proj": "o_proj", "gate_up_proj": "dense_mlp", "down_proj": "dense_mlp",
                 "shared_experts.gate_up_proj": "shared_experts", "shared_experts.down_proj": "shared_experts"}


@dataclass(frozen=True)
class _Ctx:
    """Everything one layer's expansion needs, derived once per step."""

    engine: EngineKernels
    model: ModelConfig
    gpu: GpuTraits
    batch: BatchSpec
    tp: int  # the GPUs attention and the dense layers are split over (one attention data-parallel rank's)
    weights: str
    act: str  # activation dtype
    kv: str  # KV-cache dtype
    tokens: int  # padded tokens the layer's dense kernels see
    backend: str
    heads: int  # per GPU
    kv_heads: int  # per GPU (replicated when tp > kv heads)
    mxfp4_moe: str = "triton"  # the MoE kernel MXFP4 experts run on (MXFP4_MOE_BACKENDS but auto)
    ep: int = 1  # the GPUs of the TP group the routed experts are split over
    trtllm_moe: bool = False  # the routed experts run on FlashInfer's TRT-LLM fused MoE
    dp: int = 1  # attention data-parallel ranks joining in the MoE layers (the TP group is tp * dp GPUs)

    @property
    def moe_gpus(self) -> int:
        """The GPUs a MoE layer spans: the whole TP group."""
        return self.tp * self.dp

    def all_reduce(self, name: str, width: int | None = None, dtype: str | None = None) -> list[Collective]:
        """The TP all-reduce of ``width`` values per token in ``dtype`` (default: the hidden states)."""
        if self.tp == 1:
            return []
        dtype = dtype or self.act
        nbytes = int(self.tokens * (width or self.model.hidden_size) * dtype_bytes(dtype))
        impl = self.engine.all_reduce_impl(nbytes, self.gpu)
        collective = Collective(
            op="all_reduce", bytes=nbytes, group_size=self.tp, implementation=impl, dtype=dtype, name=name
        )
        return [collective]

    def linear(self, name: str, n: int, k: int, bias: bool = False, rows: int | None = None) -> list[Kernel]:
        """A (column- or row-parallel) linear layer over ``rows`` tokens (default: the step's padded tokens): one
        GEMM, an NVFP4 linear where the checkpoint quantises its role, or dynamic FP8 quantisation then a scaled
        MM."""
        m = self.tokens if rows is None else rows
        if self.weights == "nvfp4" and linear_dtype(self.model, "nvfp4", _LINEAR_ROLES.get(name, "other")) == "nvfp4":
            return [Fp4Linear(m=m, n=n, k=k, bias=bias, out_dtype=self.act, name=name)]
        scale = _FP8_SCALES.get(self.weights)
        if scale is None:
            return [Gemm(m=m, n=n, k=k, bias=bias, dtype=self.act, out_dtype=self.act, name=name)]
        block = scale == "block"
        quant = Quantize(rows=m, cols=k, group=128 if block else 0, in_dtype=self.act,
                         engine=self.engine.name, name=f"{name}.quant")
        mm = ScaledMM(
            m=m, n=n, k=k, scale=scale, bias=bias, out_dtype=self.act,
            library="" if block else self.engine.fp8_tensor_library, name=name,
        )
        return [quant, mm]


def windowed_lengths(query_lens: tuple[int, ...], kv_lens: tuple[int, ...], window: int) -> tuple[tuple[int, ...], int]:
    """The keys a sliding-window layer's attention reads, and the window its prefill kernel needs: each request's
    last ``query_len + window - 1`` keys (no query sees an earlier one), and ``window``, or 0 when no query's causal
    span is longer than it, the kernel then being a full-attention one over those keys. Without a window
    (``window`` 0), the lengths as they are. A decoding request reads at most ``window`` keys."""
    if not window:
        return kv_lens, 0
    read = tuple(min(kv, q + window - 1) for q, kv in zip(query_lens, kv_lens))
    return read, window if max(read) > window else 0


def local_attention_batches(query_lens: tuple[int, ...], kv_lens: tuple[int, ...],
                            chunk: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The requests a chunked-local-attention layer's kernel sees (vLLM ``make_local_attention_virtual_batches``):
    each request's new tokens split where the sequence crosses a multiple of ``chunk``, each piece a request of its
    own whose keys start at its chunk's first token. A decode stays one request, of ``(context - 1) % chunk + 1``
    keys; without a chunk (0), the lengths as they are."""
    if not chunk:
        return query_lens, kv_lens
    queries: list[int] = []
    keys: list[int] = []
    for q, kv in zip(query_lens, kv_lens):
        start = kv - q
        while start < kv:
            chunk_start = start - start % chunk
            end = min(kv, chunk_start + chunk)
            queries.append(end - start)
            keys.append(end - chunk_start)
            start = end
    return tuple(queries), tuple(keys)


def _attention(ctx: _Ctx, window: int = 0, chunk: int = 0) -> list[Kernel]:
    """The attention kernels of one layer for the engine's backend (see EngineKernels's flags); ``window`` > 0 for
    a sliding-window layer, ``chunk`` > 0 for a chunked-local-attention one (:func:`local_attention_batches`).
    gpt-oss's attention sinks (one learned logit per head added to each softmax's denominator) cost one term per
    query row and head, and are left out."""
    batch, model = ctx.batch, ctx.model
    query_lens, kv_lens = local_attention_batches(batch.query_lens, batch.kv_lens, chunk)
    kv_lens, window = windowed_lengths(query_lens, kv_lens, window)
    decodes = len(batch.decodes)  # first, one request each whatever the chunk
    common = dict(
        num_heads=ctx.heads,
        num_kv_heads=ctx.kv_heads,
        head_dim=model.head_dim,
        page_size=ctx.engine.page_size(ctx.backend),
        backend=ctx.backend,
        dtype=ctx.act,
        kv_dtype=ctx.kv,
    )
    if batch.is_decode_only:
        return [AttentionDecode(kv_lens=kv_lens, name="attn", **common)]
    if ctx.backend in ctx.engine.splits_mixed_attention and batch.decodes:
        prefill_q, prefill_kv = query_lens[decodes:], kv_lens[decodes:]
        return [
            AttentionDecode(kv_lens=kv_lens[:decodes], name="attn.decode", **common),
            AttentionPrefill(query_lens=prefill_q, kv_lens=prefill_kv, window=window, name="attn.prefill", **common),
        ]
    # A sliding window longer than a query's span stays in one paged kernel (SGLang runs gpt-oss with Triton
    # attention where its FlashInfer default would split off the cached prefix; docs/models.md).
    if ctx.backend in ctx.engine.ragged_prefix_split and not window:
        q = query_lens
        cached = [(ql, kv - ql) for ql, kv in zip(q, kv_lens) if kv > ql]
        ragged = AttentionPrefill(query_lens=q, kv_lens=q, kv_layout="ragged", name="attn.ragged", **common)
        kernels: list[Kernel] = [ragged]
        if cached:
            kernels.append(
                AttentionPrefill(
                    query_lens=tuple(c[0] for c in cached),
                    kv_lens=tuple(c[1] for c in cached),
                    causal=False,
                    name="attn.prefix",
                    **common,
                )
            )
        return kernels
    return [AttentionPrefill(query_lens=query_lens, kv_lens=kv_lens, window=window, name="attn", **common)]


def balanced_routing(pairs: int, experts: int) -> tuple[int, ...]:
    """(token, choice) pairs per expert under perfectly balanced routing."""
    base, extra = divmod(pairs, experts)
    return tuple(base + (1 if e < extra else 0) for e in range(experts))


def reached_experts(tokens: int, top_k: int, experts: int, ep: int = 1) -> int:
    """How many of one GPU's ``experts / ep`` experts a step's ``tokens`` reach when each picks ``top_k`` distinct
    ones of all ``experts`` on its own, every expert alike: the expected ``E·(1 − (1 − k/E)^tokens)`` without expert
    parallelism; with it, the busiest of the ``ep`` GPUs (:func:`busiest_rank`), whose layer the others wait for at
    the all-reduce. Rounded, at least one.

    A step's tokens come from unrelated requests, so 32 tokens routed top-4 over 128 experts reach about 82 of
    them, not all 128 as spreading the pairs evenly would: an MoE layer at decode sizes reads fewer expert weights
    than balanced routing says. Prefill-sized batches reach every expert either way."""
    local = experts // ep
    p = 1.0 - (1.0 - top_k / experts) ** tokens
    reached = busiest_rank(local * p, local * p * (1.0 - p), ep)
    return min(local, local_pairs(tokens, top_k, experts, ep), max(-(-top_k // ep), round(reached)))


def local_pairs(tokens: int, top_k: int, experts: int, ep: int) -> int:
    """The (token, choice) pairs the busiest of ``ep`` GPUs receives when the experts are split over them (every GPU
    sees every token; the choices of other GPUs' experts are masked out of its sort and GEMMs). A token's ``top_k``
    distinct choices put a hypergeometric count on each GPU (mean ``k/ep``); summed over the tokens and taken at
    the busiest GPU (:func:`busiest_rank`), rounded up; all ``tokens × top_k`` without expert parallelism."""
    per_token_var = top_k / ep * (1.0 - 1.0 / ep) * (experts - top_k) / max(experts - 1, 1)
    busiest = busiest_rank(tokens * top_k / ep, tokens * per_token_var, ep)
    return min(tokens * top_k, math.ceil(busiest - 1e-9))


def busiest_rank(mean: float, variance: float, ranks: int) -> float:
    """The expected largest of ``ranks`` independent loads of this mean and variance, by the normal approximation
    with Blom's plotting position for the maximum's quantile (``Φ⁻¹((n − 0.375) / (n + 0.25))``); the mean itself for
    one rank."""
    if ranks == 1:
        return mean
    quantile = statistics.NormalDist().inv_cdf((ranks - 0.375) / (ranks + 0.25))
    return mean + quantile * math.sqrt(max(variance, 0.0))


def _mlp(ctx: _Ctx, layer: int) -> list[Op]:
    """The layer's MLP: dense, or routed experts beside shared ones. With attention data parallelism the ranks
    gather their tokens for the experts (:func:`_dp_moe_collectives`); the dense and shared MLPs run on the rank's
    own tokens over its attention GPUs (vLLM) or on the gathered ones over the whole group (SGLang,
    ``EngineKernels.dp_mlp_over_group``)."""
    model = ctx.model
    gathers = model.is_moe_layer(layer) or ctx.engine.dp_mlp_over_group
    gather, scatter = _dp_moe_collectives(ctx) if gathers else ([], [])
    # every rank's tokens, as many as this one's (docs/parallelism.md)
    t = ctx.tokens * ctx.dp if gather else ctx.tokens
    # The dense and shared MLPs' GPUs and tokens: the gathered ones where they run over the whole group.
    over_group = bool(gather) and ctx.engine.dp_mlp_over_group
    mlp_tp, mlp_t = (ctx.moe_gpus, t) if over_group else (ctx.tp, ctx.tokens)
    if not model.is_moe_layer(layer):
        inter = model.intermediate_size // mlp_tp
        return [
            *gather,
            *ctx.linear("gate_up_proj", n=2 * inter, k=model.hidden_size, rows=mlp_t),
            SiluMul(tokens=mlp_t, dim=inter, dtype=ctx.act, name="act_fn"),
            *ctx.linear("down_proj", n=model.hidden_size, k=inter, rows=mlp_t),
            *(scatter or ctx.all_reduce("mlp.all_reduce")),
        ]
    experts, top_k = model.num_experts, model.num_experts_per_tok
    reached = reached_experts(t, top_k, experts, ctx.ep)
    marlin = ctx.weights == "int4" or (ctx.weights == "mxfp4" and ctx.mxfp4_moe == "marlin")
    flashinfer_mxfp4 = ctx.weights == "mxfp4" and ctx.mxfp4_moe.startswith("flashinfer")
    nvfp4 = ctx.weights == "nvfp4"  # expand() made trtllm_moe True
    scale = _FP8_SCALES.get(ctx.weights, "")
    routed = balanced_routing(local_pairs(t, top_k, experts, ctx.ep), reached)
    fused_shared = (ctx.engine.fuses_shared_expert(model.model_type, experts, model.n_shared_experts, ctx.ep)
                    and not (marlin or ctx.trtllm_moe or flashinfer_mxfp4))
    if fused_shared:  # the shared expert is one more expert of the fused MoE, which every token picks
        reached, top_k, routed = reached + 1, top_k + 1, (*routed, t)
    shared = [] if fused_shared else _shared_experts(ctx, mlp_t, mlp_tp)
    # The layer's all-reduce sums the experts' and shared experts' partial outputs over TP; with the ranks
    # gathered, the reduce-scatter sums the experts', and the shared experts' need one over the rank's GPUs
    # unless they ran over the whole group.
    reduce = ctx.all_reduce("moe.all_reduce") if not scatter or (shared and not over_group) else []
    return [
        *gather,
        # The router stays unquantised in both engines (ReplicatedLinear with quant_config=None). MiniMax-M2 keeps
        # it in FP32, which this BF16 GEMM leaves out (docs/models.md).
        Gemm(m=t, n=experts, k=model.hidden_size, bias=model.moe_bias, dtype=ctx.act, out_dtype=ctx.act,
             name="gate"),
        RouterTopK(
            tokens=t, num_experts=experts, top_k=top_k, renormalize=model.norm_topk_prob, dtype=ctx.act, name="topk",
            num_groups=model.n_group, topk_groups=model.topk_group,
        ),
        # Timed as the layer of this GPU's experts the step's tokens reach (reached_experts), each receiving an
        # even share of the GPU's pairs: the others read nothing and their grid blocks exit at once. Under expert
        # parallelism the busiest GPU's share, which the others wait for.
        (MarlinMoE if marlin else TrtllmMoE if ctx.trtllm_moe or flashinfer_mxfp4 else FusedMoE)(
            tokens=t,
            num_experts=reached,
            top_k=top_k,
            hidden=model.hidden_size,
            intermediate=model.moe_intermediate_size // (ctx.moe_gpus // ctx.ep),
            expert_tokens=routed,
            dtype=("fp4" if nvfp4 else "fp8" if scale or (flashinfer_mxfp4 and ctx.mxfp4_moe == "flashinfer-mxfp8")
                   else ctx.act),
            scale=scale,
            weight_dtype=ctx.weights if ctx.weights in FOUR_BIT_EXPERT_FORMATS else "",
            weight_group=model.int4_group_size if ctx.weights == "int4" else 0,
            name="experts",
            **({"global_experts": experts} if marlin and ctx.ep > 1 else {}),
        ),
        *(shared if over_group else ()),
        *scatter,
        *(() if over_group else shared),
        *reduce,
    ]


def _dp_moe_collectives(ctx: _Ctx) -> tuple[list[Collective], list[Collective]]:
    """With attention data parallelism, the MoE layer's gather of every rank's hidden states and the reduce-scatter
    that hands each rank the sum of its tokens' expert outputs, both over the TP group (vLLM's default
    ``allgather_reducescatter`` all2all backend, ``dispatch``/``combine``; SGLang's ``dp_gather``/``dp_scatter``);
    none without it, the layer's all-reduce doing both."""
    if ctx.dp == 1:
        return [], []
    gathered = int(ctx.tokens * ctx.dp * ctx.model.hidden_size * dtype_bytes(ctx.act))
    return ([Collective(op="all_gather", bytes=gathered, group_size=ctx.moe_gpus, dtype=ctx.act,
                        name="moe.dp_gather")],
            [Collective(op="reduce_scatter", bytes=gathered, group_size=ctx.moe_gpus, dtype=ctx.act,
                        name="moe.dp_scatter")])


def _shared_experts(ctx: _Ctx, tokens: int, tp: int) -> list[Op]:
    """DeepSeekMoE's shared experts: one dense MLP of ``moe_intermediate_size x n_shared_experts`` sharded over
    ``tp`` GPUs on ``tokens`` tokens (the step's, or every rank's gathered), its output added to the routed
    experts' before the layer's one all-reduce (vLLM and SGLang ``DeepseekV2MoE``: ``shared_experts`` built with
    ``reduce_results=False``)."""
    model = ctx.model
    if not model.n_shared_experts:
        return []
    inter = model.shared_expert_intermediate_size // tp
    ops: list[Op] = [
        *ctx.linear("shared_experts.gate_up_proj", n=2 * inter, k=model.hidden_size, rows=tokens),
        SiluMul(tokens=tokens, dim=inter, dtype=ctx.act, name="shared_experts.act_fn"),
        *ctx.linear("shared_experts.down_proj", n=model.hidden_size, k=inter, rows=tokens),
    ]
    if model.shared_expert_gate:  # Qwen3-Next: sigmoid(hidden @ w) scales the shared expert's output, unquantised
        ops.append(Gemm(m=tokens, n=1, k=model.hidden_size, dtype=ctx.act, out_dtype=ctx.act,
                        name="shared_expert_gate"))
    return ops


def _layer(ctx: _Ctx, layer: int) -> list[Op]:
    if ctx.model.is_mla:
        return _mla_layer(ctx, layer)
    if ctx.model.is_linear_layer(layer):
        return _linear_attention_layer(ctx, layer)
    model, t, hd = ctx.model, ctx.tokens, ctx.model.head_dim
    # Global layer 0 starts the residual stream (plain RMSNorm); later layers, and a later stage's first layer
    # (which receives the residual), use the fused add+RMSNorm.
    norm_cls = RMSNorm if layer == 0 else AddRMSNorm
    ops: list[Op] = [norm_cls(rows=t, dim=model.hidden_size, dtype=ctx.act, name="input_layernorm")]
    q_heads = 2 * ctx.heads if model.attn_output_gate else ctx.heads  # the gate comes out of q_proj beside Q
    ops += ctx.linear("qkv_proj", n=(q_heads + 2 * ctx.kv_heads) * hd, k=model.hidden_size, bias=model.attention_bias)
    if model.has_qk_norm(layer):
        ops += _qk_norm(ctx)
    if model.uses_rope(layer):
        # A partial rotary embedding (MiniMax-M2: 64 of 128) reads and turns only its rope_dim values of each head.
        ops.append(Rope(tokens=t, num_heads=ctx.heads, num_kv_heads=ctx.kv_heads, head_dim=model.rope_dim,
                        dtype=ctx.act, name="rotary_emb"))
    ops += [
        # Padded slots (slot id -1) are skipped, so the cache write sees only the real tokens.
        KvWrite(
            tokens=ctx.batch.num_tokens,
            num_kv_heads=ctx.kv_heads,
            head_dim=hd,
            dtype=ctx.act,
            kv_dtype=ctx.kv,
            name="kv_cache_write",
        ),
        *_attention(ctx, model.attention_window(layer), model.attention_chunk(layer)),
    ]
    if model.attn_output_gate:
        # attn_output * sigmoid(gate): two reads and one write of the heads' outputs, as SiLU&Mul's.
        ops.append(SiluMul(tokens=t, dim=ctx.heads * hd, dtype=ctx.act, name="attn_output_gate"))
    ops += [
        *ctx.linear("o_proj", n=model.hidden_size, k=ctx.heads * hd, bias=model.o_proj_bias),
        *ctx.all_reduce("attn.all_reduce"),
        AddRMSNorm(rows=t, dim=model.hidden_size, dtype=ctx.act, name="post_attention_layernorm"),
        *_mlp(ctx, layer),
    ]
    return ops


def _linear_attention_layer(ctx: _Ctx, layer: int) -> list[Op]:
    """A Gated DeltaNet layer (vLLM ``models/qwen3_next.py`` ``Qwen3NextGatedDeltaNet``, shared by
    ``models/qwen3_5.py``; SGLang ``srt/models/qwen3_next.py`` with ``layers/attention/fla``): in_proj_qkvz and
    in_proj_ba (column-parallel over the heads), the causal conv1d + SiLU over Q, K and V, the gated delta rule
    (chunked for prompt chunks, recurrent for decodes: the engines split a mixed batch so), the gated RMSNorm
    (``RMSNormGated``: norm of each value head times SiLU(z); timed as the norm), out_proj and the all-reduce.
    No rotary embedding and no KV write: the state is updated in place."""
    model, t, batch = ctx.model, ctx.tokens, ctx.batch
    kh, vh = model.linear_num_key_heads // ctx.tp, model.linear_num_value_heads // ctx.tp
    dk, dv = model.linear_key_head_dim, model.linear_value_head_dim
    norm_cls = RMSNorm if layer == 0 else AddRMSNorm
    ops: list[Op] = [norm_cls(rows=t, dim=model.hidden_size, dtype=ctx.act, name="input_layernorm")]
    ops += ctx.linear("in_proj_qkvz", n=2 * kh * dk + 2 * vh * dv, k=model.hidden_size)
    ops += ctx.linear("in_proj_ba", n=2 * vh, k=model.hidden_size)
    heads = dict(key_heads=kh, value_heads=vh, key_head_dim=dk, value_head_dim=dv, dtype=ctx.act,
                 state_dtype=model.linear_state_dtype)
    conv = dict(channels=model.linear_conv_dim // ctx.tp, kernel_width=model.linear_conv_kernel_dim, dtype=ctx.act)
    decodes = len(batch.decodes)
    if decodes:
        ops += [CausalConv1d(tokens=decodes, requests=decodes, name="conv1d.decode", **conv),
                GatedDeltaRuleDecode(tokens=decodes, requests=decodes, name="gdn.decode", **heads)]
    if batch.prefills:
        chunk_lens = batch.query_lens[decodes:]
        tokens = sum(chunk_lens)
        chunks = sum(-(-q // GDN_CHUNK_TOKENS) for q in chunk_lens)
        ops += [CausalConv1d(tokens=tokens, requests=len(chunk_lens), name="conv1d.prefill", **conv),
                GatedDeltaRuleChunk(tokens=tokens, requests=len(chunk_lens), chunks=chunks, name="gdn.prefill",
                                    **heads)]
    ops += [
        RMSNorm(rows=t * vh, dim=dv, dtype=ctx.act, name="norm_gated"),
        *ctx.linear("out_proj", n=model.hidden_size, k=vh * dv),
        *ctx.all_reduce("attn.all_reduce"),
        AddRMSNorm(rows=t, dim=model.hidden_size, dtype=ctx.act, name="post_attention_layernorm"),
        *_mlp(ctx, layer),
    ]
    return ops


def _mla_layer(ctx: _Ctx, layer: int) -> list[Op]:
    """A DeepSeek-V3 layer (vLLM ``model_executor/models/deepseek_v2.py`` ``DeepseekV2MLAAttention`` with
    ``v1/attention/backends/mla/common.py``; SGLang ``srt/models/deepseek_v2.py`` ``DeepseekV2AttentionMLA``): the
    query LoRA and the KV latent come from one replicated projection of the hidden states (``fused_qkv_a_proj``),
    each normed; q_b_proj expands the queries per head; the rotary embedding turns the 64-wide rotary parts of
    every query head and of the one shared key; the latent (512 + 64 values) goes to the cache; then
    :func:`_mla_attention`, o_proj, and the MLP (dense in the first ``first_k_dense_replace`` layers, else
    DeepSeekMoE)."""
    model, t = ctx.model, ctx.tokens
    h, qk = ctx.heads, model.qk_nope_head_dim + model.qk_rope_head_dim
    norm_cls = RMSNorm if layer == 0 else AddRMSNorm
    ops: list[Op] = [norm_cls(rows=t, dim=model.hidden_size, dtype=ctx.act, name="input_layernorm")]
    if model.q_lora_rank:
        ops += ctx.linear("fused_qkv_a_proj", n=model.q_lora_rank + model.mla_latent_dim, k=model.hidden_size)
        ops += [RMSNorm(rows=t, dim=model.q_lora_rank, dtype=ctx.act, name="q_a_layernorm")]
    else:
        ops += ctx.linear("q_proj", n=h * qk, k=model.hidden_size)
        ops += ctx.linear("kv_a_proj_with_mqa", n=model.mla_latent_dim, k=model.hidden_size)
    ops += [RMSNorm(rows=t, dim=model.kv_lora_rank, dtype=ctx.act, name="kv_a_layernorm")]
    if model.is_dsa:
        ops += _dsa_indexer(ctx)
    if model.q_lora_rank:
        ops += ctx.linear("q_b_proj", n=h * qk, k=model.q_lora_rank)
    ops += [
        Rope(tokens=t, num_heads=h, num_kv_heads=1, head_dim=model.qk_rope_head_dim, dtype=ctx.act,
             name="rotary_emb"),
        KvWrite(tokens=ctx.batch.num_tokens, num_kv_heads=1, head_dim=model.mla_latent_dim, dtype=ctx.act,
                kv_dtype=ctx.kv, kv_shared=True, name="kv_cache_write"),
        *(_dsa_attention(ctx) if model.is_dsa else _mla_attention(ctx)),
        *ctx.linear("o_proj", n=model.hidden_size, k=h * model.v_head_dim),
        *ctx.all_reduce("attn.all_reduce"),
        AddRMSNorm(rows=t, dim=model.hidden_size, dtype=ctx.act, name="post_attention_layernorm"),
        *_mlp(ctx, layer),
    ]
    return ops


#: KV-cache page of the MLA backends where it differs from the engine's MHA page: vLLM's FlashAttention MLA,
#: FlashMLA and FlashInfer MLA backends take 64-token blocks.
_MLA_PAGE_SIZES = {"vllm": 64}
#: SGLang runs a prefill batch whose cached prefixes sum to fewer tokens than this (but some) in MLA's absorbed
#: form, and the others in the MHA form (``SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD``; ``_handle_attention_backend``
#: in ``srt/models/deepseek_v2.py``), except with its TRT-LLM MLA backend (Blackwell), which runs every prefill in
#: the MHA form (``handle_attention_trtllm_mla``).
SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD = 8192


def _mla_attention(ctx: _Ctx, lengths_only: bool = False) -> list[Kernel]:
    """MLA's attention between the cache write and o_proj, as both engines split it by request:

    - prompt chunks in the MHA form: kv_b_proj expands the new tokens' latents into per-head K-nope and V, and a
      ragged causal attention with 192-wide Q/K heads (128 no-rotary + 64 rotary) and 128-wide V runs over them;
      a chunk with cached context also expands the context's latents read back from the cache and attends to them
      without a mask (its two partial results merged). SGLang runs a prefill batch whose cached prefixes sum to
      fewer than :data:`SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD` tokens (and more than none) in the absorbed form
      below instead, its queries attending causally to the cached latents, but on Blackwell (TRT-LLM MLA);
    - decoding requests in the absorbed form: each head's query is multiplied into the latent space (the W_UK
      batched matmul, 128 -> 512 a head), an MQA over the cached 576-wide latents gives a 512-wide latent output,
      and the W_UV batched matmul takes it back to 128 a head. The batched matmuls are timed as one GEMM of the
      heads side by side (same FLOPs and weights; each head's input is read once, not once per head).

    With the decode step graphed, its kernels see the padded batch. ``lengths_only``: only the kernels whose
    shapes follow the requests' lengths rather than the step's token and request counts (the attention kernels and
    the context's expansion), which :func:`step_part` times apart."""
    batch = ctx.batch
    common = _mla_kernel_args(ctx)
    decodes = len(batch.decodes)
    ops = _mla_decode(ctx, common, batch.kv_lens[:decodes]) if decodes else []
    prefill, context = ([], []) if batch.is_decode_only else _mla_prefill(ctx, common)
    if lengths_only:
        return [op for op in ops + prefill if isinstance(op, (AttentionPrefill, AttentionDecode))] + context
    return ops + prefill + context


def _mla_kernel_args(ctx: _Ctx) -> dict:
    """The attention-kernel arguments every MLA attention kernel of the step shares: the latent cache's page, the
    backend and the dtypes."""
    page = _MLA_PAGE_SIZES.get(ctx.engine.name, ctx.engine.page_size(ctx.backend))
    return dict(page_size=page, backend=ctx.backend, dtype=ctx.act, kv_dtype=ctx.kv)


def _mla_decode(ctx: _Ctx, common: dict, kv_lens: tuple[int, ...], attn_heads: int = 0) -> list[Kernel]:
    """The decoding requests' part of :func:`_mla_attention`, each attending to ``kv_lens`` cached latents; the
    attention kernel runs ``attn_heads`` query heads (0: the GPU's own; more: zero-padded)."""
    model, h = ctx.model, ctx.heads
    rows = ctx.tokens if ctx.batch.is_decode_only else len(kv_lens)
    sparse = "sparse " if model.is_dsa else ""
    return [
        Gemm(m=rows, n=h * model.kv_lora_rank, k=model.qk_nope_head_dim, dtype=ctx.act, out_dtype=ctx.act,
             name="q_nope.W_UK_T (bmm)"),
        AttentionDecode(kv_lens=kv_lens, num_heads=attn_heads or h, num_kv_heads=1, head_dim=model.mla_latent_dim,
                        v_head_dim=model.kv_lora_rank, kv_shared=True, name=f"attn.decode ({sparse}latent MQA)",
                        **common),
        Gemm(m=rows, n=h * model.v_head_dim, k=model.kv_lora_rank, dtype=ctx.act, out_dtype=ctx.act,
             name="W_UV (bmm)"),
    ]


def _mla_prefill(ctx: _Ctx, common: dict) -> tuple[list[Kernel], list[Kernel]]:
    """The prompt chunks' part of :func:`_mla_attention`: the kernels over their new tokens, and those over their
    cached context (its expansion and attention)."""
    batch = ctx.batch
    decodes = len(batch.decodes)
    query, kv = batch.query_lens[decodes:], batch.kv_lens[decodes:]
    prefix = sum(kv) - sum(query)
    absorbs = ctx.engine.name == "sglang" and ctx.backend != "trtllm_mha"
    if absorbs and 0 < prefix < SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD:
        return _mla_absorbed_prefill(ctx, common, query, kv), []
    return _mla_prefill_mha(ctx, common, query, kv)


def _mla_absorbed_prefill(ctx: _Ctx, common: dict, query: tuple[int, ...], kv: tuple[int, ...],
                          window: int = 0, attn_heads: int = 0) -> list[Kernel]:
    """Prompt chunks in MLA's absorbed form: W_UK, an MQA of the chunks' queries over the cached latents (each query
    over at most ``window`` of them when > 0: DSA's top-k; ``attn_heads`` query heads as in :func:`_mla_decode`),
    W_UV."""
    model, h, rows = ctx.model, ctx.heads, sum(query)
    return [
        Gemm(m=rows, n=h * model.kv_lora_rank, k=model.qk_nope_head_dim, dtype=ctx.act, out_dtype=ctx.act,
             name="q_nope.W_UK_T (bmm, prefill)"),
        AttentionPrefill(query_lens=query, kv_lens=kv, num_heads=attn_heads or h, num_kv_heads=1,
                         head_dim=model.mla_latent_dim, v_head_dim=model.kv_lora_rank, kv_shared=True, window=window,
                         name="attn.prefill (sparse MQA)" if window else "attn.prefill (latent MQA)", **common),
        Gemm(m=rows, n=h * model.v_head_dim, k=model.kv_lora_rank, dtype=ctx.act, out_dtype=ctx.act,
             name="W_UV (bmm, prefill)"),
    ]


def _mla_prefill_mha(ctx: _Ctx, common: dict, query: tuple[int, ...],
                     kv: tuple[int, ...]) -> tuple[list[Kernel], list[Kernel]]:
    """Prompt chunks in MLA's MHA form: kv_b_proj and a ragged causal attention over the new tokens; for a chunk
    with cached context, the context's expansion and an unmasked attention over it (see :func:`_mla_attention`)."""
    model, h = ctx.model, ctx.heads
    qk, v = model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim
    kv_b = h * (model.qk_nope_head_dim + v)
    ops: list[Kernel] = ctx.linear("kv_b_proj", n=kv_b, k=model.kv_lora_rank, rows=sum(query))
    ops.append(AttentionPrefill(query_lens=query, kv_lens=query, kv_layout="ragged", num_heads=h, num_kv_heads=h,
                                head_dim=qk, v_head_dim=v, name="attn.prefill (MHA form)", **common))
    cached = [(q, k - q) for q, k in zip(query, kv) if k > q]
    context: list[Kernel] = []
    if cached:
        context += ctx.linear("kv_b_proj (context)", n=kv_b, k=model.kv_lora_rank, rows=sum(c[1] for c in cached))
        context.append(AttentionPrefill(query_lens=tuple(c[0] for c in cached), kv_lens=tuple(c[1] for c in cached),
                                        causal=False, kv_layout="ragged", num_heads=h, num_kv_heads=h, head_dim=qk,
                                        v_head_dim=v, name="attn.prefill context", **common))
    return ops, context


#: Tokens a page of DSA's indexer key cache holds (DeepGEMM's paged MQA logits take 64-token blocks).
INDEXER_PAGE_TOKENS = 64
#: Query heads FlashMLA's sparse kernel (``flash_mla_sparse_fwd``) takes a multiple of, by architecture (64
#: elsewhere): fewer heads per GPU are zero-padded up to it (SGLang ``_forward_flashmla_sparse`` in
#: ``srt/layers/attention/nsa_backend.py``; vLLM ``FlashMLASparseImpl.padding``).
_FLASHMLA_SPARSE_HEAD_MULTIPLE = {"blackwell": 128}
#: GPU architectures on which SGLang's NSA backend runs a short prompt-only batch in the MHA form (SM90 with FA3,
#: SM100 with TRT-LLM ragged attention; ``handle_attention_nsa`` in ``srt/models/deepseek_v2.py``).
_NSA_MHA_ARCHITECTURES = ("hopper", "blackwell")


def indexer_logits_args(model: ModelConfig, backend: str) -> dict:
    """The arguments of DSA's indexer logits kernels (:class:`IndexLogitsDecode`, :class:`IndexLogitsPrefill`) but
    the lengths: ``index_n_heads`` FP8 query heads over one shared FP8 key of ``index_head_dim`` per token, in pages
    of :data:`INDEXER_PAGE_TOKENS`, on ``backend`` (whose decomposition the kernels follow)."""
    return dict(num_heads=model.index_n_heads, num_kv_heads=1, head_dim=model.index_head_dim, kv_shared=True,
                page_size=INDEXER_PAGE_TOKENS, backend=backend, dtype="fp8", kv_dtype="fp8")


def _dsa_keys_only(ctx: _Ctx) -> bool:
    """SGLang's indexer fast path (``Indexer._forward_cuda_k_only``, ``srt/layers/attention/nsa/nsa_indexer.py``):
    a prompt-only batch whose longest request has at most ``index_topk`` keys keeps every key anyway, so the indexer
    only computes and caches its keys (no queries, logits or top-k). vLLM's ``Indexer`` always scores."""
    batch = ctx.batch
    return ctx.engine.name == "sglang" and not batch.decodes and max(batch.kv_lens) <= ctx.model.index_topk


def _dsa_indexer(ctx: _Ctx) -> list[Kernel]:
    """DSA's lightning indexer, the kernels over the step's tokens (SGLang ``Indexer`` in
    ``srt/layers/attention/nsa/nsa_indexer.py``, release 0.5.5 on; vLLM ``Indexer`` in
    ``model_executor/models/deepseek_v2.py``): its linears are replicated on every TP rank (``ReplicatedLinear``):
    wq_b takes the normed query LoRA to ``index_n_heads`` heads of ``index_head_dim`` (quantised as the model's
    linears), wk the hidden states to one key, weights_proj (16-bit) the hidden states to one gate per head; the
    key's LayerNorm (timed as an RMSNorm: one pass over the same bytes), the rotary embedding of the first
    ``qk_rope_head_dim`` values of each query head and of the key, FP8 quantisation with one scale per 128 values,
    and the key's write to the indexer cache. On SGLang's keys-only path (:func:`_dsa_keys_only`) only the key's
    kernels run. The Hadamard rotation of queries and keys (``rotate_activation``) is not modelled."""
    model, t = ctx.model, ctx.tokens
    heads, dim = (0 if _dsa_keys_only(ctx) else model.index_n_heads), model.index_head_dim
    ops: list[Kernel] = ctx.linear("indexer.wq_b", n=heads * dim, k=model.q_lora_rank) if heads else []
    ops += ctx.linear("indexer.wk", n=dim, k=model.hidden_size)
    if heads:
        ops.append(Gemm(m=t, n=heads, k=model.hidden_size, dtype=ctx.act, out_dtype=ctx.act,
                        name="indexer.weights_proj"))
    return ops + [
        RMSNorm(rows=t, dim=dim, dtype=ctx.act, name="indexer.k_norm (LayerNorm)"),
        Rope(tokens=t, num_heads=heads, num_kv_heads=1, head_dim=model.qk_rope_head_dim, dtype=ctx.act,
             name="indexer.rotary_emb"),
        Quantize(rows=t * (heads + 1), cols=dim, group=128, in_dtype=ctx.act, engine=ctx.engine.name,
                 name="indexer.act_quant"),
        KvWrite(tokens=ctx.batch.num_tokens, num_kv_heads=1, head_dim=dim, dtype="fp8", kv_dtype="fp8",
                kv_shared=True, name="indexer.k_cache_write"),
    ]


def causal_keys(query_lens: tuple[int, ...], kv_lens: tuple[int, ...]) -> int:
    """Keys all the queries of causal prompt chunks see together, each its own and every earlier one."""
    return sum(q * (kv - q) + q * (q + 1) // 2 for q, kv in zip(query_lens, kv_lens))


def _flashmla_sparse_heads(ctx: _Ctx) -> int:
    """The query heads FlashMLA's sparse kernel runs for the GPU's ``ctx.heads``, padding included."""
    multiple = _FLASHMLA_SPARSE_HEAD_MULTIPLE.get(ctx.gpu.architecture, 64)
    return -(-ctx.heads // multiple) * multiple


def _index_topk(model: ModelConfig, rows: int, logits: int, longest: int) -> list[Kernel]:
    """The indexer's top-k over ``rows`` queries' ``logits``, none when no query has more than ``index_topk`` keys
    (``longest``: the most any query has)."""
    return [IndexTopK(rows=rows, keys=logits, top_k=model.index_topk, name="indexer.topk")] if (
        longest > model.index_topk) else []


def _dsa_attention(ctx: _Ctx, lengths_only: bool = False) -> list[Kernel]:
    """DSA's attention between the cache write and o_proj: the indexer scores every cached key for each query, keeps
    the top ``index_topk``, and MLA attends to those only (SGLang ``nsa_backend.py`` with FlashMLA's sparse kernels;
    vLLM ``v1/attention/backends/mla/flashmla_sparse.py`` and its indexer backend):

    - the indexer's logits (:class:`IndexLogitsDecode`, :class:`IndexLogitsPrefill`): an FP8 MQA of its
      ``index_n_heads`` query heads over the cached 128-wide FP8 keys, each head's ReLU'd score weighted by its
      gate (DeepGEMM ``fp8_paged_mqa_logits`` for decodes, ``fp8_mqa_logits`` over the gathered keys for prompt
      chunks);
    - the top-k (:class:`IndexTopK`) over each query's logits, where some query has more than ``index_topk`` keys
      (otherwise SGLang's ``fast_topk_transform_fused`` writes positions 0..n-1 and aiconfigurator times it as 0);
    - sparse MLA in the absorbed form over ``min(keys, index_topk)`` keys per query: a decode is the latent MQA of
      :func:`_mla_attention` over that many keys, a prompt chunk's the absorbed prefill with every query seeing at
      most ``index_topk`` keys (the attended pairs of a causal window of that width; the sparse kernel gathers them
      wherever they are). FlashMLA's sparse kernel (prompt chunks; vLLM's decodes too) runs the heads padded to a
      multiple of 64, 128 on Blackwell (:func:`_flashmla_sparse_heads`).

    SGLang runs a prompt-only batch whose longest request has at most ``index_topk`` keys in MLA's MHA form on
    Hopper and Blackwell with a 16-bit KV cache (``handle_attention_nsa``), its indexer keys-only
    (:func:`_dsa_keys_only`). ``lengths_only`` as in :func:`_mla_attention`."""
    batch, model = ctx.batch, ctx.model
    common = _mla_kernel_args(ctx)
    keys_only = _dsa_keys_only(ctx)
    if keys_only and ctx.gpu.architecture in _NSA_MHA_ARCHITECTURES and ctx.kv == ctx.act:
        prefill, context = _mla_prefill_mha(ctx, common, batch.query_lens, batch.kv_lens)
        if lengths_only:
            return [op for op in prefill if isinstance(op, AttentionPrefill)] + context
        return prefill + context
    index = indexer_logits_args(model, ctx.backend)
    decodes = len(batch.decodes)
    ops: list[Kernel] = []
    if decodes:
        kv = batch.kv_lens[:decodes]
        ops.append(IndexLogitsDecode(kv_lens=kv, name="indexer.logits (paged FP8 MQA)", **index))
        ops += _index_topk(model, decodes, sum(kv), max(kv))
        # SGLang decodes on its MLA decode backend (FA3 on Hopper, TRT-LLM on Blackwell) over the chosen pages;
        # vLLM on FlashMLA's sparse kernel.
        heads = _flashmla_sparse_heads(ctx) if ctx.engine.name == "vllm" else 0
        ops += _mla_decode(ctx, common, tuple(model.attended_keys(k) for k in kv), heads)
    if batch.prefills:
        query, kv = batch.query_lens[decodes:], batch.kv_lens[decodes:]
        if not keys_only:
            ops.append(IndexLogitsPrefill(query_lens=query, kv_lens=kv, kv_layout="ragged",
                                          name="indexer.logits (FP8 MQA)", **index))
            ops += _index_topk(model, sum(query), causal_keys(query, kv), max(kv))
        window = model.index_topk if max(kv) > model.index_topk else 0
        ops += _mla_absorbed_prefill(ctx, common, query, kv, window, _flashmla_sparse_heads(ctx))
    if lengths_only:
        return [op for op in ops if isinstance(op, (AttentionPrefill, AttentionDecode, IndexTopK))]
    return ops


def _qk_norm(ctx: _Ctx) -> list[Op]:
    """The Q and K norms: per head (Qwen3), or over all of Q and all of K (MiniMax-M2, vLLM
    ``MiniMaxText01RMSNormTP``), whose mean square over the whole projection needs this GPU's share summed over TP:
    one all-reduce of the two FP32 variances per token (``forward_qk``)."""
    model, t, hd = ctx.model, ctx.tokens, ctx.model.head_dim
    if model.qk_norm == "head":
        return [RMSNorm(rows=t * ctx.heads, dim=hd, dtype=ctx.act, name="q_norm"),
                RMSNorm(rows=t * ctx.kv_heads, dim=hd, dtype=ctx.act, name="k_norm")]
    if model.qk_norm == "layer":
        return [RMSNorm(rows=t, dim=ctx.heads * hd, dtype=ctx.act, name="q_norm"),
                RMSNorm(rows=t, dim=ctx.kv_heads * hd, dtype=ctx.act, name="k_norm"),
                *ctx.all_reduce("qk_norm.all_reduce", width=2, dtype="fp32")]
    return []


def _stage_input(ctx: _Ctx, stage: int) -> list[Op]:
    """Embedding on the first stage; receiving hidden states and residual on the others.

    A pipeline boundary moves two tensors (vLLM IntermediateTensors / SGLang PPProxyTensors). With tp > 1 each TP
    rank sends and receives its 1/tp slice, and the receiving ranks all-gather (``send_tensor_dict`` with an
    ``all_gather_group``).
    """
    model, t = ctx.model, ctx.tokens
    full = int(t * model.hidden_size * dtype_bytes(ctx.act))
    if stage == 0:
        rows = padded_vocab(model.vocab_size) // ctx.tp
        embedding = Embedding(tokens=t, hidden=model.hidden_size, vocab_rows=rows, dtype=ctx.act, name="embed_tokens")
        return [embedding, *ctx.all_reduce("embed.all_reduce")]
    ops: list[Op] = []
    for tensor in ("hidden_states", "residual"):
        ops.append(Collective(op="recv", bytes=full // ctx.tp, group_size=2, dtype=ctx.act, name=f"recv {tensor}"))
        if ctx.tp > 1:
            gather = Collective(
                op="all_gather", bytes=full, group_size=ctx.tp, dtype=ctx.act, name=f"all_gather {tensor}"
            )
            ops.append(gather)
    return ops


def _stage_output(ctx: _Ctx, last: bool, plan: GraphPlan) -> list[Op]:
    """Final norm, LM head on the sampled rows, logits all-gather and sampling on the last stage; else send.

    Both engines compute logits for one row per request, the last of its new tokens, partial prefill chunks
    included (their token is discarded); SGLang's decode graph computes them for the padded batch.
    """
    model = ctx.model
    if not last:
        full = int(ctx.tokens * model.hidden_size * dtype_bytes(ctx.act))
        return [
            Collective(op="send", bytes=full // ctx.tp, group_size=2, dtype=ctx.act, name=f"send {tensor}")
            for tensor in ("hidden_states", "residual")
        ]
    norm = AddRMSNorm(rows=ctx.tokens, dim=model.hidden_size, dtype=ctx.act, name="norm")
    return [norm, *_sampled_rows(ctx, plan)]


def _sampled_rows(ctx: _Ctx, plan: GraphPlan) -> list[Op]:
    """The last stage's ops on the sampled rows (one per request): LM head, logits all-gather, sampling."""
    model = ctx.model
    rows = ctx.batch.num_requests
    if ctx.engine.lm_head_in_graph and plan.mode == "full":
        rows = plan.padded_tokens
    vocab = padded_vocab(model.vocab_size)
    ops: list[Op] = [
        Gemm(m=rows, n=vocab // ctx.tp, k=model.hidden_size, dtype=ctx.act, out_dtype=ctx.act, name="lm_head"),
    ]
    if ctx.tp > 1:
        ops.append(
            Collective(
                op="all_gather",
                bytes=int(rows * vocab * dtype_bytes(ctx.act)),
                group_size=ctx.tp,
                dtype=ctx.act,
                name="logits.all_gather",
            )
        )
    ops.append(Sampling(rows=ctx.batch.num_requests, vocab=model.vocab_size, name="sampler"))
    return ops


def expand(
    engine: str,
    model: ModelConfig,
    gpu: GpuSpec,
    batch: BatchSpec,
    tp: int = 1,
    pp: int = 1,
    stage: int = 0,
    dtype: str = "bf16",
    kv_cache_dtype: str = "auto",
    mxfp4_moe_backend: str = "auto",
    ep: int = 1,
    moe_backend: str = "auto",
    dp: int = 1,
    capture_tokens: int | None = None,
) -> StepKernels:
    """The kernels and collectives one GPU of pipeline stage ``stage`` launches for ``batch`` under ``engine``, the
    routed experts split over ``ep`` of the ``tp`` GPUs, attention over ``tp / dp`` of them when ``dp`` attention
    data-parallel ranks share the TP group, ``batch`` being one rank's (:class:`servesim.models.parallel.Parallelism`).

    ``mxfp4_moe_backend`` picks the MoE kernel of MXFP4 experts (``MXFP4_MOE_BACKENDS``; ``auto``: the engine's
    default for the GPU), ``moe_backend`` that of BF16 and FP8 ones (``MOE_BACKENDS``); ``capture_tokens`` is the
    largest step run in a CUDA graph where the engine lets a deployment set it (vLLM; None: the engine's default).
    Memoised on (engine, model, the GPU traits that matter, batch, tp, pp, stage, dtype, kv_cache_dtype, the MoE
    kernels, ep, dp, capture_tokens): a simulator calls it for every step and repeated step shapes cost a dictionary
    look-up.
    """
    config = get_engine_kernels(engine)
    if dtype not in WEIGHT_DTYPES:
        raise ServesimError(f"unknown dtype {dtype!r}; choose one of {', '.join(WEIGHT_DTYPES)}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ServesimError(f"unknown KV-cache dtype {kv_cache_dtype!r}; choose one of {', '.join(KV_CACHE_DTYPES)}")
    check_parallelism(model, tp, pp, stage, ep, dp)
    check_weight_format(model, dtype)
    traits = gpu_traits(gpu, config.name, tp // dp)
    if dtype.startswith("fp8") and not traits.fp8_tensor_cores:
        raise ServesimError(
            f"{gpu.name} has no FP8 Tensor cores, so the engines cannot run W8A8 on it (they fall back to "
            f"weight-only FP8 Marlin, which servesim does not model); use --dtype bf16 or an Ada/Hopper/Blackwell GPU"
        )
    config.attention_backend(traits.architecture)  # fail early on an architecture the engine has no default for
    mxfp4_moe = config.mxfp4_moe_backend(traits.architecture, mxfp4_moe_backend)
    if dtype == "nvfp4":
        check_nvfp4(config.name, model, gpu, traits.architecture)
    trtllm_moe = config.moe_backend(traits.architecture, model.model_type, served_weights(model, dtype),
                                    moe_backend) == "flashinfer-trtllm"
    return _expand_cached(config, model, traits, batch, tp, pp, stage, dtype, kv_cache_dtype, mxfp4_moe, ep,
                          trtllm_moe, dp, capture_tokens)


def check_weight_format(model: ModelConfig, dtype: str) -> None:
    """Refuse a weight format the model's checkpoint cannot be served in: ``mxfp4`` is the format of checkpoints
    that ship MXFP4 experts (gpt-oss), which no engine makes of another checkpoint; ``int4`` likewise of a
    compressed-tensors checkpoint with INT4 experts (Kimi-K2.5); ``nvfp4`` is modelled for the families whose
    NVIDIA NVFP4 checkpoints' layers servesim knows (servesim.models.memory.NVFP4_LINEAR_ROLES)."""
    if dtype == "int4" and not (model.checkpoint_quant == "compressed-tensors" and model.int4_group_size
                                and model.is_moe):
        declared = f"declares {model.checkpoint_quant}" if model.checkpoint_quant else "declares no quantisation"
        raise ServesimError(
            f"{model.name} is not a checkpoint with INT4 experts (its config.json {declared}); --dtype int4 is the "
            f"format of compressed-tensors MoE checkpoints with 4-bit integer weights, such as Kimi-K2.5's; use "
            f"--dtype {_suggested_dtype(model)} or bf16")
    if dtype == "nvfp4" and model.model_type not in NVFP4_LINEAR_ROLES:
        raise ServesimError(
            f"{model.name} ({model.model_type}) has no modelled NVFP4 checkpoint: servesim knows which layers "
            f"NVIDIA's NVFP4 releases quantise for {', '.join(sorted(NVFP4_LINEAR_ROLES))}; use --dtype "
            f"{_suggested_dtype(model)} or bf16")
    if dtype == "mxfp4" and (model.checkpoint_quant != "mxfp4" or not model.is_moe):
        declared = f"declares {model.checkpoint_quant}" if model.checkpoint_quant else "declares no quantisation"
        raise ServesimError(
            f"{model.name} is not an MXFP4 checkpoint (its config.json {declared}); of 4-bit weights servesim models "
            f"only the MXFP4 experts gpt-oss ships (--dtype mxfp4), compressed-tensors INT4 experts (--dtype int4) "
            f"and NVFP4 experts (--dtype nvfp4), not INT4 of other kinds; use --dtype {_suggested_dtype(model)} or "
            f"bf16")


def check_nvfp4(engine: str, model: ModelConfig, gpu: GpuSpec, architecture: str) -> None:
    """Refuse NVFP4 experts where the engine does not run them on FlashInfer's TRT-LLM FP4 MoE, the kernel servesim
    models. vLLM 0.15.1 to 0.19 takes it first on compute capability 10.x (B200, B300, GB200, GB300) whatever the
    router (``select_nvfp4_moe_backend``, ``fused_moe/oracle/nvfp4.py``: TRT-LLM, then CuteDSL, FlashInfer CUTLASS,
    vLLM CUTLASS, Marlin); elsewhere it emulates NVFP4 with Marlin (weight-only). SGLang 0.5.9 and 0.5.10 switch
    ``--moe-runner-backend auto`` to ``flashinfer_trtllm`` for the DeepSeek-architecture list (Kimi-K2.5 among them,
    ``srt/server_args.py``), InferenceX launches Qwen3.5 with it, and MiniMax-M2 stays on SGLang's own CUTLASS FP4
    MoE (``cutlass_moe_fp4``), which servesim does not model."""
    if engine == "sglang" and model.model_type == "minimax_m2":
        raise ServesimError(
            f"SGLang runs {model.name}'s NVFP4 experts on its own CUTLASS FP4 MoE, which servesim does not model "
            f"(it models FlashInfer's TRT-LLM FP4 MoE, which vLLM runs for them); use --engine vllm or another --dtype")
    if architecture != "blackwell" or gpu.tensor_flops_per_sm_per_cycle.get("fp4", 0) <= 0:
        raise ServesimError(
            f"NVFP4 weights are modelled on the FP4 Tensor cores and FlashInfer kernels of Blackwell data-centre "
            f"GPUs (compute capability 10.x: B200, B300, GB200, GB300), not on {gpu.name}, where the engines emulate "
            f"NVFP4 (Marlin) or take other kernels that servesim does not model; use one of those GPUs or another "
            f"--dtype")


def _suggested_dtype(model: ModelConfig) -> str:
    """The quantised ``--dtype`` that serves ``model``'s checkpoint as it ships."""
    if model.checkpoint_quant == "nvfp4" and model.model_type in NVFP4_LINEAR_ROLES:
        return "nvfp4"
    if model.checkpoint_quant == "compressed-tensors" and model.int4_group_size and model.is_moe:
        return "int4"
    return "fp8-block" if model.checkpoint_quant == "fp8-block" else "fp8"


def served_weights(model: ModelConfig, dtype: str) -> str:
    """The format the engines run ``dtype`` weights of ``model`` in: FP8 of a checkpoint that ships block-scaled FP8
    (its ``quantization_config`` gives ``weight_block_size``, as MiniMax-M2.5's does) is block-scaled, since the
    engines take the checkpoint's scales; otherwise ``dtype``."""
    return "fp8-block" if dtype == "fp8" and model.checkpoint_quant == "fp8-block" else dtype


def kernel_categories(engine: str, model: ModelConfig, gpu: GpuSpec, dtype: str = "bf16") -> frozenset[str]:
    """The kernel categories ``engine`` launches serving ``model`` on ``gpu``: a step with a prefill chunk and a
    decode on one GPU launches every kind (layouts change shapes and collectives, not kinds)."""
    step = expand(engine, model, gpu, BatchSpec((PrefillChunk(2),), (1,)), dtype=dtype)
    return frozenset(s.op.category for s in step.kernels)


def activation_dtype(weights: str) -> str:
    """The activations' dtype for ``weights``: FP16 for FP16 checkpoints, else BF16 (FP8 checkpoints included)."""
    return "fp16" if weights == "fp16" else "bf16"


def kv_storage_dtype(weights: str, kv_cache_dtype: str) -> str:
    """The dtype K and V are stored in: the activations' with ``auto``, else ``kv_cache_dtype``."""
    return activation_dtype(weights) if kv_cache_dtype == "auto" else kv_cache_dtype


def _context(
    config: EngineKernels, model: ModelConfig, gpu: GpuTraits, batch: BatchSpec, tp: int, dtype: str,
    kv_cache_dtype: str, plan: GraphPlan, mxfp4_moe: str = "triton", ep: int = 1, trtllm_moe: bool = False,
    dp: int = 1,
) -> _Ctx:
    """The context of a step on one GPU of a ``tp``-GPU group whose ``dp`` attention data-parallel ranks each split
    attention over ``tp / dp`` GPUs."""
    act = activation_dtype(dtype)
    tp //= dp
    return _Ctx(
        engine=config,
        model=model,
        gpu=gpu,
        batch=batch,
        tp=tp,
        weights=served_weights(model, dtype),
        act=act,
        kv=kv_storage_dtype(dtype, kv_cache_dtype),
        tokens=plan.padded_tokens,
        backend=config.attention_backend(gpu.architecture),
        heads=model.num_attention_heads // tp,
        kv_heads=max(1, model.num_kv_heads // tp),
        mxfp4_moe=mxfp4_moe,
        ep=ep,
        trtllm_moe=trtllm_moe,
        dp=dp,
    )


#: The parts of a step :func:`step_part` expands on their own.
STEP_PARTS = ("attention", "sampled_rows")


def step_part(
    part: str,
    engine: str,
    model: ModelConfig,
    gpu: GpuSpec,
    batch: BatchSpec,
    tp: int = 1,
    dtype: str = "bf16",
    kv_cache_dtype: str = "auto",
    dp: int = 1,
    capture_tokens: int | None = None,
) -> tuple[Op, ...]:
    """One part of :func:`expand`'s step for ``batch``, without expanding the rest, which lets step times be split
    (servesim/serving/step_time.py):

    - ``attention``: the attention kernels of one cycle of the model's attention kinds
      (:attr:`ModelConfig.attention_cycle_layers` layers: one for a model whose layers all attend alike, a
      sliding-window and a full-attention layer for gpt-oss), the only kernels that depend on more of the batch
      than its token and request counts; their time over the cycle's layers is a layer's mean;
    - ``sampled_rows``: the last stage's ops on the sampled rows (LM head, logits all-gather, sampling), the only
      other ops whose shape follows the number of requests rather than of tokens (besides the graph mode)."""
    if part not in STEP_PARTS:
        raise ServesimError(f"unknown step part {part!r}; choose one of {', '.join(STEP_PARTS)}")
    config = get_engine_kernels(engine)
    traits = gpu_traits(gpu, config.name, tp // dp)
    plan = config.graph_plan(batch.num_tokens, batch.is_decode_only, traits, tp, bool(model.attention_chunk_size),
                             capture_tokens)
    ctx = _context(config, model, traits, batch, tp, dtype, kv_cache_dtype, plan, dp=dp)
    if part == "sampled_rows":
        return tuple(_sampled_rows(ctx, plan))
    if model.is_dsa:  # the indexer's logits and top-k, the sparse attention kernels
        return tuple(_dsa_attention(ctx, lengths_only=True))
    if model.is_mla:  # the attention kernels and the expansions of the cached context
        return tuple(_mla_attention(ctx, lengths_only=True))
    return tuple(op for layer in range(model.attention_cycle_layers) if not model.is_linear_layer(layer)
                 for op in _attention(ctx, model.attention_window(layer), model.attention_chunk(layer)))


@functools.lru_cache(maxsize=8192)
def _expand_cached(
    config: EngineKernels, model: ModelConfig, gpu: GpuTraits, batch: BatchSpec, tp: int, pp: int, stage: int,
    dtype: str, kv_cache_dtype: str, mxfp4_moe: str = "triton", ep: int = 1, trtllm_moe: bool = False, dp: int = 1,
    capture_tokens: int | None = None,
) -> StepKernels:
    plan = config.graph_plan(batch.num_tokens, batch.is_decode_only, gpu, tp, bool(model.attention_chunk_size),
                             capture_tokens)
    ctx = _context(config, model, gpu, batch, tp, dtype, kv_cache_dtype, plan, mxfp4_moe, ep, trtllm_moe, dp)
    layers = stage_layers(model.num_layers, pp, stage)
    # Layer bodies by (is MoE, is sliding-window, is linear, uses RoPE), each built once (layer 0 differs, built
    # apart).
    body: dict[tuple[bool, bool, bool, bool], tuple[Op, ...]] = {}
    runs: list[OpRun] = [OpRun(None, tuple(_stage_input(ctx, stage)))]
    for layer in layers:
        if layer == 0:
            layer_ops = tuple(_layer(ctx, 0))
        else:
            key = (model.is_moe_layer(layer), model.is_sliding_layer(layer), model.is_linear_layer(layer),
                   model.uses_rope(layer))
            if key not in body:
                body[key] = tuple(_layer(ctx, layer))
            layer_ops = body[key]
        previous = runs[-1]
        if previous.layers is not None and previous.ops is layer_ops:
            runs[-1] = OpRun(range(previous.layers.start, layer + 1), layer_ops)
        else:
            runs.append(OpRun(range(layer, layer + 1), layer_ops))
    runs.append(OpRun(None, tuple(_stage_output(ctx, stage == pp - 1, plan))))

    return StepKernels(
        engine=config.name,
        engine_version=config.version,
        model=model.name,
        tp=tp,
        pp=pp,
        stage=stage,
        dtype=dtype,
        first_layer=layers.start,
        end_layer=layers.stop,
        attention_backend=ctx.backend,
        graph_mode=plan.mode,
        padded_tokens=plan.padded_tokens,
        runs=tuple(run for run in runs if run.ops),
    )
