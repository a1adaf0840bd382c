"""LLM architecture configuration, parsed from a Hugging Face ``config.json``."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from servesim.errors import ServesimError

#: Architectures (HF ``model_type``) whose layers servesim knows how to expand into kernels (docs/models.md).
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "minimax_m2", "gpt_oss",
                         "deepseek_v3", "kimi_k2", "kimi_k25", "deepseek_v32", "glm_moe_dsa", "qwen3_next",
                         "qwen3_5_moe", "llama4", "llama4_text", "deepseek_v2")
#: Multi-head latent attention and DeepSeekMoE (DeepSeek-V2 and V2-Lite, DeepSeek-V3/R1; Kimi-K2 and the text model
#: of Kimi-K2.5, whose ``text_config`` is a DeepSeek-V3 config): vLLM and SGLang ``models/deepseek_v2.py``.
_MLA_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2", "deepseek_v32", "glm_moe_dsa")
#: MLA with DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): a lightning indexer picks each query's top
#: ``index_topk`` cached tokens and MLA attends to those only (SGLang ``srt/layers/attention/nsa/nsa_indexer.py``;
#: vLLM ``models/deepseek_v2.py`` ``Indexer``).
_DSA_TYPES = ("deepseek_v32", "glm_moe_dsa")
#: Bytes one token's indexer key takes in the cache: FP8 values plus one FP32 scale per 128 (SGLang's
#: ``NSATokenToKVPool``: ``index_head_dim + index_head_dim // 128 * 4``, 132 for 128-wide keys).
INDEX_K_QUANT_BLOCK = 128
#: Hybrid linear attention (Qwen3-Next, the text model of Qwen3.5-MoE): Gated DeltaNet layers with a recurrent
#: state, every ``full_attention_interval``-th layer gated full attention, sparse MoE with a gated shared expert
#: (vLLM ``models/qwen3_next.py``, ``models/qwen3_5.py``; SGLang ``srt/models/qwen3_next.py``).
_HYBRID_LINEAR_TYPES = ("qwen3_next", "qwen3_5_moe_text")
#: Multimodal wrappers whose ``text_config`` holds the language model servesim times (the vision tower is left
#: out), with the text model types servesim reads there.
_TEXT_CONFIG_TYPES = {"kimi_k25": ("deepseek_v3", "kimi_k2"), "qwen3_5_moe": ("qwen3_5_moe_text",),
                      "llama4": ("llama4_text",)}
#: Llama 4 (Scout, Maverick; vLLM ``models/llama4.py``): every ``no_rope_layer_interval``-th layer attends to the
#: whole context without a rotary embedding (NoPE), the others to their ``attention_chunk_size``-token chunk
#: (chunked local attention) after RoPE and a weightless per-head RMSNorm of Q and K; MoE layers every
#: ``interleave_moe_layer_step``-th, each a top-1 sigmoid-routed expert beside one shared expert of the experts'
#: width (``intermediate_size``), the other layers a dense MLP of ``intermediate_size_mlp``.
_LLAMA4_TYPES = ("llama4_text",)
#: Architectures whose ``intermediate_size`` is each expert's width, every layer being MoE.
_ALL_MOE_TYPES = ("mixtral", "minimax_m2", "gpt_oss")
#: Per-head RMSNorm of Q and K over ``head_dim`` (Qwen3).
_HEAD_QK_NORM_TYPES = ("qwen3", "qwen3_moe", *_HYBRID_LINEAR_TYPES)
#: Attention with a learned per-head sink logit, biased QKV and output projections, and biased experts and router
#: (gpt-oss; vllm/model_executor/models/gpt_oss.py).
_SINK_TYPES = ("gpt_oss",)
#: A router kept in FP32 (MiniMax-M2: ``ReplicatedLinear(..., params_dtype=torch.float32)`` in vLLM's
#: minimax_m2.py).
_FP32_ROUTER_TYPES = ("minimax_m2",)
#: The per-layer attention kinds a config's ``layer_types`` may list (Hugging Face's names).
_LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")
#: The recurrent state's dtype names a config's ``mamba_ssm_dtype`` may give.
_STATE_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class ModelConfig:
    """The figures of a decoder-only transformer that decide its memory and its kernels.

    MoE fields are zero for dense models. ``moe_layer_indices`` lists the layers whose MLP is the sparse MoE block
    (all of them for Mixtral, Qwen3-MoE, MiniMax-M2 and gpt-oss as released). ``sliding_layer_indices`` lists the
    layers whose attention sees only the last ``sliding_window`` tokens (gpt-oss's even layers); the others attend
    to the whole context. ``checkpoint_quant`` is the weight format the checkpoint ships (its ``quantization_config``:
    ``""`` unquantised, ``fp8``, ``fp8-block``, ``mxfp4``, or the method's own name for formats servesim does not
    model). docs/models.md maps each family's config keys to these fields.
    """

    name: str
    source: str  # preset name, local path or hub id the config came from
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # bias on the Q, K and V projections (Qwen2, gpt-oss)
    qk_norm: str  # "" none; "head": RMSNorm of each head of Q and K (Qwen3); "layer": of all of Q, all of K (MiniMax)
    rope_theta: float
    rms_norm_eps: float
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    moe_layer_indices: tuple[int, ...] = ()
    rotary_dim: int = 0  # head dimensions the rotary embedding turns; 0: all of head_dim
    o_proj_bias: bool = False  # bias on the output projection (gpt-oss)
    attention_sinks: bool = False  # a learned FP32 logit per head in every softmax (gpt-oss)
    moe_bias: bool = False  # biases on the router and every expert's projections (gpt-oss)
    router_dtype: str = "bf16"  # the router's weights (FP32 for MiniMax-M2)
    sliding_window: int = 0  # keys a sliding layer's query sees, itself included
    sliding_layer_indices: tuple[int, ...] = ()
    checkpoint_quant: str = ""
    # Multi-head latent attention (DeepSeek-V3): zero for other attention. ``head_dim`` is then the query/key head
    # of the prefill (MHA) form, qk_nope_head_dim + qk_rope_head_dim, and ``num_kv_heads`` equals the query heads.
    q_lora_rank: int = 0  # 0: queries projected straight from the hidden states (no q_a/q_b pair)
    kv_lora_rank: int = 0  # width of the compressed KV latent each token caches
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0  # the rotary part of each query head and the one rotary key all heads share
    v_head_dim: int = 0
    # DeepSeekMoE: shared experts run as one dense MLP of moe_intermediate_size x n_shared_experts beside the
    # routed ones; routing picks the top topk_group of n_group expert groups, then top-k experts within them.
    n_shared_experts: int = 0
    n_group: int = 0
    topk_group: int = 0
    int4_group_size: int = 0  # a compressed-tensors INT4 checkpoint's weights per scale (Kimi-K2.5: 32); 0 none
    shared_expert_size: int = 0  # one shared expert's width when the config gives it apart (Qwen3-Next); 0: n_shared
    shared_expert_gate: bool = False  # a sigmoid gate (hidden -> 1) scales the shared expert's output (Qwen3-Next)
    attn_output_gate: bool = False  # q_proj also yields a per-head gate; attention's output times its sigmoid
    # Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): the layers listed keep a fixed recurrent state per
    # request (a causal-conv window and a per-value-head dk x dv matrix) instead of KV.
    linear_layer_indices: tuple[int, ...] = ()
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    linear_state_dtype: str = "bf16"  # the recurrent (SSM) state's dtype, the config's ``mamba_ssm_dtype``
    # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): zero without. The indexer's heads score every cached token
    # for each query with its own FP8 key cache; MLA then attends to the top ``index_topk`` only.
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    # Llama 4: layers without a rotary embedding (NoPE), which attend to the whole context; the others attend only
    # within their ``attention_chunk_size``-token chunk of the sequence when it is set (0: no chunking).
    nope_layer_indices: tuple[int, ...] = ()
    attention_chunk_size: int = 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention: each token caches one ``kv_lora_rank + qk_rope_head_dim`` latent per layer."""
        return self.kv_lora_rank > 0

    @property
    def mla_latent_dim(self) -> int:
        """Elements one token's MLA cache entry holds in one layer (the latent and the shared rotary key)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def is_dsa(self) -> bool:
        """DeepSeek Sparse Attention: MLA over each query's ``index_topk`` indexer-chosen keys."""
        return self.index_topk > 0

    @property
    def index_k_bytes(self) -> float:
        """Bytes one token's indexer key takes in one layer's cache: FP8 values and an FP32 scale per block."""
        return self.index_head_dim * (1 + 4 / INDEX_K_QUANT_BLOCK) if self.is_dsa else 0.0

    def attended_keys(self, kv_len: int) -> int:
        """Keys one query with ``kv_len`` keys before and at it attends to: all of them, or DSA's top-k."""
        return min(kv_len, self.index_topk) if self.is_dsa else kv_len

    def indexer_params(self) -> int:
        """The indexer's weights in one layer: wq_b (query LoRA to its heads), wk (hidden to one key), k_norm (a
        LayerNorm's weight and bias) and weights_proj (hidden to one gate per head)."""
        if not self.is_dsa:
            return 0
        heads, dim = self.index_n_heads, self.index_head_dim
        return self.q_lora_rank * heads * dim + self.hidden_size * dim + 2 * dim + self.hidden_size * heads

    @property
    def shared_expert_intermediate_size(self) -> int:
        return self.shared_expert_size or self.moe_intermediate_size * self.n_shared_experts

    def is_linear_layer(self, layer: int) -> bool:
        """A Gated DeltaNet layer: a recurrent state per request, no KV."""
        return layer in self.linear_layer_indices

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:
        """Channels of the causal convolution: Q, K and V of every head."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    def linear_attention_params(self) -> int:
        """One Gated DeltaNet layer's mixer: in_proj_qkvz (Q, K, V and the output gate z), in_proj_ba (beta and
        the decay's input a, one each per value head), the conv1d weights, A_log and dt_bias, the gated norm and
        out_proj."""
        hidden, nv = self.hidden_size, self.linear_num_value_heads
        proj = hidden * (2 * self.linear_key_dim + 2 * self.linear_value_dim) + hidden * 2 * nv
        return (proj + self.linear_conv_dim * self.linear_conv_kernel_dim + 2 * nv + self.linear_value_head_dim
                + self.linear_value_dim * hidden)

    @property
    def rope_dim(self) -> int:
        """Dimensions of each head the rotary embedding turns (partial rotary: fewer than ``head_dim``)."""
        return self.rotary_dim or self.head_dim

    def is_sliding_layer(self, layer: int) -> bool:
        return layer in self.sliding_layer_indices

    def keeps_kv(self, layer: int) -> bool:
        """A layer that caches every token's K and V: neither sliding-window nor linear attention."""
        return not self.is_sliding_layer(layer) and not self.is_linear_layer(layer)

    def attention_window(self, layer: int) -> int:
        """Keys a query of ``layer`` sees at most, itself included; 0 for a full-attention layer."""
        return self.sliding_window if self.is_sliding_layer(layer) else 0

    def uses_rope(self, layer: int) -> bool:
        """Whether ``layer`` turns Q and K with the rotary embedding (all but Llama 4's NoPE layers)."""
        return layer not in self.nope_layer_indices

    def attention_chunk(self, layer: int) -> int:
        """The chunk of the sequence a query of ``layer`` attends within (Llama 4's RoPE layers), 0 for none."""
        return self.attention_chunk_size if self.uses_rope(layer) else 0

    def has_qk_norm(self, layer: int) -> bool:
        """Whether ``layer`` norms Q and K (:attr:`qk_norm`): Llama 4 norms them in its RoPE layers only."""
        return bool(self.qk_norm) and self.uses_rope(layer)

    @functools.cached_property
    def attention_cycle_layers(self) -> int:
        """The fewest layers after which the layers' attention kinds (full, sliding, chunked, NoPE or linear) repeat:
        1 when every layer attends alike, 2 for gpt-oss's alternation, 4 for Qwen3.5's three linear layers to one
        full and for Llama 4's three chunked layers to one NoPE. One cycle's attention over its length is a layer's
        mean."""
        kinds = [(self.is_sliding_layer(i), self.is_linear_layer(i), self.uses_rope(i)) for i in range(self.num_layers)]
        return next(p for p in range(1, self.num_layers + 1)
                    if all(kinds[i] == kinds[i % p] for i in range(self.num_layers)))

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def is_moe_layer(self, layer: int) -> bool:
        return layer in self.moe_layer_indices

    # Parameter counts (whole model, no parallelism).
    def qk_norm_params(self) -> int:
        """Weights of the Q and K norms: one ``head_dim`` vector each per head norm, all of Q and K per layer norm."""
        return {"": 0, "head": 2 * self.head_dim, "layer": self.q_size + self.kv_size}[self.qk_norm]

    def mla_params_per_layer(self) -> int:
        """MLA's weights: q_a_proj, q_a_layernorm and q_b_proj (or q_proj), kv_a_proj_with_mqa, kv_a_layernorm,
        kv_b_proj (the per-head K-nope and V up-projections) and o_proj."""
        heads, qk = self.num_attention_heads, self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.q_lora_rank:
            q = self.hidden_size * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * heads * qk
        else:
            q = self.hidden_size * heads * qk
        kv = self.hidden_size * self.mla_latent_dim + self.kv_lora_rank
        kv += self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + heads * self.v_head_dim * self.hidden_size + self.indexer_params()

    def attention_params_per_layer(self) -> int:
        if self.is_mla:
            return self.mla_params_per_layer()
        q_out = 2 * self.q_size if self.attn_output_gate else self.q_size
        params = self.hidden_size * (q_out + 2 * self.kv_size) + self.q_size * self.hidden_size
        if self.attention_bias:
            params += self.q_size + 2 * self.kv_size
        if self.o_proj_bias:
            params += self.hidden_size
        if self.attention_sinks:
            params += self.num_attention_heads
        return params + self.qk_norm_params()

    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    def expert_params(self) -> int:
        """Weights of one expert's gate, up and down projections (no biases)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    def moe_bias_params(self) -> int:
        """Biases of one MoE layer: the router's, and each expert's on gate/up and down (gpt-oss); 0 without."""
        if not self.moe_bias:
            return 0
        return self.num_experts * (1 + 2 * self.moe_intermediate_size + self.hidden_size)

    def shared_expert_params(self) -> int:
        """Weights of a MoE layer's shared experts (one dense MLP of ``shared_expert_intermediate_size``)."""
        return 3 * self.hidden_size * self.shared_expert_intermediate_size

    def moe_mlp_params(self) -> int:
        router = self.hidden_size * self.num_experts + (self.hidden_size if self.shared_expert_gate else 0)
        if self.n_group:  # DeepSeek-V3's router also keeps a per-expert score-correction bias
            router += self.num_experts
        return self.num_experts * self.expert_params() + router + self.moe_bias_params() + self.shared_expert_params()

    def layer_params(self, layer: int) -> int:
        mlp = self.moe_mlp_params() if self.is_moe_layer(layer) else self.dense_mlp_params()
        mixer = self.linear_attention_params() if self.is_linear_layer(layer) else self.attention_params_per_layer()
        return mixer + mlp + 2 * self.hidden_size  # two RMSNorms

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def total_params(self) -> int:
        layers = sum(self.layer_params(i) for i in range(self.num_layers))
        return layers + self.embedding_params() + self.lm_head_params() + self.hidden_size  # final norm

    def active_params(self) -> int:
        """Parameters touched per token: MoE layers count only the routed experts."""
        total = self.total_params()
        inactive_experts = self.num_experts - self.num_experts_per_tok
        return total - len(self.moe_layer_indices) * inactive_experts * self.expert_params()

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2) -> float:
        """KV-cache bytes one token occupies across the whole model (K and V, every layer; MLA: the one latent of
        ``mla_latent_dim`` values a layer, plus DSA's indexer key). Sliding-window layers keep only their window's
        tokens, so a long context costs less (servesim/models/memory.py)."""
        layers = self.num_layers - len(self.linear_layer_indices)  # linear layers keep a state, not KV
        if self.is_mla:
            return layers * (self.mla_latent_dim * kv_dtype_bytes + self.index_k_bytes)
        return 2 * layers * self.num_kv_heads * self.head_dim * kv_dtype_bytes

    def linear_state_bytes(self, state_dtype_bytes: float, conv_dtype_bytes: float = 2) -> float:
        """One request's recurrent state in one linear layer, whole model: the last ``conv_kernel_dim - 1`` inputs
        of every conv channel and one ``key_head_dim x value_head_dim`` matrix per value head. It does not grow
        with the context."""
        conv = (self.linear_conv_kernel_dim - 1) * self.linear_conv_dim * conv_dtype_bytes
        ssm = self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim * state_dtype_bytes
        return conv + ssm


#: What to do about requests longer than the context, where the caller has nothing more specific to say.
CAP_LENGTHS = ("cap the workload's lengths (servesim workload SOURCE --max-prompt-tokens N --max-output-tokens N "
               "--out FILE, adding --qps R or --concurrency C for a generated workload, then pass FILE) or choose a "
               "model with a longer context")


def check_context(model: ModelConfig, prompt_plus_output_tokens: np.ndarray | int, fix: str = CAP_LENGTHS) -> None:
    """Refuse requests longer than the model's context window (``max_position_embeddings``): vLLM and SGLang reject
    them, so there is no serving time to predict. A config without the key is not checked."""
    limit = model.max_position_embeddings
    tokens = np.atleast_1d(prompt_plus_output_tokens)
    over = int((tokens > limit).sum()) if limit else 0
    if over:
        longest = f"{int(tokens.max()):,} prompt + output tokens"
        what = longest if tokens.size == 1 else f"{over:,} of {tokens.size:,} requests (up to {longest})"
        raise ServesimError(f"{what} exceed {model.name}'s context of {limit:,} tokens (max_position_embeddings); "
                            f"{fix}")


def _first(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def _count(value: Any, key: str, source: str) -> int:
    """A size of the config, which must be a whole number of at least 1 (not a float, a string or a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ServesimError(f"model config {source!r}: {key} is {value!r}; it must be a whole number of at least 1")
    return value


def config_from_hf_dict(cfg: Mapping[str, Any], name: str, source: str) -> ModelConfig:
    """Build a :class:`ModelConfig` from the keys of a Hugging Face ``config.json``."""
    model_type = cfg.get("model_type", "")
    if model_type in _TEXT_CONFIG_TYPES:
        text = cfg.get("text_config")
        if not isinstance(text, Mapping):
            raise ServesimError(f"model config {source!r}: model_type {model_type!r} needs a text_config object "
                                f"holding the language model's keys")
        # The wrapper's quantisation section, if any, applies when the text model declares none.
        cfg = {"quantization_config": cfg.get("quantization_config"), **text}
        readable = _TEXT_CONFIG_TYPES[model_type]
        model_type = cfg.get("model_type", "")
        if model_type not in readable:
            raise ServesimError(f"model config {source!r}: its text_config has model_type {model_type!r}; servesim "
                                f"reads {', '.join(readable)} there")
    if model_type not in SUPPORTED_MODEL_TYPES and model_type not in _HYBRID_LINEAR_TYPES:
        raise ServesimError(
            f"model {name!r} has model_type {model_type!r}; servesim supports {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    hybrid = model_type in _HYBRID_LINEAR_TYPES
    llama4: dict[str, Any] = {}
    if model_type in _LLAMA4_TYPES:
        generic, llama4 = _llama4_fields(cfg, source)
        cfg = {**cfg, **generic}
    if hybrid and cfg.get("intermediate_size") is None and cfg.get("moe_intermediate_size") is not None:
        cfg = {**cfg, "intermediate_size": cfg["moe_intermediate_size"]}  # Qwen3.5-MoE: every layer is MoE
    try:
        hidden, heads, layers, vocab, intermediate = (
            _count(cfg[key], key, source)
            for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "intermediate_size"))
    except KeyError as exc:
        raise ServesimError(f"model config {source!r} lacks the key {exc.args[0]!r}") from None
    kv_heads = _count(_first(cfg, "num_key_value_heads", default=heads), "num_key_value_heads", source)
    if heads % kv_heads:
        raise ServesimError(f"model config {source!r}: {heads} attention heads do not share {kv_heads} KV heads "
                            f"evenly (num_attention_heads must be a multiple of num_key_value_heads)")
    if _first(cfg, "head_dim") is None and hidden % heads:
        raise ServesimError(f"model config {source!r}: hidden_size {hidden} is not a multiple of its {heads} "
                            f"attention heads; give head_dim")
    head_dim = _count(_first(cfg, "head_dim", default=hidden // heads), "head_dim", source)

    mla = _mla_fields(cfg, source, model_type in _DSA_TYPES) if model_type in _MLA_TYPES else {}
    if mla:
        head_dim = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
        kv_heads = heads  # the prefill (MHA) form: every query head has its own K and V
    num_experts = int(_first(cfg, "num_experts", "num_local_experts", "n_routed_experts", default=0))
    moe_layers: tuple[int, ...] = ()
    moe_intermediate = 0
    if num_experts:
        if mla:
            moe_intermediate = _count(cfg.get("moe_intermediate_size"), "moe_intermediate_size", source)
            first_dense = int(cfg.get("first_k_dense_replace", 0) or 0)
            freq = int(cfg.get("moe_layer_freq", 1) or 1)
            moe_layers = tuple(i for i in range(layers) if i >= first_dense and i % freq == 0)
        elif model_type in _ALL_MOE_TYPES:
            moe_intermediate = intermediate
            moe_layers = tuple(range(layers))
        else:
            moe_intermediate = int(cfg["moe_intermediate_size"])
            step = int(cfg.get("decoder_sparse_step", 1) or 1)
            dense_only = set(cfg.get("mlp_only_layers") or [])
            moe_layers = tuple(i for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    top_k = int(_first(cfg, "num_experts_per_tok", "experts_per_token", default=0)) if num_experts else 0
    sliding_layers, window = _sliding_layers(cfg, layers, source)
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), Mapping) else {}
    rotary_dim = int(_first(cfg, "rotary_dim", default=0))
    partial = _first(cfg, "partial_rotary_factor", default=rope.get("partial_rotary_factor"))
    if not rotary_dim and partial is not None:
        rotary_dim = int(head_dim * float(partial))
    linear = _linear_fields(cfg, layers, source) if hybrid else {}
    if not 0 <= rotary_dim <= head_dim or rotary_dim % 2:
        raise ServesimError(f"model config {source!r}: rotary_dim {rotary_dim} must be an even number of at most "
                            f"head_dim {head_dim}")
    sinks = model_type in _SINK_TYPES

    return ModelConfig(
        name=name,
        source=source,
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 0)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
        qk_norm=_qk_norm(cfg, model_type),
        rope_theta=float(_first(cfg, "rope_theta", default=rope.get("rope_theta", 10000.0))),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=moe_intermediate,
        norm_topk_prob=bool(cfg.get("norm_topk_prob", model_type in _ALL_MOE_TYPES or hybrid)) if num_experts else False,
        moe_layer_indices=moe_layers,
        rotary_dim=rotary_dim if rotary_dim != head_dim else 0,
        o_proj_bias=sinks,
        attention_sinks=sinks,
        moe_bias=sinks and num_experts > 0,
        router_dtype="fp32" if model_type in _FP32_ROUTER_TYPES else "bf16",
        sliding_window=window,
        sliding_layer_indices=sliding_layers,
        checkpoint_quant=checkpoint_quant(cfg.get("quantization_config")),
        int4_group_size=int4_group_size(cfg.get("quantization_config")),
        **mla,
        **linear,
        **llama4,
    )


def _linear_fields(cfg: Mapping[str, Any], layers: int, source: str) -> dict[str, Any]:
    """The Gated DeltaNet keys of a Qwen3-Next / Qwen3.5 config: which layers are linear (``layer_types``, else
    all but every ``full_attention_interval``-th), their heads, the conv width and the state's dtype; the full
    layers' output gate and the gated shared expert."""
    kinds = cfg.get("layer_types")
    if kinds:
        linear = tuple(i for i, kind in enumerate(kinds) if kind == "linear_attention")
    else:
        interval = _count(cfg.get("full_attention_interval"), "full_attention_interval", source)
        linear = tuple(i for i in range(layers) if (i + 1) % interval)
    if len(linear) == layers:
        raise ServesimError(f"model config {source!r}: every layer is linear_attention; servesim's KV accounting "
                            f"needs at least one full_attention layer")
    fields: dict[str, Any] = {key: _count(cfg.get(key), key, source) for key in (
        "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
        "linear_conv_kernel_dim")}
    if fields["linear_num_value_heads"] % fields["linear_num_key_heads"]:
        raise ServesimError(f"model config {source!r}: linear_num_value_heads must be a multiple of "
                            f"linear_num_key_heads")
    state = str(cfg.get("mamba_ssm_dtype") or "bfloat16")
    if state not in _STATE_DTYPES:
        raise ServesimError(f"model config {source!r}: mamba_ssm_dtype {state!r} is not one of "
                            f"{', '.join(_STATE_DTYPES)}")
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    return dict(fields, linear_layer_indices=linear, linear_state_dtype=_STATE_DTYPES[state],
                attn_output_gate=bool(cfg.get("attn_output_gate", True)), shared_expert_size=shared,
                n_shared_experts=1 if shared else 0, shared_expert_gate=bool(shared))


def _mla_fields(cfg: Mapping[str, Any], source: str, dsa: bool) -> dict[str, int]:
    """The MLA and DeepSeekMoE keys of a DeepSeek-V3-style config (``q_lora_rank`` may be null: no query LoRA),
    and with ``dsa`` the indexer's (``index_n_heads``, ``index_head_dim``, ``index_topk``)."""
    fields = {key: _count(cfg.get(key), key, source)
              for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    q_lora = cfg.get("q_lora_rank")
    fields["q_lora_rank"] = 0 if q_lora is None else _count(q_lora, "q_lora_rank", source)
    if dsa:
        fields |= {key: _count(cfg.get(key), key, source) for key in ("index_n_heads", "index_head_dim", "index_topk")}
        if not fields["q_lora_rank"] or fields["index_head_dim"] % INDEX_K_QUANT_BLOCK:
            raise ServesimError(f"model config {source!r}: DeepSeek Sparse Attention needs a q_lora_rank (the "
                                f"indexer's queries come from it) and an index_head_dim that is a multiple of "
                                f"{INDEX_K_QUANT_BLOCK}")
    if cfg.get("n_routed_experts"):
        fields["n_shared_experts"] = int(cfg.get("n_shared_experts") or 0)
        groups = int(cfg.get("n_group") or 1)
        topk_groups = int(cfg.get("topk_group") or 1)
        experts = int(cfg["n_routed_experts"])
        if experts % groups or not 1 <= topk_groups <= groups:
            raise ServesimError(f"model config {source!r}: {experts} routed experts in n_group {groups} groups, "
                                f"topk_group {topk_groups}: the groups must split the experts evenly and topk_group "
                                f"be 1 to n_group")
        fields["n_group"], fields["topk_group"] = groups, topk_groups
    return fields


def _qk_norm(cfg: Mapping[str, Any], model_type: str) -> str:
    """Qwen3 norms each head of Q and K; a config with ``use_qk_norm`` (MiniMax-M2) says how with ``qk_norm_type``:
    ``per_layer`` is one RMSNorm over all of Q and one over all of K (vLLM ``MiniMaxText01RMSNormTP``). Llama 4's
    ``use_qk_norm`` norms each head (an RMSNorm without weights, in its RoPE layers)."""
    if model_type in _HEAD_QK_NORM_TYPES:
        return "head"
    if model_type in _LLAMA4_TYPES:
        return "head" if cfg.get("use_qk_norm") else ""
    if not cfg.get("use_qk_norm"):
        return ""
    return "layer" if cfg.get("qk_norm_type", "per_layer") == "per_layer" else "head"


def _llama4_fields(cfg: Mapping[str, Any], source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Llama 4 config as (the generic keys its MLPs read as, its own fields). The generic keys: the dense layers'
    width (``intermediate_size_mlp``), the experts' (``intermediate_size``), and the layers with a dense MLP: those
    not in ``moe_layers``, or not every ``interleave_moe_layer_step``-th (vLLM: ``(layer + 1) % step == 0``; step 0:
    none is MoE). Its fields: the NoPE layers (``no_rope_layers``: 1 where a layer uses RoPE, else every
    ``no_rope_layer_interval``-th layer, 4 by default, as transformers' ``Llama4TextConfig`` fills it in), the chunk
    its RoPE layers attend within and its one shared expert."""
    layers = _count(cfg.get("num_hidden_layers"), "num_hidden_layers", source)
    rope = cfg.get("no_rope_layers")
    if rope:
        if not isinstance(rope, list) or len(rope) != layers or any(flag not in (0, 1) for flag in rope):
            raise ServesimError(f"model config {source!r}: no_rope_layers must give 0 (NoPE) or 1 (RoPE) for each of "
                                f"the {layers} layers")
        nope = tuple(i for i, flag in enumerate(rope) if flag == 0)
    else:
        interval = _count(cfg.get("no_rope_layer_interval", 4), "no_rope_layer_interval", source)
        nope = tuple(i for i in range(layers) if (i + 1) % interval == 0)
    moe = cfg.get("moe_layers")
    if moe is None:
        step = cfg.get("interleave_moe_layer_step", 1)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ServesimError(f"model config {source!r}: interleave_moe_layer_step is {step!r}; it must be a whole "
                                f"number of at least 0")
        moe = [i for i in range(layers) if step and (i + 1) % step == 0]
    chunk = cfg.get("attention_chunk_size")
    moe = set(moe)
    generic = {"intermediate_size": _count(cfg.get("intermediate_size_mlp"), "intermediate_size_mlp", source),
               "moe_intermediate_size": cfg.get("intermediate_size"), "decoder_sparse_step": 1,
               "mlp_only_layers": [i for i in range(layers) if i not in moe]}
    return generic, {"nope_layer_indices": nope,
                     "attention_chunk_size": _count(chunk, "attention_chunk_size", source) if chunk is not None else 0,
                     "n_shared_experts": 1 if moe else 0}


def _sliding_layers(cfg: Mapping[str, Any], layers: int, source: str) -> tuple[tuple[int, ...], int]:
    """The sliding-window layers and their window, from ``layer_types`` (Hugging Face's per-layer attention kinds,
    as gpt-oss's config.json gives them). A config without ``layer_types`` attends fully in every layer: servesim
    does not read ``sliding_window`` alone (Qwen2 configs carry one with ``use_sliding_window`` false)."""
    kinds = cfg.get("layer_types")
    if not kinds:
        return (), 0
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in _LAYER_TYPES for k in kinds):
        raise ServesimError(f"model config {source!r}: layer_types must list one of {', '.join(_LAYER_TYPES)} for "
                            f"each of the {layers} layers")
    sliding = tuple(i for i, kind in enumerate(kinds) if kind == "sliding_attention")
    if not sliding:
        return (), 0
    if len(sliding) == sum(kind != "linear_attention" for kind in kinds):
        raise ServesimError(f"model config {source!r}: every layer is sliding_attention; servesim's KV accounting "
                            f"needs at least one full_attention layer")
    return sliding, _count(cfg.get("sliding_window"), "sliding_window", source)


def int4_group_size(quantization_config: Any) -> int:
    """Weights per scale of the 4-bit integer weights a compressed-tensors ``quantization_config`` declares
    (``config_groups.*.weights``: ``num_bits`` 4, ``type`` int, ``strategy`` group), or 0."""
    if not isinstance(quantization_config, Mapping) or quantization_config.get("quant_method") != "compressed-tensors":
        return 0
    for group in (quantization_config.get("config_groups") or {}).values():
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if (isinstance(weights, Mapping) and weights.get("num_bits") == 4 and weights.get("type") == "int"
                and isinstance(weights.get("group_size"), int) and weights["group_size"] > 0):
            return weights["group_size"]
    return 0


def checkpoint_quant(quantization_config: Any) -> str:
    """The weight format a ``quantization_config`` declares: ``""`` none, ``fp8`` (per-tensor scales),
    ``fp8-block`` (``weight_block_size`` given), ``mxfp4``, ``nvfp4`` (NVIDIA ModelOpt's ``quant_algo`` NVFP4), else
    the ``quant_method`` itself."""
    if not isinstance(quantization_config, Mapping):
        return ""
    method = str(quantization_config.get("quant_method", ""))
    if method == "fp8" and quantization_config.get("weight_block_size"):
        return "fp8-block"
    if method == "modelopt" and quantization_config.get("quant_algo") == "NVFP4":
        return "nvfp4"
    return method
