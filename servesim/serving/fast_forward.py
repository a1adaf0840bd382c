"""Fast-forward through steady decoding: many engine steps at once, with the same results as stepping.

Between arrivals and completions a replica often only decodes: every running request is in one of the
micro-batches in flight (one without pipeline parallelism), nothing waiting can be admitted, and when a
micro-batch finishes the scheduler relaunches exactly its requests, each one token further. Stepping through the
scheduler costs Python work per request per token; here each relaunch is a few scalar operations: its time from
the representative decode batch (``n`` requests, their total context growing by ``n`` per step and the longest by
one), the host and the pipeline stages occupied as the simulator's launch occupies them, and the KV it takes from
a per-batch pattern (``decode_blocks``). The requests are brought up to date once, when the run stops.

A run stops before the first completion that the simulator must see step by step: one at or after ``horizon_s``
(the replica's next outside event: an arrival, or another replica's completion), one that finishes a request,
or a relaunch the KV pool cannot hold (the scheduler then preempts or retracts). The micro-batches still in
flight then carry new :class:`Step` objects, which the simulator schedules as completion events in place of the
old ones. The replica keeps each such micro-batch's state (relaunches left before a request finishes, the block
pattern from its next launch on), so that the next run, after the outside event, starts from it without reading
every request again; a request cannot change while its micro-batch is in flight. The relaunches run in a compiled
loop over arrays of the micro-batches' state, which hands back to Python only for a step time it has not got (a
micro-batch's mean context leaving its decode span) and to pass on its records. Arithmetic follows the stepping
path operation for operation, so token times and step records are identical (tests/test_serving_simulator.py
checks it).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from servesim.compiled import jit
from servesim.serving.state import STEP_LOG_COLUMNS, Step, StepLog
from servesim.serving.step_cache import DecodeSpan, decode_span_at

if TYPE_CHECKING:
    from servesim.serving.simulator import _Replica


class RelaunchBatch:
    """One in-flight decode micro-batch being relaunched."""

    __slots__ = ("step", "end_s", "context_tokens", "max_context", "span", "blocks", "limit", "times_s")

    def __init__(self, step: Step, end_s: float, blocks: np.ndarray) -> None:
        self.step = step
        self.end_s = end_s
        self.context_tokens = step.decode_context_tokens + step.num_decodes  # at the next launch
        self.max_context = step.decode_max_context + 1
        self.span: DecodeSpan | None = None  # the step times of its current context, while they last
        self.blocks = blocks.tolist()
        # Completions possible before one finishes a request (the in-flight step's completion is the first).
        self.limit = min(r.output - r.generated for r in step.requests) - 1
        self.times_s: list[float] = []  # its completions so far, each followed by a relaunch


def _batches(replica: _Replica, flights: list[tuple[float, Step]]) -> deque[RelaunchBatch]:
    """The in-flight micro-batches to relaunch: those a previous fast-forward left in flight carry over (their
    requests cannot change while in flight), the others are read from their requests."""
    carried = replica.relaunching
    scheduler = replica.scheduler
    return deque(carried[step] if step in carried else RelaunchBatch(
                     step, end_s, scheduler.decode_blocks(np.array([r.computed + 1 for r in step.requests])))
                 for end_s, step in flights)  # in the order they end: the pipeline is first in, first out


def fast_forward(replica: _Replica, horizon_s: float, log: StepLog) -> list[tuple[float, Step]]:
    """Relaunch the replica's in-flight decode micro-batches until one must go through the simulator (see the
    module docstring). Returns the ``(end_s, step)`` of micro-batches that replace in-flight ones, in the order
    they end, and updates ``replica.flights``; empty when nothing moved."""
    flights = replica.flights
    if not flights or flights[0][0] >= horizon_s or any(step.prefills for _, step in flights):
        return []
    scheduler = replica.scheduler
    sizes = [step.num_decodes for _, step in flights]
    if len(flights) < replica.pp:
        sizes.append(0)  # the pipeline has room: the scheduler is asked again, with its whole token budget
    if not scheduler.steady_decode(sizes):
        return []
    queue = _batches(replica, flights)  # none relaunched yet: each batch's times_s is empty
    _relaunch(replica, queue, horizon_s, log)
    replaced = []
    for batch in queue:
        if batch.times_s:
            _commit(batch, scheduler)
            replaced.append((batch.end_s, batch.step))
    if replaced:
        replica.flights = [(batch.end_s, batch.step) for batch in queue]
    replica.relaunching = {batch.step: batch for batch in queue}
    return replaced


def _relaunch(replica: _Replica, queue: deque[RelaunchBatch], horizon_s: float, log: StepLog) -> None:
    """Relaunch the micro-batches of ``queue`` one after another, each as it ends (the pipeline is first in, first
    out), while none must go through the simulator; each relaunch's start is appended to its batch's ``times_s``
    and its record to ``log``. The relaunches run in :func:`_relaunch_loop`, which hands back to this function
    whenever a batch's mean context leaves its decode span (a step time to look up or predict) or its record
    buffer is full."""
    scheduler = replica.scheduler
    if not _relaunches(queue[0], horizon_s, scheduler.free):
        return
    batches = list(queue)
    pp = replica.pp
    ends_s = np.array([batch.end_s for batch in batches])
    counts = np.array([(len(batch.times_s), batch.limit, batch.step.num_decodes, batch.context_tokens,
                        batch.max_context) for batch in batches], dtype=np.int64)  # as _relaunch_loop reads them
    pattern = np.array([batch.blocks for batch in batches], dtype=np.int64)
    span_bounds = np.full((len(batches), 2), -1, dtype=np.int64)  # (low context, span); -1: none loaded
    span_times_us = np.empty((len(batches), 2 + 2 * pp))
    for b, batch in enumerate(batches):
        if batch.span is not None:
            _load_span(span_bounds, span_times_us, b, batch.span)
    host_s = np.array([replica.cpu_free_s, *replica.stage_free_s])
    pool = np.array([0, scheduler.free, scheduler.kv_used_tokens, scheduler.kv_unit_tokens, 0])
    rows = np.empty((_RECORDS, len(STEP_LOG_COLUMNS)))  # the step log's rows of the relaunches
    launched_s = np.empty(_RECORDS)  # when each relaunched batch was launched (its previous end)
    which = np.empty(_RECORDS, dtype=np.int64)  # and which batch it was
    launches = 0
    while True:
        status, b = _relaunch_loop(replica.index, ends_s, counts, pattern, span_bounds, span_times_us, host_s, pool,
                                   rows, launched_s, which, horizon_s)
        records = int(pool[4])
        launches += records
        log.extend(rows[:records].copy())
        for other, batch in enumerate(batches):
            batch.times_s.extend((launched_s[:records] if len(batches) == 1
                                  else launched_s[:records][which[:records] == other]).tolist())
        if status == _SPAN_NEEDED:
            batch = batches[b]
            size = int(counts[b, 2])
            batch.span = decode_span_at(replica.step_model, size, int(counts[b, 3]) // size, int(counts[b, 4]))
            _load_span(span_bounds, span_times_us, b, batch.span)
        elif status == _STOPPED:
            break
    for b, batch in enumerate(batches):
        batch.end_s = float(ends_s[b])
        batch.context_tokens, batch.max_context = int(counts[b, 3]), int(counts[b, 4])
    queue.rotate(-int(pool[0]))  # the next to end first
    scheduler.free = int(pool[1])
    scheduler.decode_launched(launches)
    replica.cpu_free_s = float(host_s[0])
    replica.stage_free_s = host_s[1:].tolist()


def _relaunches(batch: RelaunchBatch, horizon_s: float, free: int) -> bool:
    """Whether the batch is relaunched here once more: not when it ends at or after the horizon, a request
    finishes at its end, or the pool's ``free`` units cannot hold the relaunch."""
    if batch.end_s >= horizon_s or len(batch.times_s) >= batch.limit:
        return False
    return batch.blocks[len(batch.times_s) % len(batch.blocks)] <= free


#: Relaunch records :func:`_relaunch_loop` buffers before handing back.
_RECORDS = 1024
#: Why :func:`_relaunch_loop` handed back.
_STOPPED, _SPAN_NEEDED, _BUFFER_FULL = 0, 1, 2


def _load_span(span_bounds: np.ndarray, span_times_us: np.ndarray, b: int, span: DecodeSpan) -> None:
    """Batch ``b``'s decode span as :func:`_relaunch_loop` reads it."""
    span_bounds[b] = span.low_context, span.span
    span_times_us[b] = (span.overhead_us, span.overhead_delta_us, *span.stage_us, *span.stage_delta_us)


@jit
def _relaunch_loop(replica: int, ends_s: np.ndarray, counts: np.ndarray, pattern: np.ndarray,
                   span_bounds: np.ndarray, span_times_us: np.ndarray, host_s: np.ndarray, pool: np.ndarray,
                   rows: np.ndarray, launched_s: np.ndarray, which: np.ndarray, horizon_s: float) -> tuple[int, int]:
    """Relaunch batches in turn from ``pool[0]`` on, as :func:`_relaunch` describes, updating the arrays in place:
    ``counts`` rows are (relaunches so far, limit, decodes, context tokens, longest context), ``host_s`` the host's
    and then each stage's free time, ``pool`` (next batch, free KV units, KV in use, tokens per unit, relaunches
    buffered); each relaunch's step-log row goes to ``rows``, its batch's launch time to ``launched_s`` and the batch
    to ``which``. Returns why it stopped and the batch it stopped at.

    The arithmetic is the simulator's, operation for operation: a step's time from its decode span
    (``DecodeSpan.at``), then the host and the stages occupied in turn (``_Replica.occupy``)."""
    batches, stages = len(ends_s), len(host_s) - 1
    b, free, kv_used, unit = pool[0], pool[1], pool[2], pool[3]
    records, status = 0, _STOPPED
    while True:
        end_s = ends_s[b]
        done, limit, size = counts[b, 0], counts[b, 1], counts[b, 2]
        if end_s >= horizon_s or done >= limit:  # the same test as _relaunches
            break
        blocks = pattern[b, done % pattern.shape[1]]
        if blocks > free:
            break
        context = counts[b, 3] // size
        low, span = span_bounds[b, 0], span_bounds[b, 1]
        if span < 0 or not (low <= context < low + span or context == low):  # DecodeSpan.covers
            status = _SPAN_NEEDED
            break
        if records == len(which):
            status = _BUFFER_FULL
            break
        free -= blocks
        kv_used += blocks * unit
        weight = 0.0 if context == low else (context - low) / span
        overhead_us = span_times_us[b, 0] if context == low else span_times_us[b, 0] + weight * span_times_us[b, 1]
        start_s = end_s if end_s > host_s[0] else host_s[0]
        t_s = host_s[0] = start_s + overhead_us * 1e-6
        for stage in range(stages):
            stage_us = span_times_us[b, 2 + stage]
            if context != low:
                stage_us = stage_us + weight * span_times_us[b, 2 + stages + stage]
            t_s = host_s[1 + stage] = (t_s if t_s > host_s[1 + stage] else host_s[1 + stage]) + stage_us * 1e-6
        row = rows[records]  # as the simulator logs a launch: (replica, start, end, requests, tokens, prefill
        row[0], row[1], row[2], row[3] = replica, start_s, t_s, size  # tokens, decodes, KV in use)
        row[4], row[5], row[6], row[7] = size, 0, size, kv_used
        launched_s[records], which[records] = end_s, b
        records += 1
        ends_s[b] = t_s
        counts[b, 0] += 1
        counts[b, 3] += size
        counts[b, 4] += 1
        b = (b + 1) % batches
    pool[0], pool[1], pool[2], pool[4] = b, free, kv_used, records
    return status, b


def _commit(batch: RelaunchBatch, scheduler) -> None:
    """Bring the batch's requests up to date and make the step now in flight: the same decodes, each ``done``
    tokens further (the step :func:`make_step` would form, without reading every request again)."""
    done = len(batch.times_s)
    step = batch.step
    requests = step.requests
    for req in requests:
        req.computed += done
        req.generated += done
        req.token_times_s.extend(batch.times_s)
    scheduler.commit_decodes(requests, done)
    size = step.num_decodes
    batch.step = Step(requests, step.new_tokens, size, step.decode_context_tokens + size * done,
                      step.decode_max_context + done, ())
    batch.limit -= done
    shift = done % len(batch.blocks)  # launch k of the new step is launch k + done of the old one
    batch.blocks = batch.blocks[shift:] + batch.blocks[:shift]
    batch.times_s = []
