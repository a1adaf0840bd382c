"""Tensor-, expert- and pipeline-parallel layouts and how they shard a model."""

from __future__ import annotations

from dataclasses import dataclass

from servesim.errors import ServesimError
from servesim.models.config import ModelConfig

#: vLLM pads the vocabulary of VocabParallelEmbedding / ParallelLMHead to a multiple of this
#: (vllm/model_executor/layers/vocab_parallel_embedding.py, DEFAULT_VOCAB_PADDING_SIZE).
VOCAB_PADDING = 64


@dataclass(frozen=True)
class Parallelism:
    """A replica's layout: ``tp`` GPUs per pipeline stage, ``pp`` stages, and the MoE experts of each stage split
    over ``ep`` of its ``tp`` GPUs (expert parallelism inside the TP group: vLLM ``--enable-expert-parallel``, SGLang
    ``--ep-size``), each expert's intermediate width over the other ``tp / ep``. Every GPU holds the same bytes of
    expert weights either way.

    Attention and the dense layers are tensor-parallel over all ``tp`` GPUs, or, with attention data parallelism
    (``dp`` > 1: vLLM ``--data-parallel-size``, SGLang ``--dp --enable-dp-attention``), over ``tp / dp`` of them:
    the ``tp`` GPUs form ``dp`` ranks, each with its own scheduler, requests and KV cache, that join for the MoE
    layers (docs/parallelism.md)."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp

    @property
    def moe_tp(self) -> int:
        """The GPUs each expert's intermediate width is split over."""
        return self.tp // self.ep

    @property
    def attention_tp(self) -> int:
        """The GPUs attention and the dense layers are split over: one data-parallel rank's."""
        return self.tp // self.dp

    def __str__(self) -> str:
        return (f"TP{self.tp}" + (f"xPP{self.pp}" if self.pp > 1 else "") + (f" EP{self.ep}" if self.ep > 1 else "")
                + (f" DP{self.dp}" if self.dp > 1 else ""))


#: The largest TP or TP × PP suggested when no GPU bounds a layout: a replica of eight 8-GPU nodes.
UNBOUNDED_SUGGESTION_GPUS = 64


def _tp_problem(model: ModelConfig, tp: int, ep: int = 1, dp: int = 1) -> str | None:
    """Why the engines refuse tensor parallelism ``tp`` (with experts over ``ep`` of its GPUs, attention over
    ``tp / dp`` of them) for ``model`` (heads, KV heads, sharded widths), or None."""
    moe_tp, tp = tp // ep, tp // dp
    heads = model.num_attention_heads
    if heads % tp:
        return f"TP={tp} does not divide the {heads} attention heads of {model.name}"
    kv = model.num_kv_heads
    if (tp < kv and kv % tp) or (tp > kv and tp % kv):
        return f"TP={tp} and the {kv} KV heads of {model.name} do not divide one another"
    for what, count in (("linear-attention key heads", model.linear_num_key_heads),
                        ("linear-attention value heads", model.linear_num_value_heads)):
        if count and count % tp:
            return f"TP={tp} does not divide the {count} {what} of {model.name}"
    widths = {"padded vocabulary": padded_vocab(model.vocab_size)}
    if len(model.moe_layer_indices) < model.num_layers:
        widths["intermediate_size"] = model.intermediate_size
    for what, width in widths.items():
        if width % tp:
            return f"TP={tp} does not divide the {what} of {model.name} ({width})"
    if model.is_moe and model.moe_intermediate_size % moe_tp:
        split = f"TP={moe_tp}" if ep == 1 else f"TP/EP={moe_tp}"
        return f"{split} does not divide the moe_intermediate_size of {model.name} ({model.moe_intermediate_size})"
    return None


def _dp_problem(model: ModelConfig, par: Parallelism) -> str | None:
    """Why attention data parallelism ``par.dp`` cannot split ``par.tp`` GPUs into ranks, or None."""
    if par.dp == 1:
        return None
    if not model.is_moe:
        return (f"--dp (attention data parallelism) joins its ranks in MoE layers, and {model.name} has no experts; "
                f"serve copies of it with --replicas instead and drop --dp")
    if par.tp % par.dp:
        return f"DP={par.dp} does not divide TP={par.tp} (the ranks share the TP group's GPUs); use --dp {par.tp}"
    if par.pp > 1:
        return f"servesim models attention data parallelism inside one pipeline stage, not with PP={par.pp}; use --pp 1"
    return None


def _ep_problem(model: ModelConfig, par: Parallelism) -> str | None:
    """Why expert parallelism ``par.ep`` cannot split ``model``'s experts inside ``par.tp``, or None."""
    if par.ep == 1:
        return None
    if not model.is_moe:
        return f"--ep applies to MoE models and {model.name} has no experts; drop --ep"
    if par.tp % par.ep:
        full = f" or --ep {par.tp}" if model.num_experts % par.tp == 0 else ""
        return f"EP={par.ep} does not divide TP={par.tp} (experts are split over GPUs of the TP group); use --ep 1{full}"
    if model.num_experts % par.ep:
        return f"EP={par.ep} does not divide the {model.num_experts} experts of {model.name}; use --ep 1"
    return None


def accepted_tps(model: ModelConfig, max_gpus: int | None = None, pp: int = 1) -> list[int]:
    """Every TP the engines accept for ``model`` with ``pp`` stages in at most ``max_gpus`` GPUs
    (:data:`UNBOUNDED_SUGGESTION_GPUS` when None)."""
    limit = max_gpus or UNBOUNDED_SUGGESTION_GPUS
    return [tp for tp in range(1, limit // max(pp, 1) + 1) if _tp_problem(model, tp) is None]


def validate_parallelism(model: ModelConfig, par: Parallelism, max_gpus: int | None = None,
                         where: str = "one node") -> None:
    """Raise a :class:`ServesimError` for a layout the engines refuse, or one of more than ``max_gpus`` GPUs (the
    GPUs of ``where``). Every command checks layouts here, so each refuses the same ones, and each message's
    suggestions are layouts this check accepts."""
    if par.tp < 1 or par.pp < 1 or par.ep < 1 or par.dp < 1:
        raise ServesimError(f"TP, PP, EP and DP must be at least 1 (got TP={par.tp}, PP={par.pp}, EP={par.ep}, "
                            f"DP={par.dp})")
    problem = _ep_problem(model, par) or _dp_problem(model, par)
    if problem is not None:
        raise ServesimError(problem)

    def tp_choices() -> str:
        choices = accepted_tps(model, max_gpus, par.pp) or accepted_tps(model, max_gpus)
        return ", ".join(map(str, choices))

    if max_gpus is not None and par.tp > max_gpus:
        raise ServesimError(f"TP={par.tp} exceeds the {max_gpus} GPUs of {where}; use a TP among "
                            f"{tp_choices()}")
    problem = _tp_problem(model, par.tp, par.ep, par.dp)
    if problem is not None:
        if par.dp > 1 and _tp_problem(model, par.tp, par.ep, par.tp) is None:
            raise ServesimError(f"{problem} (TP/DP={par.attention_tp}: each attention data-parallel rank's GPUs); use "
                                f"--dp {par.tp}, or a TP among {tp_choices()} without --dp")
        raise ServesimError(f"{problem}; use a TP among {tp_choices()}")
    max_pp = model.num_layers if max_gpus is None else min(model.num_layers, max_gpus // par.tp)
    if par.pp > model.num_layers:
        raise ServesimError(f"PP={par.pp} exceeds the {model.num_layers} layers of {model.name}; use PP ≤ {max_pp}")
    if max_gpus is not None and par.num_gpus > max_gpus and par.tp == 1:
        raise ServesimError(f"PP={par.pp} exceeds the {max_gpus} GPUs of {where}; use PP ≤ {max_pp}")
    if max_gpus is not None and par.num_gpus > max_gpus:
        raise ServesimError(f"TP×PP={par.num_gpus} exceeds the {max_gpus} GPUs of {where}; use PP ≤ {max_pp} with "
                            f"TP={par.tp}, or a smaller TP")


def check_layout(model: ModelConfig, gpu, par: Parallelism) -> None:
    """The one check of a replica's layout on ``gpu``: what the engines accept for the model, within one node (one
    NVLink domain) of ``gpu``, as ``servesim plan`` searches layouts."""
    validate_parallelism(model, par, gpu.gpus_per_node, f"one {gpu.name} node")


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
