"""Prompt identity: which requests share which leading tokens, so that a prefix cache can be simulated.

A request's prompt is a sequence of *segments*, each a run of tokens with an id: two prompts share the tokens of
their leading segments as long as the ids (and lengths) agree, segment by segment, the way the engines' chained
block hashes (vLLM) and radix tree (SGLang) see a shared prefix. The first segment that differs ends the shared
part; a segment whose id matches but whose length differs shares the shorter length and ends it.

The forms a trace or generator gives map onto segments directly:

- a ``prompt_id`` column: one segment per request (same id, same prompt);
- Mooncake-style ``hash_ids``: one segment per listed block (512 tokens each in the published traces; the last
  one takes what is left of the prompt);
- shared system prompts: the group's prefix, then a segment of the request's own;
- multi-turn sessions: the previous turn's segments, the previous answer, then the new message.

``output_ids`` name each request's generated text, so that a later prompt can contain it (the next turn of a
session): the simulator caches a finished request's prompt and output under these ids. ``-1`` marks text that no
later prompt repeats.

Segments are stored compressed-sparse-row style (``offsets[i]:offsets[i + 1]`` indexes request ``i``'s segments),
which keeps a million-request workload to a few arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: An id for text no other prompt repeats (a request's own question, an answer nobody quotes).
UNIQUE = -1


def _frozen(values, dtype) -> np.ndarray:
    array = np.ascontiguousarray(values, dtype=dtype)
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class PromptSegments:
    """Every request's prompt as segments of tokens with ids (see the module docstring)."""

    offsets: np.ndarray  # int64, requests + 1: request i's segments are [offsets[i], offsets[i + 1])
    segment_ids: np.ndarray  # int64, one per segment; UNIQUE (-1) for text no other prompt shares
    segment_tokens: np.ndarray  # int64, one per segment, each >= 1
    output_ids: np.ndarray  # int64, one per request: the id of its generated text, or UNIQUE

    def __post_init__(self) -> None:
        offsets = _frozen(self.offsets, np.int64)
        ids = _frozen(self.segment_ids, np.int64)
        tokens = _frozen(self.segment_tokens, np.int64)
        outputs = _frozen(self.output_ids, np.int64)
        if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or (np.diff(offsets) < 1).any():
            raise ValueError("offsets must start at 0 and give every request at least one segment")
        if not (ids.ndim == tokens.ndim == 1 and len(ids) == len(tokens) == offsets[-1]):
            raise ValueError("segment_ids and segment_tokens need one entry per segment (offsets[-1])")
        if len(tokens) and tokens.min() < 1:
            raise ValueError("every segment needs at least 1 token")
        if len(outputs) != len(offsets) - 1:
            raise ValueError("output_ids needs one entry per request")
        for name, value in (("offsets", offsets), ("segment_ids", ids), ("segment_tokens", tokens),
                            ("output_ids", outputs)):
            object.__setattr__(self, name, value)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def prompt_tokens(self) -> np.ndarray:
        """Each request's prompt length: the sum of its segments."""
        return np.add.reduceat(self.segment_tokens, self.offsets[:-1]) if len(self) else np.zeros(0, np.int64)

    def segments(self, request: int) -> tuple[np.ndarray, np.ndarray]:
        """Request ``request``'s (ids, tokens)."""
        lo, hi = self.offsets[request], self.offsets[request + 1]
        return self.segment_ids[lo:hi], self.segment_tokens[lo:hi]

    def take(self, rows: np.ndarray) -> PromptSegments:
        """The segments of requests ``rows``, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        lo, hi = self.offsets[rows], self.offsets[rows + 1]
        counts = hi - lo
        index = np.repeat(lo - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) + np.arange(counts.sum())
        return PromptSegments(np.concatenate([[0], np.cumsum(counts)]), self.segment_ids[index],
                              self.segment_tokens[index], self.output_ids[rows])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PromptSegments):
            return NotImplemented
        return all(np.array_equal(getattr(self, f), getattr(other, f))
                   for f in ("offsets", "segment_ids", "segment_tokens", "output_ids"))

    __hash__ = None  # holds arrays


def unique_prompts(prompt_tokens: np.ndarray) -> PromptSegments:
    """Every prompt its own text (no prefix shared): what a workload without prompt identity means."""
    n = len(prompt_tokens)
    return PromptSegments(np.arange(n + 1), np.full(n, UNIQUE), prompt_tokens, np.full(n, UNIQUE))
