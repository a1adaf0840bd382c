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

    def __init__(self, step: Step, end_s: float) -> None:
        self.step = step
        self.end_s = end_s
        self.context_tokens = step.decode_context_tokens + step.num_decodes  # at the next launch
        self.max_context = step.decode_max_context + 1
        self.span: DecodeSpan | None = None  # the step times of its current context, while they last
        # The KV blocks of each launch in turn, from its next launch on (:func:`_blocks`); None until first needed,
        # which most batches of a busy engine never are: one of their requests finishes at their end.
        self.blocks: list[int] | None = None
        # Completions possible before one finishes a request (the in-flight step's completion is the first).
        self.limit = min(r.output - r.generated for r in step.requests) - 1
        self.times_s: list[float] = []  # its completions so far, each followed by a relaunch


def _batches(replica: _Replica, flights: list[tuple[float, Step]]) -> deque[RelaunchBatch]:
    """The in-flight micro-batches to relaunch: those a previous fast-forward left in flight carry over (their
    requests cannot change while in flight), the others are read from their requests."""
    carried = replica.relaunching
    return deque(carried[step] if step in carried else RelaunchBatch(step, end_s)
                 for end_s, step in flights)  # in the order they end: the pipeline is first in, first out


def _blocks(batch: RelaunchBatch, scheduler) -> list[int]:
    """The batch's block pattern (``decode_blocks``), read from its requests the first time it is needed: they
    cannot change while the batch is in flight."""
    if batch.blocks is None:
        batch.blocks = scheduler.decode_blocks(batch.step.requests)
    return batch.blocks


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
    out), while none must go through the simulator; the end of the step each relaunch follows (a token for each of
    the batch's requests) is appended to its batch's ``times_s``, and the relaunch's record to ``log``. The
    relaunches run in :func:`_relaunch_loop`, which hands back to this function whenever a batch's mean context
    leaves its decode span (a step time to look up or predict, after which it goes on filling its record buffer)
    or its record buffer is full (passed on here, as are the records left when it stops)."""
    scheduler = replica.scheduler
    if not _relaunches(queue[0], horizon_s, scheduler):
        return
    batches = list(queue)
    no_span = (-1, -1, *(0.0,) * (2 + 2 * replica.pp))
    # Per batch, as _relaunch_loop reads them: (relaunches so far, limit, decodes, context tokens, longest context,
    # its span's low context and length) and (end, host overhead and stage times at the span's low context, and
    # their deltas to its next grid context).
    state = [(len(batch.times_s), batch.limit, batch.step.num_decodes, batch.context_tokens, batch.max_context,
              *(_span_row(batch.span) if batch.span is not None else no_span)) for batch in batches]
    counts = np.array([row[:7] for row in state], dtype=np.int64)
    times = np.array([(batch.end_s, *row[7:]) for batch, row in zip(batches, state)])
    pattern = np.array([_blocks(batch, scheduler) for batch in batches], dtype=np.int64)
    host_s = np.array([replica.cpu_free_s, *replica.stage_free_s, replica.gpu_start_s])
    pool = np.array([0, scheduler.free, scheduler.kv_used_tokens, scheduler.kv_unit_tokens, 0])
    rows = np.empty((_RECORDS, len(STEP_LOG_COLUMNS)))  # the step log's rows of the relaunches
    launched = np.empty((_RECORDS, 2))  # each relaunched batch's launch time (its previous end), and which it was
    launches = 0
    while True:
        status, b = _relaunch_loop(replica.index, counts, times, pattern, host_s, pool, rows, launched, horizon_s,
                                   replica.async_scheduling)
        if status == _SPAN_NEEDED:  # the buffered records wait: nothing reads them before the loop goes on
            batch = batches[b]
            size = int(counts[b, 2])
            batch.span = decode_span_at(replica.step_model, size, int(counts[b, 3]) // size, int(counts[b, 4]))
            span = _span_row(batch.span)
            counts[b, 5:] = span[:2]
            times[b, 1:] = span[2:]
            continue
        records = int(pool[4])
        launches += records
        if records:
            log.extend(rows[:records])
            # The loop relaunches the batches in turn, so batch k's records are every len(batches)-th from its
            # first.
            first = int(launched[0, 1])
            for other, batch in enumerate(batches):
                batch.times_s.extend(launched[(other - first) % len(batches):records:len(batches), 0].tolist())
        if status == _STOPPED:
            break
        pool[4] = 0  # the buffer was full and is passed on
    for batch, end_s, (_, _, _, context_tokens, max_context, _, _) in zip(batches, times[:, 0].tolist(),
                                                                          counts.tolist()):
        batch.end_s, batch.context_tokens, batch.max_context = end_s, context_tokens, max_context
    queue.rotate(-int(pool[0]))  # the next to end first
    scheduler.free = int(pool[1])
    scheduler.decode_launched(launches)
    replica.cpu_free_s = float(host_s[0])
    replica.stage_free_s = host_s[1:-1].tolist()
    replica.gpu_start_s = float(host_s[-1])


def _relaunches(batch: RelaunchBatch, horizon_s: float, scheduler) -> bool:
    """Whether the batch is relaunched here once more: not when it ends at or after the horizon, a request
    finishes at its end, or the scheduler's free KV units cannot hold the relaunch."""
    if batch.end_s >= horizon_s or len(batch.times_s) >= batch.limit:
        return False
    blocks = _blocks(batch, scheduler)
    return blocks[len(batch.times_s) % len(blocks)] <= scheduler.free


#: Relaunch records :func:`_relaunch_loop` buffers before handing back.
_RECORDS = 1024
#: Why :func:`_relaunch_loop` handed back.
_STOPPED, _SPAN_NEEDED, _BUFFER_FULL = 0, 1, 2


def _span_row(span: DecodeSpan) -> tuple:
    """A decode span as :func:`_relaunch_loop` reads it: its low context and length, then its times."""
    return (span.low_context, span.span, span.overhead_us, *span.stage_us, span.overhead_delta_us,
            *span.stage_delta_us)


@jit
def _relaunch_loop(replica: int, counts: np.ndarray, times: np.ndarray, pattern: np.ndarray, host_s: np.ndarray,
                   pool: np.ndarray, rows: np.ndarray, launched: np.ndarray, horizon_s: float,
                   async_scheduling: bool) -> tuple[int, int]:
    """Relaunch batches in turn from ``pool[0]`` on, as :func:`_relaunch` describes, updating the arrays in place.
    Per batch, ``counts`` holds (relaunches so far, limit, decodes, context tokens, longest context, its decode
    span's low context and length: -1 without one) and ``times`` (end, then :func:`_span_row`'s times); ``host_s``
    is the host's and then each stage's free time, then the last step's GPU start, ``pool`` (next batch, free KV units, KV in use, tokens per unit,
    relaunches buffered). Each relaunch's step-log row goes to ``rows``, its batch's launch time and index to
    ``launched``, after the relaunches already buffered there. Returns why it stopped and the batch it stopped at.

    The arithmetic is the simulator's, operation for operation: a step's time from its decode span
    (``DecodeSpan.at``), then the host and the stages occupied in turn (``_Replica.occupy``, or under async
    scheduling ``_Replica.host_start_s`` and ``occupy_async``)."""
    batches, stages = len(counts), len(host_s) - 2
    b, free, kv_used, unit = pool[0], pool[1], pool[2], pool[3]
    records, status = pool[4], _STOPPED  # records already buffered
    while True:
        end_s = times[b, 0]
        done, limit, size = counts[b, 0], counts[b, 1], counts[b, 2]
        if end_s >= horizon_s or done >= limit:  # the same test as _relaunches
            break
        blocks = pattern[b, done % pattern.shape[1]]
        if blocks > free:
            break
        context = counts[b, 3] // size
        low, span = counts[b, 5], counts[b, 6]
        if span < 0 or not (low <= context < low + span or context == low):  # DecodeSpan.covers
            status = _SPAN_NEEDED
            break
        if records == len(rows):
            status = _BUFFER_FULL
            break
        free -= blocks
        kv_used += blocks * unit
        at_low = context == low
        weight = 0.0 if at_low else (context - low) / span
        overhead_us = times[b, 1] if at_low else times[b, 1] + weight * times[b, 2 + stages]
        if async_scheduling:  # one stage, relaunched as it ends: the host began while it ran
            stage_us = times[b, 2] if at_low else times[b, 2] + weight * times[b, 3 + stages]
            host_start_s = host_s[stages + 1] if host_s[1] >= end_s else end_s
            if host_s[0] > host_start_s:
                host_start_s = host_s[0]
            ready_s = host_s[0] = host_start_s + overhead_us * 1e-6
            start_s = end_s if end_s > ready_s else ready_s
            if host_s[1] > start_s:
                start_s = host_s[1]
            host_s[stages + 1] = start_s
            t_s = host_s[1] = start_s + stage_us * 1e-6
        else:
            start_s = end_s if end_s > host_s[0] else host_s[0]
            t_s = host_s[0] = start_s + overhead_us * 1e-6
            for stage in range(stages):
                stage_us = times[b, 2 + stage] if at_low else times[b, 2 + stage] + weight * times[b, 3 + stages + stage]
                t_s = host_s[1 + stage] = (t_s if t_s > host_s[1 + stage] else host_s[1 + stage]) + stage_us * 1e-6
        row = rows[records]  # as the simulator logs a launch: (replica, start, end, requests, tokens, prefill
        row[0], row[1], row[2], row[3] = replica, start_s, t_s, size  # tokens, decodes, KV in use)
        row[4], row[5], row[6], row[7] = size, 0, size, kv_used
        launched[records, 0], launched[records, 1] = end_s, b
        records += 1
        times[b, 0] = t_s
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
    times_s = batch.times_s
    for req in requests:
        req.token_times_s[req.generated:req.generated + done] = times_s
        req.computed += done
        req.generated += done
    scheduler.commit_decodes(requests, done)
    size = step.num_decodes
    batch.step = Step(requests, step.new_tokens, size, step.decode_context_tokens + size * done,
                      step.decode_max_context + done, ())
    batch.limit -= done
    shift = done % len(batch.blocks)  # launch k of the new step is launch k + done of the old one
    batch.blocks = batch.blocks[shift:] + batch.blocks[:shift]
    batch.times_s = []
