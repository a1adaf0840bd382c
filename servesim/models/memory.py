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
WEIGHT_FORMATS: dict[str, tuple[str, str]] = {
    "bf16": ("bf16", "bf16"), "fp16": ("fp16", "fp16"), "fp8": ("fp8", "fp8"),
}

GIB = 2**30


def dtype_bytes(dtype: str) -> int:
    if dtype not in STORAGE_DTYPES:
        raise ServesimError(f"unknown dtype {dtype!r}; use one of {', '.join(STORAGE_DTYPES)}")
    return int(DTYPE_BYTES[dtype])


def layer_weight_bytes_per_gpu(model: ModelConfig, tp: int, layer: int, weight_dtype: str = "bf16") -> float:
    """Weight bytes of one layer on one GPU in the format ``weight_dtype`` (:data:`WEIGHT_FORMATS`).

    Linear weights are sharded by TP (KV heads replicated beyond their count); norms and the router are whole on
    every GPU.
    """
    if weight_dtype not in WEIGHT_FORMATS:
        raise ServesimError(f"unknown weight format {weight_dtype!r}; use one of {', '.join(WEIGHT_FORMATS)}")
    linear_dtype, expert_dtype = WEIGHT_FORMATS[weight_dtype]
    hidden, head_dim = model.hidden_size, model.head_dim
    q_per_gpu = model.q_size / tp
    kv_per_gpu = kv_heads_per_gpu(model, tp) * head_dim
    linear = hidden * (q_per_gpu + 2 * kv_per_gpu) + q_per_gpu * hidden
    other = 2 * hidden + {"": 0, "head": 2 * head_dim, "layer": q_per_gpu + kv_per_gpu}[model.qk_norm]
    if model.attention_bias:
        other += q_per_gpu + 2 * kv_per_gpu
    other_bytes = other * 2
    experts = 0.0
    if model.is_moe_layer(layer):
        inter = model.moe_intermediate_size / tp
        experts = model.num_experts * 3 * hidden * inter
        other_bytes += hidden * model.num_experts * DTYPE_BYTES[model.router_dtype]
    else:
        linear += 3 * hidden * model.intermediate_size / tp
    return linear * DTYPE_BYTES[linear_dtype] + experts * DTYPE_BYTES[expert_dtype] + other_bytes


def weight_bytes_per_gpu(model: ModelConfig, par: Parallelism, stage: int, weight_dtype: str = "bf16") -> float:
    """Weight bytes one GPU of ``stage`` holds: its layers, plus the embedding (first stage) and the final norm and
    LM head (last stage). Embedding and LM head are vocab-parallel over TP and stay 16-bit in every format."""
    total = sum(layer_weight_bytes_per_gpu(model, par.tp, layer, weight_dtype)
                for layer in stage_layers(model.num_layers, par.pp, stage))
    vocab_rows = padded_vocab_per_gpu(model, par.tp)
    if stage == 0:
        total += vocab_rows * model.hidden_size * 2
    if stage == par.pp - 1:
        total += model.hidden_size * 2
        if not model.tie_word_embeddings or par.pp > 1:
            total += vocab_rows * model.hidden_size * 2
    return total


def kv_bytes_per_token_per_gpu(model: ModelConfig, par: Parallelism, stage: int, kv_dtype: str = "bf16") -> float:
    """KV-cache bytes one token takes on one GPU of ``stage`` (K and V of that stage's layers)."""
    layers = stage_layer_counts(model.num_layers, par.pp)[stage]
    return 2 * layers * kv_heads_per_gpu(model, par.tp) * model.head_dim * dtype_bytes(kv_dtype)


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
    """Per-GPU memory of the most loaded pipeline stage, and the KV capacity it leaves."""

    gpu_memory_bytes: float
    memory_fraction: float
    weight_bytes: float
    reserve: MemoryReserve
    kv_bytes_per_token: float  # per GPU
    kv_cache_bytes: float  # per GPU; negative when the model does not fit
    block_size: int

    @property
    def fits(self) -> bool:
        return self.kv_cache_bytes >= self.kv_bytes_per_token * self.block_size

    @property
    def kv_tokens(self) -> int:
        """Tokens the KV cache holds, in whole blocks."""
        if not self.fits:
            return 0
        blocks = int(self.kv_cache_bytes // (self.kv_bytes_per_token * self.block_size))
        return blocks * self.block_size

    def max_sequences(self, context_tokens: int) -> int:
        """Sequences of ``context_tokens`` whose KV fits at once (each takes whole blocks)."""
        blocks_per_seq = -(-context_tokens // self.block_size)
        return self.kv_tokens // (blocks_per_seq * self.block_size)

    @property
    def needed_bytes(self) -> float:
        """Memory the engine needs on this GPU for weights, reserves and one KV block."""
        return self.weight_bytes + self.reserve.total_bytes + self.kv_bytes_per_token * self.block_size


def plan_memory(
    model: ModelConfig,
    par: Parallelism,
    gpu_memory_bytes: float,
    memory_fraction: float,
    reserve: MemoryReserve,
    block_size: int,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> MemoryPlan:
    """KV capacity per GPU on the stage with the least room (stages differ by the embedding and LM head)."""
    validate_parallelism(model, par)
    if not 0 < memory_fraction <= 1:
        raise ServesimError(f"memory fraction {memory_fraction} must be in (0, 1]")
    budget = gpu_memory_bytes * memory_fraction - reserve.total_bytes
    plans = []
    for stage in range(par.pp):
        weights = weight_bytes_per_gpu(model, par, stage, weight_dtype)
        per_token = kv_bytes_per_token_per_gpu(model, par, stage, kv_dtype)
        plans.append(
            MemoryPlan(
                gpu_memory_bytes=gpu_memory_bytes,
                memory_fraction=memory_fraction,
                weight_bytes=weights,
                reserve=reserve,
                kv_bytes_per_token=per_token,
                kv_cache_bytes=budget - weights,
                block_size=block_size,
            )
        )
    return min(plans, key=lambda p: p.kv_cache_bytes / p.kv_bytes_per_token)
