"""One engine step's batch: prefill chunks and decodes, and the text syntax users write it in."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from servesim.errors import ServesimError
from servesim.limits import MAX_TASKS_PER_LAUNCH, MAX_TOKENS

BATCH_SYNTAX_HELP = (
    "Comma-separated items, each optionally repeated with COUNTx: 'prefill:NEW' (a chunk of NEW prompt tokens, "
    "nothing cached), 'prefill:NEW+CACHED' (NEW tokens after CACHED tokens already in the KV cache, from a prefix "
    "hit or earlier chunks), 'decode:CONTEXT' (one new token after CONTEXT cached tokens). "
    "Example: 'prefill:2048, prefill:512+1024, decode:16x1024'."
)

_ITEM = re.compile(r"^(prefill|decode):(?:(\d+)x)?(\d+)(?:\+(\d+))?$")


@dataclass(frozen=True)
class PrefillChunk:
    """``new_tokens`` prompt tokens computed this step after ``cached_tokens`` already in the KV cache."""

    new_tokens: int
    cached_tokens: int = 0

    @property
    def kv_len(self) -> int:
        return self.new_tokens + self.cached_tokens


@dataclass(frozen=True)
class BatchSpec:
    """The requests of one engine step.

    ``decodes[i]`` is the context (tokens already cached) of a decoding request: it adds one token this step and
    its attention reads ``context + 1`` keys. Requests are ordered decodes first, then prefill chunks, as vLLM V1
    schedules running requests before waiting ones.
    """

    prefills: tuple[PrefillChunk, ...] = ()
    decodes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.prefills and not self.decodes:
            raise ServesimError("the batch is empty; give at least one 'prefill:N' or 'decode:CONTEXT' item")
        if any(p.new_tokens < 1 or p.cached_tokens < 0 for p in self.prefills):
            raise ServesimError("a prefill chunk needs at least 1 new token and a non-negative cached count")
        if self.decodes and min(self.decodes) < 0:
            raise ServesimError("a decode context must be 0 or more tokens")

    @property
    def num_requests(self) -> int:
        return len(self.prefills) + len(self.decodes)

    @cached_property
    def num_tokens(self) -> int:
        """Tokens this step computes: every new prefill token plus one per decode."""
        return sum(p.new_tokens for p in self.prefills) + len(self.decodes)

    @property
    def is_decode_only(self) -> bool:
        return not self.prefills

    # The lengths are worked out once per batch: a step's expansion reads them for every attention kernel, and a
    # batch of hundreds of decodes makes them long.
    @cached_property
    def query_lens(self) -> tuple[int, ...]:
        return (1,) * len(self.decodes) + tuple(p.new_tokens for p in self.prefills)

    @cached_property
    def kv_lens(self) -> tuple[int, ...]:
        """Keys each request's attention reads (cached plus new), in request order."""
        return tuple(c + 1 for c in self.decodes) + tuple(p.kv_len for p in self.prefills)

    def describe(self) -> str:
        """The batch in the syntax :func:`parse_batch` reads (repeats collapsed)."""
        items = [f"prefill:{p.new_tokens}" + (f"+{p.cached_tokens}" if p.cached_tokens else "") for p in self.prefills]
        items += [f"decode:{c}" for c in self.decodes]
        return ", ".join(_collapse(items))


def _collapse(items: list[str]) -> list[str]:
    out: list[tuple[int, str]] = []
    for item in items:
        if out and out[-1][1] == item:
            out[-1] = (out[-1][0] + 1, item)
        else:
            out.append((1, item))
    return [item if n == 1 else item.replace(":", f":{n}x", 1) for n, item in out]


def parse_batch(text: str) -> BatchSpec:
    """Read a batch written as :data:`BATCH_SYNTAX_HELP` describes."""
    prefills: list[PrefillChunk] = []
    decodes: list[int] = []
    for raw in text.split(","):
        item = raw.strip().replace(" ", "").lower()
        if not item:
            continue
        match = _ITEM.match(item)
        if match is None:
            raise ServesimError(f"cannot read batch item {raw.strip()!r}. {BATCH_SYNTAX_HELP}")
        kind, count, length, cached = match.groups()
        repeat, tokens, cached_tokens = int(count or 1), int(length), int(cached or 0)
        if repeat < 1:
            raise ServesimError(f"batch item {raw.strip()!r} repeats 0 times; write COUNTx with COUNT >= 1")
        if len(prefills) + len(decodes) + repeat > MAX_TASKS_PER_LAUNCH:  # refused before the tuple is built
            raise ServesimError(f"the batch holds more than {MAX_TASKS_PER_LAUNCH:,} requests; give fewer")
        if max(tokens, cached_tokens) > MAX_TOKENS:
            raise ServesimError(f"batch item {raw.strip()!r}: token counts go up to {MAX_TOKENS:,}")
        if kind == "decode":
            if cached is not None:
                raise ServesimError(
                    f"batch item {raw.strip()!r}: a decode takes one CONTEXT length, not NEW+CACHED; "
                    f"write e.g. 'decode:{length}'"
                )
            if tokens < 1:
                raise ServesimError(f"batch item {raw.strip()!r}: a decoding request has at least its 1 prompt "
                                    "token cached; write 'decode:CONTEXT' with CONTEXT >= 1")
            decodes.extend([tokens] * repeat)
        else:
            prefills.extend([PrefillChunk(tokens, cached_tokens)] * repeat)
    return BatchSpec(prefills=tuple(prefills), decodes=tuple(decodes))
