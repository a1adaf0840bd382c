"""What a serving engine knows about each request while it runs, and what one scheduled step is.

Token accounting shared by both engines: a request's sequence is its prompt plus the tokens generated so far.
``computed`` tokens of it have their KV in the cache. A step that brings ``computed`` up to the sequence length
samples the next token: the last prompt chunk samples the first output token, each decode one more. After a
preemption (vLLM) or retraction (SGLang) ``computed`` drops to 0 and the whole sequence is recomputed, as both
engines do; tokens already streamed to the client stay streamed.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

from servesim.kernels.batch import BatchSpec, PrefillChunk


class RequestState:
    """Mutable per-request state inside one replica (the simulator's hot loop touches it every step)."""

    __slots__ = (
        "rid", "prompt", "output", "issue_s", "computed", "generated", "kv_held", "first_scheduled_s",
        "first_token_s", "token_times_s", "token_base", "preemptions", "in_flight", "segment_ids", "segment_tokens", "output_id", "cache_path",
        "cached_units", "cached_tokens",
    )

    def __init__(self, rid: int, prompt: int, output: int, issue_s: float, token_times_s: np.ndarray,
                 token_base: int, segment_ids=None, segment_tokens=None, output_id: int = -1) -> None:
        self.rid = rid
        self.prompt = prompt
        self.output = output
        self.issue_s = issue_s
        self.computed = 0
        self.generated = 0
        self.kv_held = 0  # KV units held: vLLM blocks, SGLang token slots
        self.first_scheduled_s = -1.0
        self.first_token_s = -1.0
        # Token k of this request is sampled at token_times_s[token_base + k]: one float64 buffer for every request
        # of the run (each request's output length is known in advance), not a list of floats per request.
        self.token_times_s = token_times_s
        self.token_base = token_base
        self.preemptions = 0
        self.in_flight = False  # part of a micro-batch still in the pipeline
        # Prompt identity (servesim/workloads/prefix.py), None without it; the prefix-cache nodes the request
        # references and the KV units it reads from them (servesim/serving/scheduler.py).
        self.segment_ids = segment_ids
        self.segment_tokens = segment_tokens
        self.output_id = output_id
        self.cache_path: list = []
        self.cached_units = 0
        self.cached_tokens = 0  # prompt tokens its last admission found in the cache

    @property
    def seq_len(self) -> int:
        return self.prompt + self.generated

    @property
    def is_decoding(self) -> bool:
        """Only the last sampled token is left to compute."""
        return self.generated > 0 and self.computed == self.seq_len - 1


@dataclass(frozen=True, eq=False)
class Step:
    """One scheduled engine step (a micro-batch with pipeline parallelism): its requests, the new tokens each
    computes, and the batch the kernels see, summarised: how many requests decode, their total and longest
    context, and the prompt chunks (new tokens after cached ones)."""

    requests: tuple[RequestState, ...]
    new_tokens: tuple[int, ...]
    num_decodes: int
    decode_context_tokens: int
    decode_max_context: int  # 0 without decodes
    prefills: tuple[PrefillChunk, ...]

    def batch(self) -> BatchSpec:
        """The exact batch the kernels see: decodes by context, prompt chunks by (new, cached)."""
        decodes = tuple(r.computed for r, new in zip(self.requests, self.new_tokens) if new == 1 and r.is_decoding)
        return BatchSpec(prefills=self.prefills, decodes=decodes)


def make_step(requests: list[RequestState], new_tokens: list[int]) -> Step:
    """A step from scheduled requests (before they run: ``computed`` is what the cache holds now)."""
    num_decodes = contexts = longest = 0
    prefills = []
    for req, new in zip(requests, new_tokens):
        computed = req.computed
        if new == 1 and req.generated and computed == req.prompt + req.generated - 1:
            num_decodes += 1
            contexts += computed
            if computed > longest:
                longest = computed
        else:
            prefills.append(PrefillChunk(new, computed))
    return Step(tuple(requests), tuple(new_tokens), num_decodes, contexts, longest, tuple(prefills))


def finish_step(step: Step, end_s: float) -> list[RequestState]:
    """Apply a completed step: advance computed tokens, emit sampled tokens; return the requests now finished."""
    finished = []
    for req, new in zip(step.requests, step.new_tokens):
        req.in_flight = False
        req.computed += new
        if req.computed == req.prompt + req.generated:
            req.token_times_s[req.token_base + req.generated] = end_s
            req.generated += 1
            if req.generated == 1:
                req.first_token_s = end_s
            if req.generated == req.output:
                finished.append(req)
    return finished


#: Columns of a :class:`StepLog` row.
STEP_LOG_COLUMNS = ("replica", "start_s", "end_s", "num_requests", "num_tokens", "prefill_tokens", "num_decodes",
                    "kv_used_tokens")


class StepLog:
    """The simulator's record of every step it launched, in launch order: a row of :data:`STEP_LOG_COLUMNS` per
    step, appended one at a time by the event loop (``append``, a tuple, kept as eight float64s in one flat
    buffer) and as arrays of many rows by fast-forward (:meth:`extend`), so that a decode stretch's steps are never
    made into tuples."""

    __slots__ = ("_flat", "_blocks", "append")

    def __init__(self) -> None:
        self._flat = array("d")
        self._blocks: list[tuple[int, np.ndarray]] = []  # (rows appended before it, its rows)
        self.append = self._flat.extend

    def extend(self, rows: np.ndarray) -> None:
        """Rows of many steps, an array of :data:`STEP_LOG_COLUMNS` columns (taken over, not copied)."""
        self._blocks.append((len(self._flat) // len(STEP_LOG_COLUMNS), rows))

    def rows(self) -> np.ndarray:
        """Every row in launch order, float64 (counts are exact in it)."""
        width = len(STEP_LOG_COLUMNS)
        appended = np.frombuffer(self._flat, dtype=np.float64).reshape(-1, width) if self._flat else \
            np.zeros((0, width))
        pieces, done = [], 0
        for before, block in self._blocks:
            pieces += [appended[done:before], block]
            done = before
        pieces.append(appended[done:])
        return np.concatenate(pieces) if len(pieces) > 1 else appended.copy()
