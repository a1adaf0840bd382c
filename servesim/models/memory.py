"""Where a GPU's memory goes when an engine serves a model (Centimani-style accounting).

Weights are split by TP within a stage and by PP across stages; the KV cache takes what the engine's memory
fraction leaves after weights and the reserves the engine sets aside at start-up (peak activations of its
profiling forward pass, CUDA graphs, CUDA context / NCCL / cuBLAS workspaces).
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.errors import ServesimError
from servesim.kernels.types import DTYPE_BYTES
from servesim.models.config import ModelConfig
from servesim.models.parallel import (
    Parallelism,
    kv_heads_per_gpu,
    padded_vocab_per_gpu,
    stage_layer_counts,
    stage_layers,
    validate_parallelism,
)

#: The KV-cache dtypes servesim plans memory for (their sizes come from the kernels' dtype table).
STORAGE_DTYPES = ("bf16", "fp16", "fp8")

#: Weight formats -> (dtype of the attention and dense-MLP linears, dtype of the routed experts). Norms, biases,
#: embeddings and the LM head stay 16-bit in all of them; the router too, unless the model keeps it in FP32.
#: gpt-oss's MXFP4 checkpoint quantises the experts alone (its ``modules_to_not_convert``: attention, router,
#: embeddings, LM head), as do the NVFP4 checkpoints servesim models (servesim.kernels.expand
#: ``NVFP4_EXPERTS_ONLY_FAMILIES``: shared experts and dense layers stay BF16 too).
WEIGHT_FORMATS: dict[str, tuple[str, str]] = {
    "bf16": ("bf16", "bf16"), "fp16": ("fp16", "fp16"), "fp8": ("fp8", "fp8"), "mxfp4": ("bf16", "mxfp4"),
    "int4": ("bf16", "int4"), "nvfp4": ("bf16", "nvfp4"),
}

#: NVIDIA's ModelOpt NVFP4 checkpoints: the linear layers each family's checkpoint keeps in NVFP4 beside its routed
#: experts, by role (``qkv_proj``: the attention's input projection; ``o_proj``; ``dense_mlp``: the dense layers'
#: gate/up and down; ``shared_experts``), from the checkpoints' ``hf_quant_config.json`` exclusions
#: (aiconfigurator-core's ``model_configs``): MiniMax-M2.5, Kimi-K2.6 and Qwen3.5-397B exclude every attention
#: projection, shared expert and dense layer; DeepSeek-V3.1 (and V3.2, whose indexer is excluded too) the MLA
#: projections but not ``o_proj``; GLM-5 all attention, ``o_proj`` included; Qwen3-235B the router alone; Llama's
#: (ModelOpt's default recipe) the LM head alone. Families not listed have no modelled NVFP4 checkpoint.
NVFP4_LINEAR_ROLES: dict[str, frozenset[str]] = {
    "minimax_m2": frozenset(), "kimi_k2": frozenset(), "qwen3_5_moe_text": frozenset(),
    "deepseek_v3": frozenset({"o_proj", "dense_mlp", "shared_experts"}),
    "deepseek_v32": frozenset({"o_proj", "dense_mlp", "shared_experts"}),
    "glm_moe_dsa": frozenset({"dense_mlp", "shared_experts"}),
    "qwen3_moe": frozenset({"qkv_proj", "o_proj"}),
    "llama": frozenset({"qkv_proj", "o_proj", "dense_mlp"}),
}

GIB = 2**30


def linear_dtype(model: ModelConfig, weight_dtype: str, role: str) -> str:
    """The dtype of ``model``'s linear layers of ``role`` (``qkv_proj``, ``o_proj``, ``dense_mlp``,
    ``shared_experts``, or ``other``) in the format ``weight_dtype``: NVFP4 where the family's NVFP4 checkpoint
    quantises them (:data:`NVFP4_LINEAR_ROLES`), else the format's linear dtype (:data:`WEIGHT_FORMATS`)."""
    if weight_dtype == "nvfp4" and role in NVFP4_LINEAR_ROLES.get(model.model_type, ()):
        return "nvfp4"
    return WEIGHT_FORMATS[weight_dtype][0]


def dtype_bytes(dtype: str) -> int:
    if dtype not in STORAGE_DTYPES:
        raise ServesimError(f"unknown dtype {dtype!r}; use one of {', '.join(STORAGE_DTYPES)}")
    return int(DTYPE_BYTES[dtype])


def layer_weight_bytes_per_gpu(model: ModelConfig, tp: int, layer: int, weight_dtype: str = "bf16",
                               expert_gpus: int | None = None, mlp_gpus: int | None = None) -> float:
    """Weight bytes of one layer on one GPU in the format ``weight_dtype`` (:data:`WEIGHT_FORMATS`).

    Linear weights are sharded by TP (KV heads replicated beyond their count), the routed experts over
    ``expert_gpus`` and the dense and shared MLPs over ``mlp_gpus`` (both ``tp`` by default; where ``tp`` is one
    attention data-parallel rank's GPUs, the experts take the whole TP group's, the MLPs as the engine runs them);
    norms, the router and the output projection's and down projections' biases are whole on every GPU.
    """
    if weight_dtype not in WEIGHT_FORMATS:
        raise ServesimError(f"unknown weight format {weight_dtype!r}; use one of {', '.join(WEIGHT_FORMATS)}")
    expert_dtype = WEIGHT_FORMATS[weight_dtype][1]
    expert_gpus, mlp_gpus = expert_gpus or tp, mlp_gpus or tp
    if model.is_mla:
        return _mla_layer_weight_bytes_per_gpu(model, tp, layer, weight_dtype, expert_dtype, expert_gpus, mlp_gpus)
    hidden, head_dim = model.hidden_size, model.head_dim
    q_per_gpu = model.q_size / tp
    kv_per_gpu = kv_heads_per_gpu(model, tp) * head_dim
    linear: dict[str, float] = {}  # weights by role (linear_dtype)
    if model.is_linear_layer(layer):
        linear["other"], other = _linear_mixer_weights_per_gpu(model, tp)
        other += 2 * hidden
    else:
        q_out = 2 * q_per_gpu if model.attn_output_gate else q_per_gpu
        linear["qkv_proj"], linear["o_proj"] = hidden * (q_out + 2 * kv_per_gpu), q_per_gpu * hidden
        other = 2 * hidden + {"": 0, "head": 2 * head_dim, "layer": q_per_gpu + kv_per_gpu}[model.qk_norm]
    if model.attention_bias:
        other += q_per_gpu + 2 * kv_per_gpu
    if model.o_proj_bias:
        other += hidden
    other_bytes = other * 2 + (4 * model.num_attention_heads / tp if model.attention_sinks else 0)  # FP32 sinks
    experts = 0.0
    if model.is_moe_layer(layer):
        inter = model.moe_intermediate_size / expert_gpus
        experts = model.num_experts * 3 * hidden * inter
        other_bytes += hidden * model.num_experts * DTYPE_BYTES[model.router_dtype]
        linear["shared_experts"] = 3 * hidden * model.shared_expert_intermediate_size / mlp_gpus
        other_bytes += hidden * 2 if model.shared_expert_gate else 0
        if model.moe_bias:
            other_bytes += model.num_experts * (1 + 2 * inter + hidden) * 2
    else:
        linear["dense_mlp"] = 3 * hidden * model.intermediate_size / mlp_gpus
    return (_linear_bytes(model, weight_dtype, linear) + experts * expert_weight_bytes(model, expert_dtype)
            + other_bytes)


def _linear_bytes(model: ModelConfig, weight_dtype: str, weights_by_role: dict[str, float]) -> float:
    """Bytes of linear weights counted by role, each role in its :func:`linear_dtype`."""
    return sum(count * DTYPE_BYTES[linear_dtype(model, weight_dtype, role)] for role, count in weights_by_role.items())


def _linear_mixer_weights_per_gpu(model: ModelConfig, tp: int) -> tuple[float, float]:
    """A Gated DeltaNet mixer on one GPU, as (TP-sharded linear weights, other 16-bit values): in_proj_qkvz and
    in_proj_ba column-split by head, out_proj row-split; the conv weights, A_log, dt_bias split by channel and
    head; the gated norm's one ``value_head_dim`` vector whole."""
    hidden, nv = model.hidden_size, model.linear_num_value_heads
    linear = (hidden * (2 * model.linear_key_dim + 2 * model.linear_value_dim + 2 * nv)
              + model.linear_value_dim * hidden) / tp
    other = (model.linear_conv_dim * model.linear_conv_kernel_dim + 2 * nv) / tp + model.linear_value_head_dim
    return linear, other


def _mla_layer_weight_bytes_per_gpu(model: ModelConfig, tp: int, layer: int, weight_dtype: str,
                                    expert_dtype: str, expert_gpus: int, mlp_gpus: int) -> float:
    """One MLA/DeepSeekMoE layer on one GPU (vLLM ``deepseek_v2.py``): q_a_proj and kv_a_proj_with_mqa are
    replicated (every GPU projects the whole latent), q_b_proj, kv_b_proj and o_proj are split by head; the
    absorbed decode keeps a 16-bit copy of kv_b_proj's K and V halves (``W_UK_T``, ``W_UV``, made at load). The
    shared experts and the dense MLPs of the first layers are TP-sharded like the routed experts; the router and
    its score-correction bias are whole."""
    hidden, heads = model.hidden_size, model.num_attention_heads / tp
    qk = model.qk_nope_head_dim + model.qk_rope_head_dim
    kv_b = model.kv_lora_rank * heads * (model.qk_nope_head_dim + model.v_head_dim)
    replicated = hidden * (model.q_lora_rank + model.mla_latent_dim) if model.q_lora_rank else (
        hidden * model.mla_latent_dim)
    norms = 2 * hidden + model.q_lora_rank + model.kv_lora_rank
    linear = {"other": replicated + (model.q_lora_rank or hidden) * heads * qk + kv_b,
              "o_proj": heads * model.v_head_dim * hidden}
    other_bytes = (norms + kv_b) * 2
    if model.is_dsa:  # the indexer, replicated: wq_b and wk quantised as the linears, weights_proj and k_norm 16-bit
        linear["other"] += (model.q_lora_rank * model.index_n_heads + hidden) * model.index_head_dim
        other_bytes += (hidden * model.index_n_heads + 2 * model.index_head_dim) * 2
    experts = 0.0
    if model.is_moe_layer(layer):
        experts = model.num_experts * 3 * hidden * model.moe_intermediate_size / expert_gpus
        linear["shared_experts"] = 3 * hidden * model.shared_expert_intermediate_size / mlp_gpus
        other_bytes += hidden * model.num_experts * DTYPE_BYTES[model.router_dtype] + 4 * model.num_experts
    else:
        linear["dense_mlp"] = 3 * hidden * model.intermediate_size / mlp_gpus
    return (_linear_bytes(model, weight_dtype, linear) + experts * expert_weight_bytes(model, expert_dtype)
            + other_bytes)


def expert_weight_bytes(model: ModelConfig, expert_dtype: str) -> float:
    """Bytes one routed-expert weight takes in ``expert_dtype``, scales included: INT4 with the checkpoint's own
    scale group (one BF16 scale per ``int4_group_size`` weights; Kimi-K2.5's 32 make 4.5 bits a weight)."""
    if expert_dtype == "int4" and model.int4_group_size:
        return (4 + 16 / model.int4_group_size) / 8
    return DTYPE_BYTES[expert_dtype]


def weight_bytes_per_gpu(model: ModelConfig, par: Parallelism, stage: int, weight_dtype: str = "bf16",
                         dp_mlp_over_group: bool = False) -> float:
    """Weight bytes one GPU of ``stage`` holds: its layers, plus the embedding (first stage) and the final norm and
    LM head (last stage). Embedding and LM head are vocab-parallel over TP (an attention data-parallel rank's GPUs)
    and stay 16-bit in every format. ``dp_mlp_over_group``: the engine splits the dense and shared MLPs over the
    whole TP group under attention data parallelism (SGLang), not over a rank's GPUs (vLLM)."""
    mlp_gpus = par.tp if dp_mlp_over_group else par.attention_tp
    total = sum(layer_weight_bytes_per_gpu(model, par.attention_tp, layer, weight_dtype, par.tp, mlp_gpus)
                for layer in stage_layers(model.num_layers, par.pp, stage))
    vocab_rows = padded_vocab_per_gpu(model, par.attention_tp)
    if stage == 0:
        total += vocab_rows * model.hidden_size * 2
    if stage == par.pp - 1:
        total += model.hidden_size * 2
        if not model.tie_word_embeddings or par.pp > 1:
            total += vocab_rows * model.hidden_size * 2
    return total


def _kv_bytes_per_token_of_layers(model: ModelConfig, par: Parallelism, layers: int, kv_dtype: str) -> float:
    """K and V of ``layers`` layers, split by TP over the KV heads; MLA's latent is whole on every GPU (each TP rank
    caches every token's ``kv_lora_rank + qk_rope_head_dim`` values, as the engines' MLA backends do), and so is
    DSA's indexer key (FP8 and its scales whatever the KV dtype: SGLang ``NSATokenToKVPool``)."""
    if model.is_mla:
        return layers * (model.mla_latent_dim * dtype_bytes(kv_dtype) + model.index_k_bytes)
    return 2 * layers * kv_heads_per_gpu(model, par.attention_tp) * model.head_dim * dtype_bytes(kv_dtype)


def kv_bytes_per_token_per_gpu(model: ModelConfig, par: Parallelism, stage: int, kv_dtype: str = "bf16") -> float:
    """KV-cache bytes one token takes on one GPU of ``stage`` in the layers that keep every token (K and V of that
    stage's full-attention layers)."""
    layers = stage_layers(model.num_layers, par.pp, stage)
    full = sum(1 for layer in layers if model.keeps_kv(layer))
    return _kv_bytes_per_token_of_layers(model, par, full, kv_dtype)


def linear_state_bytes_per_request_per_gpu(model: ModelConfig, par: Parallelism, stage: int) -> float:
    """Recurrent-state bytes one request holds on one GPU of ``stage`` in its Gated DeltaNet layers, whatever its
    context: conv window (16-bit) and SSM state (``linear_state_dtype``), both split by TP over heads/channels."""
    layers = stage_layers(model.num_layers, par.pp, stage)
    linear = sum(1 for layer in layers if model.is_linear_layer(layer))
    per_layer = model.linear_state_bytes(DTYPE_BYTES[model.linear_state_dtype]) / par.attention_tp if linear else 0.0
    return linear * per_layer


def window_kv_bytes_per_token_per_gpu(model: ModelConfig, par: Parallelism, stage: int,
                                      kv_dtype: str = "bf16") -> float:
    """KV-cache bytes one token of a request's window takes on one GPU of ``stage`` in its sliding-window layers."""
    layers = stage_layers(model.num_layers, par.pp, stage)
    sliding = sum(1 for layer in layers if model.is_sliding_layer(layer))
    return _kv_bytes_per_token_of_layers(model, par, sliding, kv_dtype)


def window_blocks(sliding_window: int, block_size: int) -> int:
    """Blocks a request holds at most in a sliding-window layer: vLLM's sliding-window KV manager frees every block
    whose tokens all fell out of the window, so the last ``window - 1`` tokens and the newest one span at most
    ``ceil((window - 1) / block_size) + 1`` blocks (vllm/v1/core/single_type_kv_cache_manager.py,
    ``SlidingWindowManager``)."""
    return -(-(sliding_window - 1) // block_size) + 1 if sliding_window else 0


@dataclass(frozen=True)
class MemoryReserve:
    """What an engine keeps back from the KV cache on each GPU, in bytes."""

    activation_bytes: float
    cuda_graph_bytes: float
    runtime_bytes: float  # CUDA context, NCCL and cuBLAS workspaces, custom all-reduce buffers

    @property
    def total_bytes(self) -> float:
        return self.activation_bytes + self.cuda_graph_bytes + self.runtime_bytes


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU memory of the most loaded pipeline stage, and the KV capacity it leaves.

    The pool is counted in tokens of the layers that keep every token (``kv_bytes_per_token``). A model with
    sliding-window layers also keeps, per request, at most ``window_blocks`` blocks of its window in those layers
    (``window_kv_bytes_per_token`` a token), from the same pool as vLLM's hybrid KV manager allocates them:
    :meth:`request_kv_tokens` and :meth:`max_sequences` count them; the serving simulator's schedulers charge each
    request its context alone (docs/models.md, "gpt-oss").
    """

    gpu_memory_bytes: float
    memory_fraction: float
    weight_bytes: float
    reserve: MemoryReserve
    kv_bytes_per_token: float  # per GPU, in the layers that keep every token
    kv_cache_bytes: float  # per GPU; negative when the model does not fit
    block_size: int
    window_kv_bytes_per_token: float = 0.0  # per GPU, in the sliding-window layers
    window_blocks: int = 0  # blocks of a request's window those layers keep at most
    state_bytes_per_request: float = 0.0  # per GPU, the linear-attention layers' recurrent state of one request

    @property
    def _block_bytes(self) -> float:
        """One block in every layer and one recurrent state: the least a request takes."""
        return (self.kv_bytes_per_token + self.window_kv_bytes_per_token) * self.block_size + (
            self.state_bytes_per_request)

    @property
    def fits(self) -> bool:
        return self.kv_cache_bytes >= self._block_bytes

    @property
    def kv_tokens(self) -> int:
        """Tokens the KV cache holds, in whole blocks, in the layers that keep every token."""
        if not self.fits:
            return 0
        blocks = int(self.kv_cache_bytes // (self.kv_bytes_per_token * self.block_size))
        return blocks * self.block_size

    def request_kv_tokens(self, context_tokens: int) -> float:
        """Pool tokens one request of ``context_tokens`` takes: its whole blocks, plus in the sliding-window layers
        the blocks of its window at their bytes' share of a pool token, and its recurrent state likewise."""
        blocks = -(-context_tokens // self.block_size)
        window_share = self.window_kv_bytes_per_token / self.kv_bytes_per_token
        state_tokens = self.state_bytes_per_request / self.kv_bytes_per_token
        return (blocks * self.block_size + min(blocks, self.window_blocks) * self.block_size * window_share
                + state_tokens)

    def max_sequences(self, context_tokens: int) -> int:
        """Sequences of ``context_tokens`` whose KV fits at once (:meth:`request_kv_tokens` each)."""
        return int(self.kv_tokens // self.request_kv_tokens(context_tokens))

    @property
    def needed_bytes(self) -> float:
        """Memory the engine needs on this GPU for weights, reserves and one KV block."""
        return self.weight_bytes + self.reserve.total_bytes + self._block_bytes


def plan_memory(
    model: ModelConfig,
    par: Parallelism,
    gpu_memory_bytes: float,
    memory_fraction: float,
    reserve: MemoryReserve,
    block_size: int,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    dp_mlp_over_group: bool = False,
) -> MemoryPlan:
    """KV capacity per GPU on the stage with the least room (stages differ by the embedding and LM head); with
    attention data parallelism, one rank's pool (``dp_mlp_over_group`` as in :func:`weight_bytes_per_gpu`)."""
    validate_parallelism(model, par)
    if not 0 < memory_fraction <= 1:
        raise ServesimError(f"memory fraction {memory_fraction} must be in (0, 1]")
    budget = gpu_memory_bytes * memory_fraction - reserve.total_bytes
    plans = []
    for stage in range(par.pp):
        per_token = kv_bytes_per_token_per_gpu(model, par, stage, kv_dtype)
        if not per_token:
            raise ServesimError(f"pipeline stage {stage} of {par} holds only sliding-window layers of {model.name}; "
                                f"servesim counts KV in full-attention layers, so give each stage one (fewer stages)")
        weights = weight_bytes_per_gpu(model, par, stage, weight_dtype, dp_mlp_over_group)
        plans.append(
            MemoryPlan(
                gpu_memory_bytes=gpu_memory_bytes,
                memory_fraction=memory_fraction,
                weight_bytes=weights,
                reserve=reserve,
                kv_bytes_per_token=per_token,
                kv_cache_bytes=budget - weights,
                block_size=block_size,
                window_kv_bytes_per_token=window_kv_bytes_per_token_per_gpu(model, par, stage, kv_dtype),
                window_blocks=window_blocks(model.sliding_window, block_size),
                state_bytes_per_request=linear_state_bytes_per_request_per_gpu(model, par, stage),
            )
        )
    return min(plans, key=lambda p: p.kv_cache_bytes / p.kv_bytes_per_token)
