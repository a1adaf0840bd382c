"""Tensor- and pipeline-parallel layouts and how they shard a model."""

from __future__ import annotations

from dataclasses import dataclass

from servesim.errors import ServesimError
from servesim.models.config import ModelConfig

#: vLLM pads the vocabulary of VocabParallelEmbedding / ParallelLMHead to a multiple of this
#: (vllm/model_executor/layers/vocab_parallel_embedding.py, DEFAULT_VOCAB_PADDING_SIZE).
VOCAB_PADDING = 64


@dataclass(frozen=True)
class Parallelism:
    """A replica's layout: ``tp`` GPUs per pipeline stage, ``pp`` stages."""

    tp: int = 1
    pp: int = 1

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp

    def __str__(self) -> str:
        return f"TP{self.tp}" + (f"xPP{self.pp}" if self.pp > 1 else "")


def validate_parallelism(model: ModelConfig, par: Parallelism) -> None:
    """Raise a :class:`ServesimError` for a layout the engines refuse."""
    if par.tp < 1 or par.pp < 1:
        raise ServesimError(f"TP and PP must be at least 1 (got TP={par.tp}, PP={par.pp})")
    heads = model.num_attention_heads
    if heads % par.tp:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0 and d <= 64]
        raise ServesimError(
            f"TP={par.tp} does not divide the {heads} attention heads of {model.name}; "
            f"use a TP among {', '.join(map(str, divisors))}"
        )
    kv = model.num_kv_heads
    if (par.tp < kv and kv % par.tp) or (par.tp > kv and par.tp % kv):
        raise ServesimError(
            f"TP={par.tp} and the {kv} KV heads of {model.name} do not divide one another; "
            f"pick a TP that divides {kv} or is a multiple of it"
        )
    widths = {"padded vocabulary": padded_vocab(model.vocab_size)}
    if len(model.moe_layer_indices) < model.num_layers:
        widths["intermediate_size"] = model.intermediate_size
    if model.is_moe:
        widths["moe_intermediate_size"] = model.moe_intermediate_size
    for what, width in widths.items():
        if width % par.tp:
            raise ServesimError(f"TP={par.tp} does not divide the {what} of {model.name} ({width}); pick another TP")
    if par.pp > model.num_layers:
        raise ServesimError(f"PP={par.pp} exceeds the {model.num_layers} layers of {model.name}; use PP ≤ {model.num_layers}")


def kv_heads_per_gpu(model: ModelConfig, tp: int) -> int:
    """KV heads each GPU holds: split when TP ≤ KV heads, replicated (one per GPU) beyond."""
    return max(1, model.num_kv_heads // tp)


def stage_layer_counts(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers per pipeline stage as vLLM splits them (vllm/distributed/utils.py ``get_pp_indices``).

    Each stage gets ``num_layers // pp``; the remainder goes one layer each to the stages before the last, counting
    back from the second-to-last, so that the last stage, which also runs the LM head, is not the heavier one.
    """
    counts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        counts[-i] += 1
    return tuple(counts)


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    counts = stage_layer_counts(num_layers, pp)
    start = sum(counts[:stage])
    return range(start, start + counts[stage])


def padded_vocab(vocab_size: int) -> int:
    """Vocabulary rows after the engines' padding to a multiple of :data:`VOCAB_PADDING`."""
    return -(-vocab_size // VOCAB_PADDING) * VOCAB_PADDING


def padded_vocab_per_gpu(model: ModelConfig, tp: int) -> int:
    return -(-padded_vocab(model.vocab_size) // tp)
