"""What a serving engine knows about each request while it runs, and what one scheduled step is.

Token accounting shared by both engines: a request's sequence is its prompt plus the tokens generated so far.
``computed`` tokens of it have their KV in the cache. A step that brings ``computed`` up to the sequence length
samples the next token: the last prompt chunk samples the first output token, each decode one more. After a
preemption (vLLM) or retraction (SGLang) ``computed`` drops to 0 and the whole sequence is recomputed, as both
engines do; tokens already streamed to the client stay streamed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.serving.metrics import GapCounts, streamed_positions


class RequestState:
    """Mutable per-request state inside one replica (the simulator's hot loop touches it every step)."""

    __slots__ = (
        "rid", "prompt", "output", "issue_s", "reached_s", "computed", "generated", "kv_held", "first_scheduled_s",
        "first_token_s", "token_times_s", "preemptions", "in_flight", "segment_ids", "segment_tokens", "output_id",
        "cache_path", "cached_units", "cached_tokens",
    )

    def __init__(self, rid: int, prompt: int, output: int, issue_s: float, segment_ids=None, segment_tokens=None,
                 output_id: int = -1) -> None:
        self.rid = rid
        self.prompt = prompt
        self.output = output
        self.issue_s = issue_s  # the client's send, from which TTFT and E2E count
        self.reached_s = issue_s  # when it reached the engine (later with an API server's cost or latency)
        self.computed = 0
        self.generated = 0
        self.kv_held = 0  # KV units held: vLLM blocks, SGLang token slots
        self.first_scheduled_s = -1.0
        self.first_token_s = -1.0
        # Token k of this request is sampled at token_times_s[k]: a list of its output length (known in advance),
        # made at its first token, so that a request still waiting holds none; the run's RequestLog takes what it
        # needs of it when the request finishes. A list, not an array: a token's time is stored for every request
        # of every step, and a list item is several times quicker to set than an array element.
        self.token_times_s: list[float] | None = None
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
    context, and the prompt chunks (new tokens after cached ones). ``admitted`` are the requests it takes from the
    waiting queue, the only ones that can be scheduled for the first time."""

    requests: tuple[RequestState, ...]
    new_tokens: tuple[int, ...]
    num_decodes: int
    decode_context_tokens: int
    decode_max_context: int  # 0 without decodes
    prefills: tuple[PrefillChunk, ...]
    admitted: tuple[RequestState, ...] = ()

    def batch(self) -> BatchSpec:
        """The exact batch the kernels see: decodes by context, prompt chunks by (new, cached)."""
        decodes = tuple(r.computed for r, new in zip(self.requests, self.new_tokens) if new == 1 and r.is_decoding)
        return BatchSpec(prefills=self.prefills, decodes=decodes)


def schedule_requests(requests: list[RequestState],
                      new_tokens: list[int]) -> tuple[int, int, int, list[PrefillChunk]]:
    """Mark scheduled requests in flight and summarise them as a step (before they run: ``computed`` is what the
    cache holds now): (decodes, their total context, the longest, the prompt chunks). A request decodes when its
    one new token is the last of its sequence and it has sampled one before."""
    num_decodes = contexts = longest = 0
    prefills = []
    for req, new in zip(requests, new_tokens):
        req.in_flight = True
        computed = req.computed
        if new == 1 and req.generated and computed == req.prompt + req.generated - 1:
            num_decodes += 1
            contexts += computed
            if computed > longest:
                longest = computed
        else:
            prefills.append(PrefillChunk(new, computed))
    return num_decodes, contexts, longest, prefills


def make_step(requests: list[RequestState], new_tokens: list[int], admitted: list[RequestState]) -> Step:
    """A step from scheduled requests, which it marks in flight (:func:`schedule_requests`); ``admitted`` are
    those taken from the waiting queue."""
    num_decodes, contexts, longest, prefills = schedule_requests(requests, new_tokens)
    return Step(tuple(requests), tuple(new_tokens), num_decodes, contexts, longest, tuple(prefills), tuple(admitted))


def finish_step(step: Step, end_s: float) -> list[RequestState]:
    """Apply a completed step: advance computed tokens, emit sampled tokens; return the requests now finished."""
    finished = []
    for req, new in zip(step.requests, step.new_tokens):  # attributes read once: this runs for every request
        req.in_flight = False
        computed = req.computed = req.computed + new
        generated = req.generated
        if computed == req.prompt + generated:
            if generated:
                req.token_times_s[generated] = end_s
            else:
                req.first_token_s = end_s
                times = req.token_times_s = [0.0] * req.output
                times[0] = end_s
            generated = req.generated = generated + 1
            if generated == req.output:
                finished.append(req)
    return finished


#: Columns of a :class:`StepLog` row.
STEP_LOG_COLUMNS = ("replica", "start_s", "end_s", "num_requests", "num_tokens", "prefill_tokens", "num_decodes",
                    "kv_used_tokens")


class StepLog:
    """The simulator's record of every step it launched, in launch order: a row of :data:`STEP_LOG_COLUMNS` per
    step, appended one at a time by the event loop (:meth:`append`, a tuple) and as arrays of many rows by
    fast-forward (:meth:`extend`). Rows gather as float64 blocks (counts are exact in float64: below 2^53), single
    rows in a list that becomes a block every :data:`ROWS_PER_BLOCK` rows or before a block of many, so that
    recording a step costs a list append and a decode stretch one copy, and the log's memory stays a few words a
    step. :meth:`column` joins the blocks once."""

    #: Rows appended one at a time that are kept as tuples before they become a block.
    ROWS_PER_BLOCK = 4096

    __slots__ = ("_rows", "_blocks", "_table")

    def __init__(self) -> None:
        self._rows: list[tuple] = []
        self._blocks: list[np.ndarray] = []
        self._table: np.ndarray | None = None  # the columns of every row, once joined

    def append(self, row: tuple) -> None:
        self._rows.append(row)
        if len(self._rows) == self.ROWS_PER_BLOCK:
            self._block_rows()

    def extend(self, rows: np.ndarray) -> None:
        """Rows of many steps, a float64 array of :data:`STEP_LOG_COLUMNS` columns, copied."""
        self._block_rows()
        self._blocks.append(rows.copy())

    def _block_rows(self) -> None:
        if self._rows:
            self._blocks.append(np.array(self._rows, dtype=np.float64))
            self._rows = []
        self._table = None

    def column(self, name: str) -> np.ndarray:
        """One column over every row, in launch order: float64 for times, int64 for counts."""
        if self._table is None or self._rows:
            self._block_rows()
            table = np.empty((len(STEP_LOG_COLUMNS), sum(len(block) for block in self._blocks)))
            start = 0
            for block in self._blocks:
                table[:, start:start + len(block)] = block.T
                start += len(block)
            self._table = table
            self._blocks = [table.T]  # a view: the rows are kept once
        values = self._table[STEP_LOG_COLUMNS.index(name)]
        return values if name.endswith("_s") else values.astype(np.int64)


class GapCounter:
    """Counts the gaps between consecutive tokens of finished requests by exact value (:class:`GapCounts`), in
    memory that grows with the distinct values, not the tokens: gaps gather in a fixed buffer, which is folded
    into the sorted counts whenever it fills."""

    __slots__ = ("_pending", "_used", "_values_s", "_counts")

    def __init__(self, buffer_gaps: int = 1 << 19) -> None:
        self._pending = np.empty(buffer_gaps)  # 4 MB
        self._used = 0
        self._values_s = np.zeros(0)
        self._counts = np.zeros(0, dtype=np.int64)

    def add(self, times_s: np.ndarray) -> None:
        """One request's token times, in order."""
        gaps = len(times_s) - 1
        if self._used + gaps > len(self._pending):
            self._fold(self._pending[:self._used])
            self._used = 0
            if gaps > len(self._pending):
                self._fold(np.diff(times_s))
                return
        np.subtract(times_s[1:], times_s[:-1], out=self._pending[self._used:self._used + gaps])
        self._used += gaps

    def add_counts(self, values_s: np.ndarray, counts: np.ndarray) -> None:
        """Gaps already counted: ``counts[i]`` of ``values_s[i]`` (ascending, distinct)."""
        self._values_s, self._counts = merge_counts(self._values_s, self._counts, values_s, counts)

    def _fold(self, gaps_s: np.ndarray) -> None:
        values, counts = np.unique(gaps_s, return_counts=True)
        self._values_s, self._counts = merge_counts(self._values_s, self._counts, values, counts)

    def counts(self) -> GapCounts:
        """Every gap added so far."""
        self._fold(self._pending[:self._used])
        self._used = 0
        return GapCounts(self._values_s, self._counts)


def merge_counts(values_a: np.ndarray, counts_a: np.ndarray, values_b: np.ndarray,
                 counts_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two (ascending distinct values, counts) tables as one, in time linear in the first (the running table) and
    the second's values looked up in it."""
    at = np.searchsorted(values_a, values_b)
    known = at < len(values_a)
    known[known] = values_a[at[known]] == values_b[known]
    counts = counts_a.copy()
    counts[at[known]] += counts_b[known]  # values_b are distinct, so are these positions
    new = ~known
    return np.insert(values_a, at[new], values_b[new]), np.insert(counts, at[new], counts_b[new])


class RequestLog:
    """What the run keeps of each request once it finishes: its timings, one array per field (request ``rid`` at
    index ``rid``, not a Python object per request), and its token times: every one (``keep_token_times``, one
    float64 buffer for the run, request ``i``'s at ``token_offsets[i]:token_offsets[i + 1]``) or only the gaps
    between the chunks its client receives (``stream_interval`` tokens each), counted (:class:`GapCounter`). The
    replica a request was routed to is written at routing."""

    __slots__ = ("issue_s", "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "cached_tokens",
                 "replica", "token_offsets", "token_times_s", "gaps", "finished", "stream_interval")

    def __init__(self, output_tokens: np.ndarray, keep_token_times: bool, stream_interval: int = 1) -> None:
        n = len(output_tokens)
        self.stream_interval = stream_interval
        self.issue_s = np.zeros(n)
        self.first_scheduled_s = np.zeros(n)
        self.first_token_s = np.zeros(n)
        self.finish_s = np.zeros(n)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.cached_tokens = np.zeros(n, dtype=np.int64)
        self.replica = np.zeros(n, dtype=np.int64)
        self.token_offsets = np.concatenate([[0], np.cumsum(output_tokens, dtype=np.int64)])
        self.token_times_s = np.empty(int(self.token_offsets[-1])) if keep_token_times else None
        self.gaps = None if keep_token_times else GapCounter()
        self.finished = 0

    def finish(self, req: RequestState) -> None:
        """Record a request that has sampled its last token."""
        rid, times = req.rid, req.token_times_s
        self.issue_s[rid] = req.issue_s
        self.first_scheduled_s[rid] = req.first_scheduled_s
        self.first_token_s[rid] = req.first_token_s
        self.finish_s[rid] = times[-1]
        self.preemptions[rid] = req.preemptions
        self.cached_tokens[rid] = req.cached_tokens
        if self.gaps is None:
            start = int(self.token_offsets[rid])
            self.token_times_s[start:start + req.output] = times
        elif self.stream_interval == 1:
            self.gaps.add(np.array(times))
        else:
            self.gaps.add(np.array(times)[streamed_positions(req.output, self.stream_interval)])
        req.token_times_s = None
        self.finished += 1
