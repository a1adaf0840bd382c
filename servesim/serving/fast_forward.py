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
every request again; a request cannot change while its micro-batch is in flight. A micro-batch alone in flight is
relaunched a span of contexts at a time in arrays. Arithmetic follows the stepping path operation for operation, so
token times and step records are identical (tests/test_serving_simulator.py checks it).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from servesim.serving.state import Step
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


def fast_forward(replica: _Replica, horizon_s: float, log: list[tuple]) -> list[tuple[float, Step]]:
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
    if _long_and_alone(replica, queue, horizon_s):
        _relaunch_alone(replica, queue[0], horizon_s, log)
    else:
        _relaunch_in_turn(replica, queue, horizon_s, log)
    replaced = []
    for batch in queue:
        if batch.times_s:
            _commit(batch, scheduler)
            replaced.append((batch.end_s, batch.step))
    if replaced:
        replica.flights = [(batch.end_s, batch.step) for batch in queue]
    replica.relaunching = {batch.step: batch for batch in queue}
    return replaced


def _relaunch_in_turn(replica: _Replica, queue: deque[RelaunchBatch], horizon_s: float, log: list[tuple]) -> None:
    """Relaunch the micro-batches of ``queue`` one after another, each as it ends (the pipeline is first in, first
    out), while none must go through the simulator; each relaunch's end is appended to its batch's ``times_s``."""
    scheduler = replica.scheduler
    occupy = replica.occupy
    index = replica.index
    unit = scheduler.kv_unit_tokens
    free = scheduler.free
    kv_used = scheduler.kv_used_tokens
    launches = 0
    while True:
        batch = queue[0]
        end_s = batch.end_s
        times_s = batch.times_s
        if end_s >= horizon_s or len(times_s) >= batch.limit:  # _relaunches, inlined: this runs every relaunch
            break
        blocks = batch.blocks[len(times_s) % len(batch.blocks)]
        if blocks > free:
            break
        launches += 1
        queue.popleft()
        times_s.append(end_s)
        free -= blocks
        kv_used += blocks * unit
        size = batch.step.num_decodes
        context = batch.context_tokens // size
        # The longest and the mean context both grow by one a relaunch: the spread, hence the span, stays until
        # the mean leaves it.
        span = batch.span
        if span is None or not span.covers(context):
            span = batch.span = decode_span_at(replica.step_model, size, context, batch.max_context)
        overhead_us, stages_us = span.at(context)
        start_s, batch.end_s = occupy(end_s, overhead_us, stages_us)
        log.append((index, start_s, batch.end_s, size, size, 0, size, kv_used))
        batch.context_tokens += size
        batch.max_context += 1
        queue.append(batch)
    scheduler.free = free
    scheduler.decode_launched(launches)  # nothing here reads what it updates


def _relaunches(batch: RelaunchBatch, horizon_s: float, free: int) -> bool:
    """Whether the batch is relaunched here once more: not when it ends at or after the horizon, a request
    finishes at its end, or the pool's ``free`` units cannot hold the relaunch."""
    if batch.end_s >= horizon_s or len(batch.times_s) >= batch.limit:
        return False
    return batch.blocks[len(batch.times_s) % len(batch.blocks)] <= free


LONG_RUN_STEPS = 16


def _long_and_alone(replica: _Replica, queue: deque[RelaunchBatch], horizon_s: float) -> bool:
    """Whether one micro-batch is in flight with room for about :data:`LONG_RUN_STEPS` relaunches of its GPU time
    before the horizon: below that the arrays of :func:`_relaunch_alone` cost more than relaunching one by one.
    Either path gives the same result."""
    if len(queue) != 1:
        return False
    end_s = queue[0].end_s
    return horizon_s - end_s > LONG_RUN_STEPS * (end_s - replica.cpu_free_s)


def _relaunch_alone(replica: _Replica, batch: RelaunchBatch, horizon_s: float, log: list[tuple]) -> None:
    """:func:`_relaunch_in_turn` for the one micro-batch in flight, a span of relaunches at a time in arrays.

    Alone in the pipeline, a relaunch starts as the batch ends (only its own launch used the host and the stages
    since, and it has left them), so each end time is the previous one plus the host overhead, then each stage's
    time, added in that order: one running sum (``np.add.accumulate`` adds in order, as the scalar path does).
    Relaunches are cut where one would start at or after the horizon, would pass the batch's limit, or would not
    fit the pool's free units."""
    scheduler = replica.scheduler
    index = replica.index
    size = batch.step.num_decodes
    pattern = np.array(batch.blocks)
    while _relaunches(batch, horizon_s, scheduler.free):
        done = len(batch.times_s)
        context = batch.context_tokens // size
        if batch.span is None or not batch.span.covers(context):
            batch.span = decode_span_at(replica.step_model, size, context, batch.max_context)
        span = batch.span
        # Relaunches the span covers from here, up to the limit.
        count = min(span.low_context + span.span - context if span.span else 1, batch.limit - done)
        overhead_us, stages_us = span.at_contexts(np.arange(context, context + count))
        increments = np.empty((count, 1 + stages_us.shape[1]))
        increments[:, 0] = overhead_us * 1e-6
        increments[:, 1:] = stages_us * 1e-6
        times = np.add.accumulate(np.concatenate(([batch.end_s], increments.ravel())))[1:].reshape(increments.shape)
        ends = times[:, -1]
        starts = np.concatenate(([batch.end_s], ends[:-1]))
        taken = np.cumsum(pattern[(done + np.arange(count)) % len(pattern)])
        fitting = int(np.searchsorted(taken, scheduler.free, "right"))
        count = min(count, int(np.searchsorted(starts, horizon_s)), fitting)
        kv_used = (scheduler.kv_used_tokens + taken[:count] * scheduler.kv_unit_tokens).tolist()
        log.extend((index, start_s, end_s, size, size, 0, size, kv) for start_s, end_s, kv in
                   zip(starts[:count].tolist(), ends[:count].tolist(), kv_used))
        batch.times_s.extend(starts[:count].tolist())
        scheduler.free -= int(taken[count - 1])
        scheduler.decode_launched(count)
        replica.cpu_free_s = float(times[count - 1, 0])
        replica.stage_free_s = times[count - 1, 1:].tolist()
        batch.end_s = float(ends[count - 1])
        batch.context_tokens += size * count
        batch.max_context += count


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
