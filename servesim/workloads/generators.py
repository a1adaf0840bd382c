"""Synthetic workloads whose prompts share text, for simulating a prefix cache.

Each generator draws ``n`` requests with ``sample(rng, n)`` → ``(lengths, prefixes)``: an ``(n, 2)`` array of
(prompt, output) tokens, as a joint length distribution gives, and the prompts as id'd segments
(:class:`~servesim.workloads.prefix.PromptSegments`). They are written as specs, like the length specs, with each
length a whole number of tokens or a uniform range ``LOW-HIGH``:

- ``shared-prefix:GROUPS,PROMPTS_PER_GROUP:SYSTEM:QUESTION:OUTPUT``: GROUPS × PROMPTS_PER_GROUP distinct prompts,
  each its group's system prompt (SYSTEM tokens) followed by its own question (QUESTION tokens), as
  inference-perf's ``shared_prefix`` data and ``vllm bench serve --dataset-name prefix_repetition`` make them;
- ``repeat:DISTINCT:PROMPT:OUTPUT``: DISTINCT prompts sent again and again, like a benchmark cycling a prompt set;
- ``multi-turn:ACTIVE,TURNS:MESSAGE:OUTPUT``: conversations of TURNS turns, ACTIVE of them in progress at once;
  each turn's prompt is the previous turn's prompt, its answer, and a new message.

Two more reproduce the synthetic datasets of ``vllm bench serve`` (``vllm/benchmarks/datasets.py``):

- ``random:INPUT:OUTPUT[:RANGE_RATIO[:PREFIX_LEN]]``: ``--dataset-name random`` (:class:`RandomPrompts`);
- ``prefix-repetition:PREFIX_LEN:SUFFIX_LEN:NUM_PREFIXES:OUTPUT_LEN``: ``--dataset-name prefix_repetition``, which
  is :class:`SharedPrefix` with fixed lengths and one prompt per request (:class:`PrefixRepetition`).

Both prompt-set generators send every prompt once per pass, each pass in a fresh seeded random order. Named presets
(:data:`PRESETS`, e.g. ``chat-shared-prefix``) are generators with stated parameters, listed beside the profiles.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from servesim.errors import ServesimError
from servesim.limits import MAX_REQUESTS, MAX_TOKENS
from servesim.workloads.lengths import Fixed, LengthDistribution, LogNormal, Uniform
from servesim.workloads.prefix import UNIQUE, PromptSegments


def _check_count(label: str, value: int, low: int = 1, high: int = MAX_REQUESTS) -> None:
    if not low <= value <= high:
        raise ServesimError(f"{label} must be {low} to {high:,}, not {value}")


def _passes(rng: np.random.Generator, distinct: int, n: int) -> np.ndarray:
    """``n`` indices into ``distinct`` prompts: every prompt once per pass, each pass in a fresh random order."""
    passes = -(-n // distinct)
    return np.argsort(rng.random((passes, distinct)), axis=1).ravel()[:n]


def _csr(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)])


@dataclass(frozen=True)
class SharedPrefix:
    """``groups × prompts_per_group`` distinct prompts: the group's system prompt, then the prompt's own question.

    System prompt and question lengths are drawn once per group and per prompt (each prompt keeps its lengths when
    it comes round again); output lengths once per request. Segment ids: group ``g`` is ``g``, prompt ``p``'s
    question is ``groups + p``.
    """

    groups: int
    prompts_per_group: int
    system: LengthDistribution
    question: LengthDistribution
    output: LengthDistribution

    def __post_init__(self) -> None:
        _check_count("the number of groups", self.groups)
        _check_count("the prompts per group", self.prompts_per_group)
        _check_count("the number of distinct prompts (groups x prompts per group)",
                     self.groups * self.prompts_per_group)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, PromptSegments]:
        distinct = self.groups * self.prompts_per_group
        system = self.system.sample(rng, self.groups)
        question = self.question.sample(rng, distinct)
        prompt = _passes(rng, distinct, n)
        output = self.output.sample(rng, n)
        prefixes = self.segments(prompt, system, question)
        return np.column_stack([prefixes.prompt_tokens(), output]), prefixes

    def segments(self, prompt: np.ndarray, system: np.ndarray, question: np.ndarray) -> PromptSegments:
        """The prompt identity of requests sending the distinct prompts ``prompt`` (indices), given each group's
        system-prompt length ``system`` and each prompt's question length ``question``."""
        group = prompt // self.prompts_per_group
        ids = np.column_stack([group, self.groups + prompt]).ravel()
        tokens = np.column_stack([system[group], question[prompt]]).ravel()
        return PromptSegments(np.arange(0, 2 * len(prompt) + 1, 2), ids, tokens, np.full(len(prompt), UNIQUE))


@dataclass(frozen=True)
class RepeatedPrompts:
    """``distinct`` prompts, each one segment with id its index, sent again and again (lengths drawn once per
    prompt; output lengths once per request)."""

    distinct: int
    prompt: LengthDistribution
    output: LengthDistribution

    def __post_init__(self) -> None:
        _check_count("the number of distinct prompts", self.distinct)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, PromptSegments]:
        lengths = self.prompt.sample(rng, self.distinct)
        prompt = _passes(rng, self.distinct, n)
        output = self.output.sample(rng, n)
        prefixes = PromptSegments(np.arange(n + 1), prompt, lengths[prompt], np.full(n, UNIQUE))
        return np.column_stack([lengths[prompt], output]), prefixes


@dataclass(frozen=True)
class Conversations:
    """Multi-turn conversations: ``active`` of them in progress at once, ``turns`` turns each.

    Request ``i`` belongs to slot ``i % active``; each slot runs its conversations one after another, so turn
    ``k + 1`` of a conversation is the request ``active`` places after turn ``k`` (it arrives later, about
    ``active / rate`` seconds later in an open loop). Slot ``s``'s first conversation is cut to ``turns - s % turns``
    turns so that the slots are out of step from the start rather than all at turn 1 together.

    Turn ``k``'s prompt is the segments of turn ``k - 1``'s prompt, then turn ``k - 1``'s answer (its
    ``output_ids``), then a new message of ``message`` tokens. With ``system_prompts`` > 0, every conversation
    opens with one of that many system prompts (``system`` tokens each, drawn once per system prompt), picked at
    random. Ids: system prompt ``j`` is ``j``; request ``i``'s message is ``system_prompts + i`` and its answer
    ``system_prompts + n + i``, or UNIQUE when no later request holds it.
    """

    active: int
    turns: int
    message: LengthDistribution
    output: LengthDistribution
    system_prompts: int = 0
    system: LengthDistribution | None = None

    def __post_init__(self) -> None:
        _check_count("the number of conversations in progress", self.active)
        _check_count("the number of turns", self.turns, high=1000)
        _check_count("the number of system prompts", self.system_prompts, low=0)
        if (self.system_prompts > 0) != (self.system is not None):
            raise ValueError("give system prompt lengths exactly when there are system prompts")

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, PromptSegments]:
        active, turns = self.active, self.turns
        message = self.message.sample(rng, n)
        output = self.output.sample(rng, n)
        index = np.arange(n)
        slot, rank = index % active, index // active
        phase = slot % turns
        local = rank + phase
        turn = np.where(local < turns, local - phase, local % turns)
        length = np.where(local < turns, turns - phase, turns)  # turns of the conversation
        opener = index - active * turn  # the request of the conversation's first turn
        has_next = (turn + 1 < length) & (index + active < n)
        base = self.system_prompts
        message_id = np.where(has_next, base + index, UNIQUE)
        output_id = np.where(has_next, base + n + index, UNIQUE)

        system = int(self.system_prompts > 0)
        counts = system + 2 * turn + 1
        offsets = _csr(counts)
        owner = np.repeat(index, counts)
        position = np.arange(offsets[-1]) - np.repeat(offsets[:-1], counts) - system
        earlier = opener[owner] + active * (np.maximum(position, 0) // 2)  # the turn each segment comes from
        is_output = position % 2 == 1
        ids = np.where(is_output, base + n + earlier, base + earlier)
        tokens = np.where(is_output, output[earlier], message[earlier])
        own = offsets[1:] - 1  # each request's last segment: its own message
        ids[own] = message_id
        if system:
            choice = rng.integers(0, self.system_prompts, size=n)[opener]  # one draw per conversation opener
            system_tokens = self.system.sample(rng, self.system_prompts)
            ids[offsets[:-1]] = choice
            tokens[offsets[:-1]] = system_tokens[choice]
        prefixes = PromptSegments(offsets, ids, tokens, output_id)
        return np.column_stack([prefixes.prompt_tokens(), output]), prefixes


@dataclass(frozen=True)
class RandomPrompts:
    """``vllm bench serve --dataset-name random``: lengths uniform around a mean, behind one shared random prefix.

    Each request's sampled input and output lengths are uniform over the whole numbers
    ``[floor(L * (1 - range_ratio)), ceil(L * (1 + range_ratio))]`` (the output at least 1), as the benchmark's
    ``rng.integers(low, high + 1)`` draws them. With ``prefix_len`` P > 0 the benchmark generates ONE random prefix
    of P tokens and puts it in front of every prompt (the range ratio does not apply to it): the prompt is P plus
    the sampled length. Segments: the prefix (id 0, when P > 0), then the request's own tokens (UNIQUE; absent when
    the sampled length is 0).
    """

    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    prefix_len: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.range_ratio < 1.0:  # NaN fails too
            raise ServesimError(f"the random range ratio must be at least 0 and below 1 (e.g. 0.5), "
                                f"not {self.range_ratio}")
        _check_count("the random input length", self.input_len, high=MAX_TOKENS)
        _check_count("the random output length", self.output_len, high=MAX_TOKENS)
        _check_count("the random prefix length", self.prefix_len, low=0, high=MAX_TOKENS)
        (low, high), _ = self.bounds()
        if self.prefix_len + low < 1:
            raise ServesimError(f"random:{self.input_len}:{self.output_len}:{self.range_ratio} can draw a prompt of "
                                f"0 tokens; use a smaller range ratio (0 always works) or a prefix length of at "
                                f"least 1")
        if self.prefix_len + high > MAX_TOKENS:
            raise ServesimError(f"random prompts reach {self.prefix_len + high:,} tokens, beyond {MAX_TOKENS:,}; "
                                f"lower the input or prefix length")

    def bounds(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """The inclusive (low, high) of the sampled input length (prefix excluded) and of the output length."""
        r = self.range_ratio
        sampled = (math.floor(self.input_len * (1 - r)), math.ceil(self.input_len * (1 + r)))
        output = (max(math.floor(self.output_len * (1 - r)), 1), max(math.ceil(self.output_len * (1 + r)), 1))
        return sampled, output

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, PromptSegments]:
        (in_low, in_high), (out_low, out_high) = self.bounds()
        sampled = rng.integers(in_low, in_high + 1, size=n, dtype=np.int64)
        output = rng.integers(out_low, out_high + 1, size=n, dtype=np.int64)
        shared = int(self.prefix_len > 0)
        counts = shared + (sampled > 0)
        offsets = _csr(counts)
        ids = np.full(offsets[-1], UNIQUE, dtype=np.int64)
        tokens = np.repeat(sampled, counts)  # each request's last segment: its own tokens
        if shared:
            ids[offsets[:-1]] = 0
            tokens[offsets[:-1]] = self.prefix_len
        prefixes = PromptSegments(offsets, ids, tokens, np.full(n, UNIQUE))
        return np.column_stack([self.prefix_len + sampled, output]), prefixes


@dataclass(frozen=True)
class PrefixRepetition:
    """``vllm bench serve --dataset-name prefix_repetition``: ``num_prefixes`` random prefixes of ``prefix_len``
    tokens, each followed by ``n // num_prefixes`` random suffixes of ``suffix_len`` tokens, ``output_len`` output
    tokens each, the list shuffled.

    That is :class:`SharedPrefix` with ``num_prefixes`` groups of ``n // num_prefixes`` prompts, fixed lengths and
    one pass (one shuffle); :meth:`shared_prefix` builds it. The benchmark sends ``num_prefixes * (n //
    num_prefixes)`` requests, so an ``n`` that is not a multiple of ``num_prefixes`` is refused with that count.
    """

    prefix_len: int = 256
    suffix_len: int = 256
    num_prefixes: int = 10
    output_len: int = 128

    def __post_init__(self) -> None:
        self.shared_prefix(self.num_prefixes)  # checks the lengths and the count

    def shared_prefix(self, n: int) -> SharedPrefix:
        """The :class:`SharedPrefix` generator the benchmark's ``n`` requests are."""
        k = self.num_prefixes
        _check_count("the number of prefixes", k)
        if n % k:
            sent = k * (n // k)
            raise ServesimError(f"prefix-repetition with {k} prefixes takes a multiple of {k} requests, not {n} "
                                f"(vllm bench serve --num-prompts {n} sends {k} x ({n} // {k}) = {sent}); ask for "
                                f"{sent or k} requests")
        return SharedPrefix(k, n // k, Fixed(self.prefix_len), Fixed(self.suffix_len), Fixed(self.output_len))

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, PromptSegments]:
        return self.shared_prefix(n).sample(rng, n)


def _length(text: str) -> LengthDistribution:
    low, sep, high = text.partition("-")
    return Uniform(int(low), int(high)) if sep else Fixed(int(text))


def _pair(text: str) -> tuple[int, int]:
    first, second = text.split(",")
    return int(first), int(second)


def _shared_prefix(parts: list[str]):
    groups, per_group = _pair(parts[0])
    return SharedPrefix(groups, per_group, *(_length(p) for p in parts[1:]))


def _repeat(parts: list[str]):
    return RepeatedPrompts(int(parts[0]), *(_length(p) for p in parts[1:]))


def _multi_turn(parts: list[str]):
    active, turns = _pair(parts[0])
    return Conversations(active, turns, *(_length(p) for p in parts[1:]))


def _random(parts: list[str]):
    ratio = float(parts[2]) if len(parts) > 2 else 0.0
    return RandomPrompts(int(parts[0]), int(parts[1]), ratio, *(int(p) for p in parts[3:]))


def _prefix_repetition(parts: list[str]):
    return PrefixRepetition(*(int(p) for p in parts))


class GeneratorKind(NamedTuple):
    parse: Callable
    min_parts: int  # the parts after the kind
    max_parts: int
    syntax: str
    values: str  # what the parts may be, for the error message
    example: str


_LENGTHS = "whole numbers (a length may be a range LOW-HIGH)"

#: spec kind → how to read it (the example last)
GENERATOR_KINDS: dict[str, GeneratorKind] = {
    "shared-prefix": GeneratorKind(_shared_prefix, 4, 4, "GROUPS,PROMPTS_PER_GROUP:SYSTEM:QUESTION:OUTPUT", _LENGTHS,
                                   "shared-prefix:8,16:2048:128:256"),
    "repeat": GeneratorKind(_repeat, 3, 3, "DISTINCT:PROMPT:OUTPUT", _LENGTHS, "repeat:100:1024:128"),
    "multi-turn": GeneratorKind(_multi_turn, 3, 3, "ACTIVE,TURNS:MESSAGE:OUTPUT", _LENGTHS,
                                "multi-turn:32,5:256:256"),
    "random": GeneratorKind(_random, 2, 4, "INPUT:OUTPUT[:RANGE_RATIO[:PREFIX_LEN]]",
                            "whole numbers of tokens and a range ratio in [0, 1)", "random:1024:128:0.5:256"),
    "prefix-repetition": GeneratorKind(_prefix_repetition, 4, 4, "PREFIX_LEN:SUFFIX_LEN:NUM_PREFIXES:OUTPUT_LEN",
                                       "whole numbers", "prefix-repetition:256:256:10:128"),
}

Generator = SharedPrefix | RepeatedPrompts | Conversations | RandomPrompts | PrefixRepetition


def is_generator_spec(text: str) -> bool:
    return text.split(":", 1)[0].strip().lower() in GENERATOR_KINDS


def parse_generator_spec(spec: str) -> Generator:
    """Read a generator spec (see the module docstring); each length is a whole number or ``LOW-HIGH``."""
    kind, *parts = [part.strip() for part in spec.split(":")]
    kind = kind.lower()
    parse, low, high, syntax, values, example = GENERATOR_KINDS[kind]
    if not low <= len(parts) <= high:
        count = str(low) if low == high else f"{low} to {high}"
        raise ServesimError(f"workload spec {spec!r} needs {count} parts after {kind}: {kind}:{syntax}, "
                            f"e.g. {example}")
    try:
        return parse(parts)
    except (ValueError, TypeError):
        raise ServesimError(f"cannot read workload spec {spec!r}: write {kind}:{syntax} with {values}, "
                            f"e.g. {example}") from None


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    generator: Generator


#: Named generators, usable wherever a profile name is. Their parameters are illustrative, not fitted to a trace.
PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(
            "chat-shared-prefix",
            "chat conversations of 4 turns opening with one of 8 system prompts of 1,024 tokens; messages and "
            "answers log-normal, mean 256 tokens, cv 1; 64 conversations in progress",
            Conversations(active=64, turns=4, message=LogNormal(256, 1.0), output=LogNormal(256, 1.0),
                          system_prompts=8, system=Fixed(1024)),
        ),
    )
}


def preset_names() -> list[str]:
    return sorted(PRESETS)
