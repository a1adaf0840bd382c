"""The simulator's event loop for one vLLM or SGLang replica, compiled, with the same results.

A capacity search and most ``simulate`` runs serve one replica (with or without pipeline stages). There the Python
event loop (servesim/serving/simulator.py) and the scheduler (servesim/serving/scheduler_vllm.py,
scheduler_sglang.py) spend a few attribute reads and writes per running request per step, which a busy engine
multiplies into most of a run. :func:`run` serves such a replica with request state as arrays indexed by request id
(struct of arrays: computed, generated and held KV blocks, in flight; the send, arrival, first-scheduled,
first-token and last-token times), the waiting queue a ring of ids, the running queue an array of ids in order, the
micro-batches in flight a ring of ``pp`` slots and the arrivals a binary heap ordered as the Python loop's (time,
then the order the events were made), all in one compiled loop (:func:`_core_loop`) that follows the Python loop,
the engine's scheduler (:func:`_schedule`, :func:`_schedule_sglang`: its chunked prompt, new-token ratio,
retractions and receive interval as state beside the queues) and ``finish_step`` operation for operation. A workload
with prompt identity looks up and fills the prefix cache as the scheduler does, through the same radix tree over
arrays (servesim/serving/compiled_cache.py). Step times come from one open-addressing table of what they are made
of, filled from Python as the loop first meets each entry: decode spans by (size, grid context, spread), from which
decode steps are timed as ``DecodeSpan.at`` does, and the parts of a step with prompt chunks (its graph plan, the
times outside attention and of attention at the corners it is interpolated between, its host and device costs), from
which the loop works out ``step_cache.step_time_us`` operation for operation (:func:`_mixed_step_time`). It hands
back to Python only

- for the table entries it lacks, in the order the Python functions would first ask the step model for them (so
  the kernel estimator sees the same calls),
- to pass on a full buffer of step-log rows, to grow its gap table or the prefix cache's arrays, to report
  progress, and when a stop rule fires.

Without every token's time kept, it counts the gaps between the chunks a client receives by value in another
open-addressing table (a gap is the difference of two step ends, so distinct values are few), which
``GapCounter`` then holds as it would have counted them.

Several replicas and attention data parallelism run the Python loop. Each scheduler has one call site
(:func:`_form_step`), so that numba compiles it into the loop once. tests/test_compiled_loop.py checks that both
loops give the same requests, cached tokens, steps, stops and progress reports.
"""

from __future__ import annotations

import math

import numpy as np

from servesim.compiled import heap_pop, heap_push, inner, jit, stable_argsort
from servesim.serving.compiled_cache import (
    EVICTABLE,
    NODE_COLUMNS,
    NODES,
    acquire,
    covering,
    evict,
    grown,
    insert,
    match,
    new_cache,
    release,
)
from servesim.serving.scheduler_sglang import CLIP_MAX_NEW_TOKENS, RETRACT_DECODE_STEPS, SglangScheduler
from servesim.serving.scheduler_vllm import VllmScheduler
from servesim.serving.state import STEP_LOG_COLUMNS, RequestLog, StepLog
from servesim.serving.step_cache import (
    CHUNK_BITS,
    COUNT_BITS,
    DECODE_BITS,
    EXACT_BELOW,
    EXACT_COUNT_BELOW,
    PREFILL_BITS,
    decode_span_at,
    decode_spread,
    grid_bounds,
    memoise_mixed_attention,
    rest_token_bounds,
    round_length,
    weight,
)
from servesim.serving.stop import STOP_METRICS, StopRule, StoppedEarly
from servesim.workloads.request import Workload

# Why _core_loop handed back.
_DONE, _NEED_ENTRIES, _ROWS_FULL, _GAPS_FULL, _PROGRESS, _STOPPED, _CACHE_FULL = range(7)

# Integer state (``st``), by index; SGLang's: the request whose prompt is part-way through (-1: none) and its
# receive skipper's counter.
(_FREE, _W_HEAD, _W_COUNT, _R_COUNT, _H_SIZE, _SEQ, _ISSUED, _FINISHED, _ROWS, _GAPS, _F_HEAD, _F_COUNT, _PENDING,
 _NEEDS, _READY, _LAUNCH, _REPORT_AT, _RULE, _CHUNKED_RID, _RECV_COUNTER) = range(20)
# Float state (``sf``), by index (SGLang's new-token ratio); each pipeline stage's free time follows the last.
_NOW, _CPU_FREE, _GPU_START, _FRONT_FREE, _ADMIT_BEFORE, _HOST_START, _RATIO, _STAGE_FREE = range(8)
# Configuration (``cfg_i``, ``cfg_f``), by index. ``_C_BLOCK`` is the page a cache hit is a whole number of,
# ``_C_UNIT`` the pool's unit of account (vLLM: both its block; SGLang: its page, and one token).
(_C_N, _C_SENDS, _C_CLOSED, _C_BUDGET, _C_MAX_SEQS, _C_BLOCK, _C_CAPACITY, _C_CHUNKED, _C_ASYNC, _C_FRONT_END,
 _C_KEEP_TIMES, _C_INTERVAL, _C_REPORT_EVERY, _C_PROGRESS, _C_PP, _C_CACHE, _C_SGLANG, _C_UNIT,
 _C_RECV_INTERVAL) = range(19)
_F_REQUEST_US, _F_PER_PROMPT_TOKEN_US, _F_LATENCY_US, _F_INIT_RATIO, _F_MIN_RATIO, _F_RATIO_DECAY = range(6)
# Request columns: integers (``req_i``) and times (``req_s``).
# The prefix cache's: blocks read from the cache, nodes referenced (servesim/serving/compiled_cache.py), tokens
# the last admission found cached, the prompt's segments (first, end) and its answer's segment id; whether an
# SGLang poll took it in.
(_COMPUTED, _GENERATED, _KV_HELD, _PREEMPTIONS, _IN_FLIGHT, _CACHED_UNITS, _PATH_LEN, _CACHED_TOKENS, _SEG_LO,
 _SEG_HI, _OUTPUT_ID, _RECEIVED) = range(12)
_ISSUE, _REACHED, _FIRST_SCHEDULED, _FIRST_TOKEN, _LAST_TOKEN, _LAST_STREAMED = range(6)
# A micro-batch's summary (``flight_i`` rows): its requests, prompt chunks, decodes, their context and the longest.
_M_LEN, _M_CHUNKS, _M_DECODES, _M_CONTEXTS, _M_LONGEST = range(5)

#: Step-log rows buffered before they are handed back.
_ROW_BUFFER = 4096
#: Slots the table of step-time parts and the table of gap values start with (each doubles when half full).
_TABLE_SLOTS = 1 << 12
_GAP_SLOTS = 1 << 14
# What the table holds, by the first column of a key (0: an empty slot), and what its values are:
# - a decode span by (decodes, grid context, spread): host overhead and each stage's time at its low context,
#   their deltas to the next grid context, the span's length;
# - a mixed step's graph plan by its tokens: the tokens padded, the graph mode (an index of GRAPH_MODES) and the
#   token counts its time outside attention is interpolated between (``rest_token_bounds``);
# - each stage's time outside attention by (tokens, requests) (``rest_time_us``);
# - one layer's attention time of a mixed step's representative batch by ``step_cache``'s key, and the step's
#   graph launches in each graph mode (``graph_launches``);
# - a step's device time per layer and host overhead by (requests, graph launches).
_SPAN, _PLAN, _REST, _ATTENTION, _COST = range(1, 6)
#: Integers of a key after its kind.
_KEY_WIDTH = 6
#: Entries one hand-back may ask for: a step's four interpolation corners.
_MAX_NEEDS = 4
GRAPH_MODES = ("none", "piecewise", "full")


def eligible(fleet, workload: Workload) -> bool:
    """Whether :func:`run` serves this run: one vLLM or SGLang replica (no attention data parallelism)."""
    return len(fleet) == 1 and type(fleet[0].scheduler) in (VllmScheduler, SglangScheduler) and len(workload) > 0


def run(replica, workload: Workload, requests: RequestLog, log: StepLog, rules: tuple[StopRule, ...],
        progress, prefix_identity: bool) -> None:
    """Serve ``workload`` on ``replica`` (a fresh ``_Replica`` that :func:`eligible` accepts) as the simulator's
    ``_run`` does: records every request in ``requests`` and every step in ``log``; raises :class:`StoppedEarly`
    (with the preemptions so far) when one of ``rules`` breaks. With ``prefix_identity`` (the workload's segments,
    and prefix caching on) the prefix cache is looked up and filled as the scheduler does."""
    scheduler, step_model = replica.scheduler, replica.step_model
    overhead = step_model.overhead
    n, pp = len(workload), replica.pp
    closed = workload.arrival_mode == "closed"
    sends = min(workload.concurrency, n) if closed else n
    sglang = type(scheduler) is SglangScheduler
    if sglang:
        budget, max_seqs, page, chunked, interval = (scheduler.chunk_size, scheduler.max_running,
                                                     scheduler.cache.page_tokens if scheduler.cache else 1, True,
                                                     scheduler.recv_interval)
        ratios = (scheduler.init_ratio, scheduler.min_ratio, scheduler.decay)
    else:
        budget, max_seqs, page, chunked, interval = (scheduler.token_budget, scheduler.max_num_seqs,
                                                     scheduler.block_size, scheduler.chunked_prefill, 1)
        ratios = (0.0, 0.0, 0.0)
    cfg_i = np.array([n, sends, closed, budget, max_seqs, page, scheduler.capacity, chunked,
                      replica.async_scheduling, overhead.has_front_end, requests.gaps is None,
                      requests.stream_interval, max(1, n // 100), progress is not None, pp, prefix_identity, sglang,
                      scheduler.kv_unit_tokens, interval], dtype=np.int64)
    cfg_f = np.array([overhead.request_us, overhead.per_prompt_token_us, overhead.request_latency_us, *ratios])
    prompt = workload.prompt_tokens.astype(np.int64)
    output = workload.output_tokens.astype(np.int64)
    arrival_s = workload.arrival_s.astype(np.float64)
    req_i = np.zeros((n, 12), dtype=np.int64)
    if prefix_identity:
        prefixes = workload.prefixes
        req_i[:, _SEG_LO], req_i[:, _SEG_HI] = prefixes.offsets[:-1], prefixes.offsets[1:]
        req_i[:, _OUTPUT_ID] = prefixes.output_ids
        # The prompts' segments, then a column for the answer being cached.
        segments = np.zeros((2, len(prefixes.segment_ids) + 1), dtype=np.int64)
        segments[0, :-1], segments[1, :-1] = prefixes.segment_ids, prefixes.segment_tokens
        nodes, children, lru, path, cs = new_cache(prefixes)
    else:
        segments, nodes, children, lru = (np.zeros((2, 1), dtype=np.int64), np.zeros((1, len(NODE_COLUMNS)),
                                          dtype=np.int64), np.zeros((1, 4), dtype=np.int64),
                                          np.zeros((1, 4), dtype=np.int64))
        path, cs = np.zeros(1, dtype=np.int64), np.zeros(6, dtype=np.int64)
    req_s = np.full((n, 6), -1.0)
    # The waiting ring, the running requests, a step's finished ones, the requests an SGLang retraction sorts.
    queues = np.zeros((4, n), dtype=np.int64)
    # The micro-batches in flight, a ring of pp slots: requests, their new tokens, summary, end.
    flight_rids = np.zeros((pp, n), dtype=np.int64)
    flight_new = np.zeros((pp, n), dtype=np.int64)
    flight_i = np.zeros((pp, 5), dtype=np.int64)
    flight_end = np.zeros(pp)
    chunks = np.zeros((n, 2), dtype=np.int64)  # the forming step's prompt chunks: new and cached tokens
    heap_s = np.zeros(n + 1)
    heap_i = np.zeros((n + 1, 3), dtype=np.int64)  # tie-breaker, request, where (-1: the client's send)
    # The table of step-time parts an earlier run of this step model left, else an empty one.
    keys, values, entries = step_model.loop_table or _empty_table(max(2 * pp + 3, 4))
    need = np.zeros((_MAX_NEEDS, 3 + _KEY_WIDTH), dtype=np.int64)  # a key, then what else Python needs to know
    answer = np.zeros(pp + 1)  # a mixed step's host overhead and each stage's time
    layers = np.array(step_model.stage_layers, dtype=np.int64)
    rule_i = np.array([(STOP_METRICS.index(rule.metric), rule.count, 0) for rule in rules],
                      dtype=np.int64).reshape(len(rules), 3)
    rule_ms = np.array([rule.limit_ms for rule in rules])
    rows = np.empty((_ROW_BUFFER, len(STEP_LOG_COLUMNS)))
    gap_values = np.zeros(0 if requests.gaps is None else _GAP_SLOTS)
    gap_counts = np.zeros(len(gap_values), dtype=np.int64)  # 0: an empty slot
    token_times = requests.token_times_s if requests.gaps is None else np.empty(0)
    st = np.zeros(20, dtype=np.int64)
    st[_FREE], st[_SEQ], st[_ISSUED], st[_REPORT_AT] = scheduler.free, sends, sends, min(cfg_i[_C_REPORT_EVERY], n)
    st[_RULE] = st[_CHUNKED_RID] = -1
    sf = np.zeros(_STAGE_FREE + pp)
    sf[_ADMIT_BEFORE] = math.inf
    sf[_RATIO] = cfg_f[_F_INIT_RATIO]
    st[_H_SIZE] = 1  # the first send
    heap_s[0], heap_i[0] = arrival_s[0], (0, 0, -1)
    while True:
        status = _core_loop(cfg_i, cfg_f, prompt, output, arrival_s, requests.token_offsets, req_i, req_s, queues,
                            flight_rids, flight_new, flight_i, flight_end, chunks, heap_s, heap_i, keys, values,
                            need, layers, answer, rule_i, rule_ms, rows, gap_values, gap_counts, token_times, st, sf,
                            segments, nodes, children, lru, path, cs)
        if status == _NEED_ENTRIES:
            for key, row in zip(need[:st[_NEEDS], :1 + _KEY_WIDTH], _entries(step_model, need[:st[_NEEDS]])):
                if 2 * (entries + 1) > len(keys):
                    keys, values = _grown(keys, values)
                entries += _store(keys, values, key, row)
            step_model.loop_table = keys, values, entries
        elif status == _ROWS_FULL:
            log.extend(rows)
            st[_ROWS] = 0
        elif status == _GAPS_FULL:
            gap_values, gap_counts = _grown_gaps(gap_values, gap_counts)
        elif status == _CACHE_FULL:
            nodes, children, lru = grown(nodes, children, lru)
        elif status == _PROGRESS:
            progress(int(st[_FINISHED]))
        else:
            break
    log.extend(rows[:st[_ROWS]])
    if status == _STOPPED:
        rule = rules[int(st[_RULE])]
        stop = StoppedEarly(rule, float(sf[_NOW]))
        stop.preemptions = int(req_i[:, _PREEMPTIONS].sum())
        raise stop
    if requests.gaps is not None:
        used = gap_counts > 0
        order = np.argsort(gap_values[used])
        requests.gaps.add_counts(gap_values[used][order], gap_counts[used][order])
    requests.issue_s[:] = req_s[:, _ISSUE]
    requests.first_scheduled_s[:] = req_s[:, _FIRST_SCHEDULED]
    requests.first_token_s[:] = req_s[:, _FIRST_TOKEN]
    requests.finish_s[:] = req_s[:, _LAST_TOKEN]
    requests.preemptions[:] = req_i[:, _PREEMPTIONS]
    requests.cached_tokens[:] = req_i[:, _CACHED_TOKENS]
    requests.finished = n


def _entries(step_model, need: np.ndarray) -> list[np.ndarray]:
    """The values of the table entries ``need`` asks for (rows of one kind, in the order the Python loop's
    ``step_time_us`` or ``decode_span_at`` would first ask the step model for them)."""
    kind = need[0, 0]
    if kind == _SPAN:
        decodes, contexts, longest = int(need[0, 1]), int(need[0, 7]), int(need[0, 8])
        span = decode_span_at(step_model, decodes, contexts // decodes, longest)
        return [np.array([span.overhead_us, *span.stage_us, span.overhead_delta_us, *span.stage_delta_us,
                          span.span])]
    if kind == _PLAN:
        plan = step_model.graph_plan(int(need[0, 1]), False)
        return [np.array([plan.padded_tokens, GRAPH_MODES.index(plan.mode),
                          *rest_token_bounds(step_model, plan.padded_tokens, plan.mode)], dtype=np.float64)]
    if kind == _REST:
        return [np.array(step_model.rest_time_us(tokens, requests, False))
                for tokens, requests in need[:, 1:3].tolist()]
    if kind == _ATTENTION:
        corners = [tuple(key) for key in need[:, 1:1 + _KEY_WIDTH].tolist()]
        memoise_mixed_attention(step_model, corners)
        memo = step_model.mixed_attention
        return [np.array([memo[corner][0], *(step_model.graph_launches(memo[corner][1], mode)
                                             for mode in GRAPH_MODES)]) for corner in corners]
    return [np.array([step_model.layer_device_us(requests), step_model.overhead.step_overhead_us(requests, launches)])
            for requests, launches in need[:, 1:3].tolist()]


def _empty_table(width: int) -> tuple[np.ndarray, np.ndarray, int]:
    """A table of step-time parts with nothing in it, for values ``width`` wide."""
    return np.zeros((_TABLE_SLOTS, 1 + _KEY_WIDTH), dtype=np.int64), np.zeros((_TABLE_SLOTS, width)), 0


def table_rows(table: tuple[np.ndarray, np.ndarray, int]) -> tuple[np.ndarray, np.ndarray]:
    """The entries of a table of step-time parts (``StepTimeModel.loop_table``): their keys and their values, a row
    each."""
    keys, values, _ = table
    used = keys[:, 0] != 0
    return keys[used], values[used]


def table_with(table: tuple[np.ndarray, np.ndarray, int] | None, keys: np.ndarray,
               values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """A new table holding the entries of ``table`` (None: none) and the entries ``keys``, ``values`` (rows, as
    :func:`table_rows` gives them; a key ``table`` holds keeps its value there, which is the same)."""
    old_keys, old_values, entries = table or _empty_table(values.shape[1])
    slots = len(old_keys)
    while 2 * (entries + len(keys)) > slots:
        slots *= 2
    new_keys = np.zeros((slots, old_keys.shape[1]), dtype=np.int64)
    new_values = np.zeros((slots, old_values.shape[1]))
    _refile(old_keys, old_values, new_keys, new_values)
    _refile(np.ascontiguousarray(keys, dtype=np.int64), np.ascontiguousarray(values, dtype=np.float64), new_keys,
            new_values)
    return new_keys, new_values, int(np.count_nonzero(new_keys[:, 0]))


def _grown(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The table with twice the slots, every entry filed again."""
    new_keys = np.zeros((2 * len(keys), keys.shape[1]), dtype=np.int64)
    new_values = np.zeros((2 * len(keys), values.shape[1]))
    _refile(keys, values, new_keys, new_values)
    return new_keys, new_values


def _grown_gaps(values_s: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The gap table with twice the slots, every value filed again."""
    new_values_s = np.zeros(2 * len(values_s))
    new_counts = np.zeros(2 * len(values_s), dtype=np.int64)
    _refile_gaps(values_s, counts, new_values_s, new_counts)
    return new_values_s, new_counts


@inner
def _gap_slot(values_s: np.ndarray, counts: np.ndarray, gap_s: float) -> int:
    """The slot of ``gap_s`` in the gap table: where it is counted, or the empty one where it would go."""
    mask = len(values_s) - 1
    slot = (int(gap_s * 1e9) * 40503) & mask
    while counts[slot] != 0 and values_s[slot] != gap_s:
        slot = (slot + 1) & mask
    return slot


@jit
def _refile_gaps(values_s: np.ndarray, counts: np.ndarray, new_values_s: np.ndarray, new_counts: np.ndarray) -> None:
    for old in range(len(values_s)):
        if counts[old]:
            slot = _gap_slot(new_values_s, new_counts, values_s[old])
            new_values_s[slot], new_counts[slot] = values_s[old], counts[old]


@inner
def _find(keys: np.ndarray, kind: int, k0: int, k1: int, k2: int, k3: int, k4: int, k5: int) -> int:
    """The slot of a key in the table: where it is, or the empty one where it would go (linear probing from a hash
    of the key)."""
    mask = len(keys) - 1
    slot = ((((((kind * 1000003 ^ k0) * 1000003 ^ k1) * 1000003 ^ k2) * 1000003 ^ k3) * 1000003 ^ k4) * 1000003
            ^ k5) & mask
    while keys[slot, 0] != 0 and not (keys[slot, 0] == kind and keys[slot, 1] == k0 and keys[slot, 2] == k1
                                      and keys[slot, 3] == k2 and keys[slot, 4] == k3 and keys[slot, 5] == k4
                                      and keys[slot, 6] == k5):
        slot = (slot + 1) & mask
    return slot


@jit
def _store(keys: np.ndarray, values: np.ndarray, key: np.ndarray, row: np.ndarray) -> int:
    """Files ``row`` under ``key`` (kind, then the key) unless the table has it; returns the entries added."""
    slot = _find(keys, key[0], key[1], key[2], key[3], key[4], key[5], key[6])
    if keys[slot, 0] != 0:
        return 0
    for column in range(len(key)):
        keys[slot, column] = key[column]
    for column in range(len(row)):
        values[slot, column] = row[column]
    return 1


@jit
def _refile(keys: np.ndarray, values: np.ndarray, new_keys: np.ndarray, new_values: np.ndarray) -> None:
    for old in range(len(keys)):
        if keys[old, 0] != 0:
            _store(new_keys, new_values, keys[old], values[old])


@inner
def _entry(keys: np.ndarray, need: np.ndarray, st: np.ndarray, kind: int, k0: int, k1: int, k2: int, k3: int,
           k4: int, k5: int) -> int:
    """The slot of a key the table has, else -1 with the key added to what the loop will ask Python for."""
    slot = _find(keys, kind, k0, k1, k2, k3, k4, k5)
    if keys[slot, 0] != 0:
        return slot
    row = need[st[_NEEDS]]
    row[0], row[1], row[2], row[3], row[4], row[5], row[6] = kind, k0, k1, k2, k3, k4, k5
    st[_NEEDS] += 1
    return -1


@inner
def _take(req_i: np.ndarray, st: np.ndarray, nodes: np.ndarray, lru: np.ndarray, cs: np.ndarray, rid: int,
          blocks: int) -> None:
    """``Scheduler._take``: give ``rid`` ``blocks`` more blocks, evicting cached ones when too few are free (the
    caller checked that enough are available)."""
    if blocks > st[_FREE]:
        st[_FREE] += evict(nodes, lru, cs, blocks - st[_FREE])
    st[_FREE] -= blocks
    req_i[rid, _KV_HELD] += blocks


@inner
def _drop(req_i: np.ndarray, st: np.ndarray, nodes: np.ndarray, lru: np.ndarray, cs: np.ndarray, path: np.ndarray,
          rid: int) -> None:
    """``Scheduler._drop``: free what ``rid`` holds and drop its references to the cache."""
    st[_FREE] += req_i[rid, _KV_HELD]
    req_i[rid, _KV_HELD] = 0
    if req_i[rid, _PATH_LEN]:
        release(nodes, lru, cs, path, req_i[rid, _SEG_LO] + rid, req_i[rid, _PATH_LEN])
        req_i[rid, _PATH_LEN] = 0
    req_i[rid, _CACHED_UNITS] = 0


@inner
def _cache_segments(req_i: np.ndarray, nodes: np.ndarray, children: np.ndarray, cs: np.ndarray,
                    segments: np.ndarray, path: np.ndarray, rid: int, lo: int, hi: int, block: int) -> None:
    """``Scheduler._cache_segments``: segments ``lo:hi`` join the cache after ``rid``'s path, and the blocks of the
    nodes this made pass from the request to the cache."""
    added, units = insert(nodes, children, cs, segments, lo, hi, path, req_i[rid, _SEG_LO] + rid,
                          req_i[rid, _PATH_LEN], block)
    req_i[rid, _PATH_LEN] += added
    if units > req_i[rid, _KV_HELD]:
        units = req_i[rid, _KV_HELD]
    req_i[rid, _KV_HELD] -= units
    req_i[rid, _CACHED_UNITS] += units


@inner
def _drop_running(running: np.ndarray, st: np.ndarray, at: int) -> None:
    """Take the running request at position ``at`` out, the others kept in order (``list.remove``, ``del``)."""
    for j in range(at, st[_R_COUNT] - 1):
        running[j] = running[j + 1]
    st[_R_COUNT] -= 1


@inner
def _remove_running(running: np.ndarray, st: np.ndarray, rid: int) -> None:
    """``running.remove(rid)``: :func:`_drop_running` at its position."""
    at = 0
    while running[at] != rid:
        at += 1
    _drop_running(running, st, at)


@inner
def _append_waiting(waiting: np.ndarray, st: np.ndarray, n: int, rid: int) -> None:
    """``waiting.append(rid)``: at the back of the ring of ``n`` slots."""
    waiting[(st[_W_HEAD] + st[_W_COUNT]) % n] = rid
    st[_W_COUNT] += 1


@inner
def _preempt(req_i: np.ndarray, st: np.ndarray, nodes: np.ndarray, lru: np.ndarray, cs: np.ndarray,
             path: np.ndarray, rid: int) -> None:
    """``Scheduler._preempted``: ``rid`` loses its KV and its progress (vLLM's preemption, SGLang's retraction)."""
    _drop(req_i, st, nodes, lru, cs, path, rid)
    req_i[rid, _COMPUTED] = 0
    req_i[rid, _PREEMPTIONS] += 1


@inner
def _add_to_step(prompt: np.ndarray, req_i: np.ndarray, rids: np.ndarray, news: np.ndarray, summary: np.ndarray,
                 chunks: np.ndarray, rid: int, new: int) -> None:
    """Request ``rid`` joins the forming step with ``new`` tokens after its computed ones (``schedule_requests``): a
    decode when its one new token is the last of its sequence and it has sampled one before, else a prompt
    chunk."""
    req_i[rid, _IN_FLIGHT] = 1
    length = summary[_M_LEN]
    rids[length], news[length] = rid, new
    summary[_M_LEN] = length + 1
    computed, generated = req_i[rid, _COMPUTED], req_i[rid, _GENERATED]
    if new == 1 and generated > 0 and computed == prompt[rid] + generated - 1:
        summary[_M_DECODES] += 1
        summary[_M_CONTEXTS] += computed
        if computed > summary[_M_LONGEST]:
            summary[_M_LONGEST] = computed
    else:
        chunks[summary[_M_CHUNKS], 0], chunks[summary[_M_CHUNKS], 1] = new, computed
        summary[_M_CHUNKS] += 1


@inner
def _lookup(cfg_i: np.ndarray, prompt: np.ndarray, req_i: np.ndarray, segments: np.ndarray, nodes: np.ndarray,
            children: np.ndarray, path: np.ndarray, rid: int) -> tuple[int, int, int, int]:
    """``Scheduler.lookup`` of waiting request ``rid``: where its path starts in ``path``, the nodes its cache hit
    reads, the tokens served from the cache (whole pages, one prompt token left) and the units referencing them
    takes out of the evictable ones; no hit without prompt identity or with tokens already computed."""
    at = req_i[rid, _SEG_LO] + rid
    if not cfg_i[_C_CACHE] or req_i[rid, _COMPUTED]:
        return at, 0, 0, 0
    count, matched = match(nodes, children, segments, req_i[rid, _SEG_LO], req_i[rid, _SEG_HI], path, at)
    seq_len, page = prompt[rid] + req_i[rid, _GENERATED], cfg_i[_C_BLOCK]
    hit = (matched if matched < seq_len - 1 else seq_len - 1) // page * page
    if not hit:
        return at, 0, 0, 0
    count, pinned = covering(nodes, path, at, count, hit)
    return at, count, hit, pinned


@inner
def _admit_hit(cfg_i: np.ndarray, req_i: np.ndarray, nodes: np.ndarray, cs: np.ndarray, path: np.ndarray, rid: int,
               at: int, count: int, hit: int) -> None:
    """``Scheduler.admit_hit``: ``rid`` reads the ``hit`` tokens of the ``count`` nodes :func:`_lookup` found."""
    if count:
        acquire(nodes, cs, path, at, count)
        req_i[rid, _PATH_LEN] = count
        req_i[rid, _CACHED_UNITS] = hit // cfg_i[_C_UNIT]
        req_i[rid, _COMPUTED] = hit
    req_i[rid, _CACHED_TOKENS] = hit


@inner
def _schedule(cfg_i: np.ndarray, prompt: np.ndarray, req_i: np.ndarray, req_s: np.ndarray, queues: np.ndarray,
              rids: np.ndarray, news: np.ndarray, summary: np.ndarray, chunks: np.ndarray, st: np.ndarray,
              sf: np.ndarray, segments: np.ndarray, nodes: np.ndarray, children: np.ndarray, lru: np.ndarray,
              path: np.ndarray, cs: np.ndarray) -> bool:
    """``VllmScheduler.schedule``: the step's requests and new tokens go to ``rids`` and ``news``, its prompt
    chunks to ``chunks``, its summary to ``summary`` (a ``flight_i`` row), and its requests are marked in flight
    (:func:`_add_to_step`). Returns whether it scheduled anything."""
    waiting, running = queues[0], queues[1]
    n, block = cfg_i[_C_N], cfg_i[_C_BLOCK]
    budget = cfg_i[_C_BUDGET]
    for field in range(len(summary)):
        summary[field] = 0
    preempted = False
    i = 0
    while i < st[_R_COUNT] and budget > 0:
        rid = running[i]
        i += 1
        if req_i[rid, _IN_FLIGHT]:
            continue
        computed, generated = req_i[rid, _COMPUTED], req_i[rid, _GENERATED]
        left = prompt[rid] + generated - computed
        new = left if left < budget else budget
        need = -(-(computed + new) // block) - req_i[rid, _KV_HELD] - req_i[rid, _CACHED_UNITS]
        if need > 0:
            got = True
            while need > st[_FREE] + cs[EVICTABLE]:  # preempt the newest running request from this one on that is
                # not in flight
                preempted = True
                at = st[_R_COUNT] - 1
                while at >= i - 1 and req_i[running[at], _IN_FLIGHT]:
                    at -= 1
                if at < i - 1:
                    got = False
                    break
                victim = running[at]
                _drop_running(running, st, at)
                _preempt(req_i, st, nodes, lru, cs, path, victim)
                st[_W_HEAD] = (st[_W_HEAD] - 1) % n
                waiting[st[_W_HEAD]] = victim
                st[_W_COUNT] += 1
                if victim == rid:
                    got = False
                    break
            if not got:
                break
            _take(req_i, st, nodes, lru, cs, rid, need)
        _add_to_step(prompt, req_i, rids, news, summary, chunks, rid, new)
        budget -= new
    if not preempted:
        while st[_W_COUNT] and st[_R_COUNT] < cfg_i[_C_MAX_SEQS]:
            rid = waiting[st[_W_HEAD]]
            if req_s[rid, _REACHED] > sf[_ADMIT_BEFORE]:
                break
            computed, generated = req_i[rid, _COMPUTED], req_i[rid, _GENERATED]
            at, count, hit, pinned = _lookup(cfg_i, prompt, req_i, segments, nodes, children, path, rid)
            new = prompt[rid] + generated - computed - hit
            if budget <= 0 or (new > budget and not cfg_i[_C_CHUNKED]):
                break
            if new > budget:
                new = budget
            need = -(-(computed + hit + new) // block) - req_i[rid, _KV_HELD] - hit // block
            if need + pinned > st[_FREE] + cs[EVICTABLE]:
                break
            _admit_hit(cfg_i, req_i, nodes, cs, path, rid, at, count, hit)
            _take(req_i, st, nodes, lru, cs, rid, need)
            st[_W_HEAD] = (st[_W_HEAD] + 1) % n
            st[_W_COUNT] -= 1
            running[st[_R_COUNT]] = rid
            st[_R_COUNT] += 1
            budget -= new
            if req_s[rid, _FIRST_SCHEDULED] < 0:
                req_s[rid, _FIRST_SCHEDULED] = sf[_NOW]
            _add_to_step(prompt, req_i, rids, news, summary, chunks, rid, new)
    return summary[_M_LEN] > 0


@inner
def _admissible(cfg_i: np.ndarray, req_i: np.ndarray, req_s: np.ndarray, sf: np.ndarray, rid: int) -> bool:
    """Whether SGLang may admit waiting request ``rid`` now: it reached the engine before the host began the step,
    and, with a receive interval, a poll took it in."""
    return req_s[rid, _REACHED] <= sf[_ADMIT_BEFORE] and (cfg_i[_C_RECV_INTERVAL] <= 1 or req_i[rid, _RECEIVED] == 1)


@inner
def _sglang_prefill(cfg_i: np.ndarray, prompt: np.ndarray, output: np.ndarray, req_i: np.ndarray,
                    req_s: np.ndarray, queues: np.ndarray, rids: np.ndarray, news: np.ndarray, summary: np.ndarray,
                    chunks: np.ndarray, st: np.ndarray, sf: np.ndarray, segments: np.ndarray, nodes: np.ndarray,
                    children: np.ndarray, lru: np.ndarray, path: np.ndarray, cs: np.ndarray) -> None:
    """``SglangScheduler._prefill_step``: the request part-way through continues, then waiting requests join while
    the chunk budget and the memory left after the running requests' reservation allow."""
    waiting, running = queues[0], queues[1]
    n = cfg_i[_C_N]
    chunked = st[_CHUNKED_RID]
    if chunked < 0 and (not st[_W_COUNT] or st[_R_COUNT] >= cfg_i[_C_MAX_SEQS]):
        return
    rem_chunk = cfg_i[_C_BUDGET]
    left = 0  # _reserved_tokens: each running request's output left, clipped
    for i in range(st[_R_COUNT]):
        rid = running[i]
        todo = output[rid] - req_i[rid, _GENERATED]
        left += todo if todo < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS
    rem_total = (st[_FREE] + cs[EVICTABLE]) - left * sf[_RATIO]
    if chunked >= 0:
        rid = chunked
        todo = prompt[rid] + req_i[rid, _GENERATED] - req_i[rid, _COMPUTED]
        new = todo if todo < rem_chunk else rem_chunk
        if new == todo:  # last chunk: it decodes from the next step on
            st[_CHUNKED_RID] = chunked = -1
            running[st[_R_COUNT]] = rid
            st[_R_COUNT] += 1
        _take(req_i, st, nodes, lru, cs, rid, new)
        _add_to_step(prompt, req_i, rids, news, summary, chunks, rid, new)
        rem_chunk -= new
        rem_total -= new
    while st[_W_COUNT] and rem_chunk > 0 and st[_R_COUNT] + (chunked >= 0) < cfg_i[_C_MAX_SEQS]:
        rid = waiting[st[_W_HEAD]]
        if not _admissible(cfg_i, req_i, req_s, sf, rid):
            break
        generated = req_i[rid, _GENERATED]
        seq_len = prompt[rid] + generated
        at, count, hit, pinned = _lookup(cfg_i, prompt, req_i, segments, nodes, children, path, rid)
        extend = seq_len - hit
        todo = output[rid] - generated
        total = extend + (todo if todo < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS)
        if total + pinned > rem_total:
            break
        st[_W_HEAD] = (st[_W_HEAD] + 1) % n
        st[_W_COUNT] -= 1
        if req_s[rid, _FIRST_SCHEDULED] < 0:
            req_s[rid, _FIRST_SCHEDULED] = sf[_NOW]
        _admit_hit(cfg_i, req_i, nodes, cs, path, rid, at, count, hit)
        rem_total -= pinned
        new = extend if extend < rem_chunk else rem_chunk
        _take(req_i, st, nodes, lru, cs, rid, new)
        _add_to_step(prompt, req_i, rids, news, summary, chunks, rid, new)
        rem_chunk -= new
        rem_total -= total
        if new < extend:
            st[_CHUNKED_RID] = rid
            break
        running[st[_R_COUNT]] = rid
        st[_R_COUNT] += 1
    if summary[_M_LEN]:
        st[_RECV_COUNTER] = cfg_i[_C_RECV_INTERVAL]  # a prefill batch weighs 1000: the next iteration polls


@inner
def _sglang_retract(prompt: np.ndarray, output: np.ndarray, req_i: np.ndarray, queues: np.ndarray, st: np.ndarray,
                    sf: np.ndarray, nodes: np.ndarray, lru: np.ndarray, path: np.ndarray, cs: np.ndarray, n: int,
                    count: int) -> int:
    """``SglangScheduler._retract`` of the ``count`` decoding requests at the start of ``queues[3]``: sorted by
    most tokens generated (then shortest prompt, then running order), the last ones go back to the waiting queue
    until one slot per remaining request is free (at least one goes). Returns how many remain, in
    ``queues[3]`` in that order."""
    waiting, running, order = queues[0], queues[1], queues[3]
    keys = np.empty(count, dtype=np.int64)
    for j in range(count):  # sorted by (generated, -prompt), descending; ties in running order
        keys[j] = req_i[order[j], _GENERATED] * (1 << 32) - prompt[order[j]]
    sorted_rids = order[:count][stable_argsort(keys, True)]
    for j in range(count):
        order[j] = sorted_rids[j]
    while count > 1:
        count -= 1
        victim = order[count]
        _remove_running(running, st, victim)
        _preempt(req_i, st, nodes, lru, cs, path, victim)
        _append_waiting(waiting, st, n, victim)
        if st[_FREE] + cs[EVICTABLE] >= count:
            break
    decoded = budget = 0
    for j in range(count):
        decoded += req_i[order[j], _GENERATED]
        budget += output[order[j]]
    ratio = (decoded + RETRACT_DECODE_STEPS * count) / budget
    sf[_RATIO] = ratio if ratio < 1.0 else 1.0
    return count


@inner
def _schedule_sglang(cfg_i: np.ndarray, cfg_f: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                     req_i: np.ndarray, req_s: np.ndarray, queues: np.ndarray, rids: np.ndarray, news: np.ndarray,
                     summary: np.ndarray, chunks: np.ndarray, st: np.ndarray, sf: np.ndarray, segments: np.ndarray,
                     nodes: np.ndarray, children: np.ndarray, lru: np.ndarray, path: np.ndarray,
                     cs: np.ndarray) -> bool:
    """``SglangScheduler.schedule`` into the arrays :func:`_schedule` fills: a prefill batch when one can form,
    else a decode batch of every running request not in flight. Returns whether it scheduled anything."""
    waiting, running, order = queues[0], queues[1], queues[3]
    n, interval = cfg_i[_C_N], cfg_i[_C_RECV_INTERVAL]
    for field in range(len(summary)):
        summary[field] = 0
    chunked = st[_CHUNKED_RID]
    if interval > 1 and ((not st[_R_COUNT] and chunked < 0) or st[_RECV_COUNTER] >= interval):  # _poll
        st[_RECV_COUNTER] = 0
        for j in range(st[_W_COUNT]):
            rid = waiting[(st[_W_HEAD] + j) % n]
            if req_s[rid, _REACHED] <= sf[_ADMIT_BEFORE]:
                req_i[rid, _RECEIVED] = 1
    if chunked < 0 or not req_i[chunked, _IN_FLIGHT]:
        _sglang_prefill(cfg_i, prompt, output, req_i, req_s, queues, rids, news, summary, chunks, st, sf, segments,
                        nodes, children, lru, path, cs)
    if not summary[_M_LEN]:  # _decode_step
        count = 0
        for j in range(st[_R_COUNT]):
            if not req_i[running[j], _IN_FLIGHT]:
                order[count] = running[j]
                count += 1
        if count:
            if st[_FREE] + cs[EVICTABLE] < count:
                count = _sglang_retract(prompt, output, req_i, queues, st, sf, nodes, lru, path, cs, n, count)
                if st[_FREE] + cs[EVICTABLE] < count:
                    count = 0  # what is left waits for micro-batches still in the pipeline
            else:  # decode_launched
                ratio = sf[_RATIO] - cfg_f[_F_RATIO_DECAY]
                sf[_RATIO] = ratio if ratio > cfg_f[_F_MIN_RATIO] else cfg_f[_F_MIN_RATIO]
                if interval > 1:
                    polled = st[_RECV_COUNTER] + 1
                    if polled > interval:
                        polled = polled % interval or interval
                    st[_RECV_COUNTER] = polled
            for j in range(count):  # _take_one_each
                rid = order[j]
                _take(req_i, st, nodes, lru, cs, rid, 1)
                _add_to_step(prompt, req_i, rids, news, summary, chunks, rid, 1)
    if not summary[_M_LEN] and not st[_R_COUNT] and st[_CHUNKED_RID] < 0:
        sf[_RATIO] = cfg_f[_F_INIT_RATIO]  # an idle server starts estimating afresh
    return summary[_M_LEN] > 0


@inner
def _form_step(cfg_i: np.ndarray, cfg_f: np.ndarray, prompt: np.ndarray, output: np.ndarray, req_i: np.ndarray,
               req_s: np.ndarray, queues: np.ndarray, rids: np.ndarray, news: np.ndarray, summary: np.ndarray,
               chunks: np.ndarray, st: np.ndarray, sf: np.ndarray, segments: np.ndarray, nodes: np.ndarray,
               children: np.ndarray, lru: np.ndarray, path: np.ndarray, cs: np.ndarray) -> bool:
    """``_Replica._schedule``: under async scheduling (one stage) the host begins the step while the one before
    runs, and admits only requests that reached the engine by then, unless nothing else would run."""
    now_s = sf[_NOW]
    retry = False
    if cfg_i[_C_ASYNC]:
        earliest_s = sf[_GPU_START] if sf[_STAGE_FREE] >= now_s else now_s
        host_start_s = sf[_HOST_START] = earliest_s if earliest_s > sf[_CPU_FREE] else sf[_CPU_FREE]
        sf[_ADMIT_BEFORE] = host_start_s
        retry = host_start_s < now_s
    while True:  # one call site each: numba compiles each scheduler into the loop once
        if cfg_i[_C_SGLANG]:
            formed = _schedule_sglang(cfg_i, cfg_f, prompt, output, req_i, req_s, queues, rids, news, summary,
                                      chunks, st, sf, segments, nodes, children, lru, path, cs)
        else:
            formed = _schedule(cfg_i, prompt, req_i, req_s, queues, rids, news, summary, chunks, st, sf, segments,
                               nodes, children, lru, path, cs)
        if formed or not retry or not st[_W_COUNT]:
            return formed
        retry = False
        sf[_HOST_START] = now_s if now_s > sf[_CPU_FREE] else sf[_CPU_FREE]
        sf[_ADMIT_BEFORE] = np.inf


@inner
def _emit(cfg_i: np.ndarray, output: np.ndarray, token_offsets: np.ndarray, req_s: np.ndarray,
          token_times: np.ndarray, rid: int, index: int, now_s: float) -> float:
    """Token ``index`` of request ``rid`` is sampled at ``now_s``: kept, or, when it ends a chunk the client
    receives (``streamed_positions``), the gap since the last chunk returned to be counted (else -1)."""
    req_s[rid, _LAST_TOKEN] = now_s
    if cfg_i[_C_KEEP_TIMES]:
        token_times[token_offsets[rid] + index] = now_s
    elif index % cfg_i[_C_INTERVAL] == 0 or index == output[rid] - 1:
        last_s = req_s[rid, _LAST_STREAMED]
        req_s[rid, _LAST_STREAMED] = now_s
        if index:
            return now_s - last_s
    return -1.0


@inner
def _count_gaps(gap_values: np.ndarray, gap_counts: np.ndarray, st: np.ndarray, gap_s: float, count: int) -> None:
    slot = _gap_slot(gap_values, gap_counts, gap_s)
    if gap_counts[slot] == 0:
        gap_values[slot] = gap_s
        st[_GAPS] += 1
    gap_counts[slot] += count


@inner
def _over(rule_i: np.ndarray, rule_ms: np.ndarray, st: np.ndarray, rule: int, value_s: float) -> bool:
    """``ViolationCounter._over``: whether the rule reached its count."""
    if value_s * 1e3 > rule_ms[rule]:
        rule_i[rule, 2] += 1
        if rule_i[rule, 2] >= rule_i[rule, 1]:
            st[_RULE] = rule
            return True
    return False


@inner
def _round_half_even(value: float) -> int:
    """Python's ``round`` of a float: to the nearest integer, halves to the even one."""
    low = int(math.floor(value))
    fraction = value - low
    return low + 1 if fraction > 0.5 or (fraction == 0.5 and low % 2 == 1) else low


@inner
def _lerp_in(values: np.ndarray, low_slot: int, high_slot: int, column: int, weight: float) -> float:
    """``step_cache._lerp`` of one column of two table entries (the high one only read when ``weight`` is not
    0)."""
    low = values[low_slot, column]
    return low if weight == 0.0 else low + weight * (values[high_slot, column] - low)


@inner
def _bilinear_in(values: np.ndarray, slots: tuple[int, int, int, int], column: int, x_weight: float,
                 y_weight: float) -> float:
    """``step_cache._bilinear`` of one column of the table entries at corners (x low, y low), (x high, y low),
    (x low, y high), (x high, y high)."""
    low = _lerp_in(values, slots[0], slots[1], column, x_weight)
    if y_weight == 0.0:
        return low
    return low + y_weight * (_lerp_in(values, slots[2], slots[3], column, x_weight) - low)


@inner
def _corner(keys: np.ndarray, need: np.ndarray, st: np.ndarray, kind: int, k0: int, k1: int, k2: int, k3: int,
            x: int, y: int) -> int:
    """:func:`_entry` of corner (``x``, ``y``) after keys ``k0``-``k3``; of the time outside attention, of
    (x, min(y, x)) alone (``step_cache.step_time_us``: no more requests than tokens)."""
    if kind == _REST:
        return _entry(keys, need, st, kind, x, min(y, x), 0, 0, 0, 0)
    return _entry(keys, need, st, kind, k0, k1, k2, k3, x, y)


@inner
def _corners(keys: np.ndarray, need: np.ndarray, st: np.ndarray, kind: int, k0: int, k1: int, k2: int, k3: int,
             x_low: int, x_high: int, y_low: int, y_high: int, x_weight: float, y_weight: float
             ) -> tuple[int, int, int, int]:
    """The slots of the corners :func:`_bilinear_in` reads, those of zero weight not asked for (slot 0); each
    missing one is added to ``need``, in the order ``step_cache._bilinear`` asks for them."""
    low_low = _corner(keys, need, st, kind, k0, k1, k2, k3, x_low, y_low)
    high_low = _corner(keys, need, st, kind, k0, k1, k2, k3, x_high, y_low) if x_weight != 0.0 else 0
    low_high = _corner(keys, need, st, kind, k0, k1, k2, k3, x_low, y_high) if y_weight != 0.0 else 0
    high_high = (_corner(keys, need, st, kind, k0, k1, k2, k3, x_high, y_high)
                 if x_weight != 0.0 and y_weight != 0.0 else 0)
    return low_low, high_low, low_high, high_high


@inner
def _mixed_step_time(pp: int, layers: np.ndarray, chunks: np.ndarray, summary: np.ndarray, keys: np.ndarray,
                     values: np.ndarray, need: np.ndarray, st: np.ndarray, answer: np.ndarray) -> bool:
    """``step_cache.step_time_us`` of the forming step (it has prompt chunks), host overhead and each stage's time
    into ``answer``, from the entries of the table; or False with the entries it lacks in ``need``: those of the
    first kind it lacks, in the order the Python function first asks the step model for them."""
    decodes, prefills = summary[_M_DECODES], summary[_M_CHUNKS]
    requests, tokens, squares, weighted = decodes + prefills, decodes, 0, 0
    for chunk in range(prefills):
        new, cached = chunks[chunk, 0], chunks[chunk, 1]
        tokens += new
        squares += new * new
        weighted += new * cached
    st[_NEEDS] = 0
    plan = _entry(keys, need, st, _PLAN, tokens, 0, 0, 0, 0, 0)
    if plan < 0:
        return False
    padded, mode = int(values[plan, 0]), int(values[plan, 1])
    token_low, token_high = int(values[plan, 2]), int(values[plan, 3])
    request_low, request_high = grid_bounds(requests, COUNT_BITS, EXACT_COUNT_BELOW)
    token_weight = weight(padded, (token_low, token_high))
    request_weight = weight(requests, (request_low, request_high))
    rest = _corners(keys, need, st, _REST, 0, 0, 0, 0, token_low, token_high, request_low, request_high,
                    token_weight, request_weight)
    if st[_NEEDS]:
        return False
    # The attention of equal chunks (step_cache.equal_chunks) beside the decodes.
    mean_context = summary[_M_CONTEXTS] // decodes if decodes else 0
    context = round_length(mean_context, PREFILL_BITS)
    spread = decode_spread(mean_context, summary[_M_LONGEST]) if decodes else 0
    if prefills == 1:
        new_tokens, cached_tokens = float(chunks[0, 0]), float(chunks[0, 1])
    else:
        new_tokens = math.sqrt(squares / prefills)
        cached_tokens = weighted / (prefills * new_tokens)
    cached = round_length(_round_half_even(cached_tokens), PREFILL_BITS)
    chunk_low, chunk_high = grid_bounds(new_tokens, CHUNK_BITS, EXACT_BELOW)
    count_low, count_high = grid_bounds(decodes, COUNT_BITS, EXACT_COUNT_BELOW)
    chunk_weight = weight(new_tokens, (chunk_low, chunk_high))
    count_weight = weight(decodes, (count_low, count_high))
    attention = _corners(keys, need, st, _ATTENTION, prefills, cached, context, spread, chunk_low, chunk_high,
                         count_low, count_high, chunk_weight, count_weight)
    if st[_NEEDS]:
        return False
    attention_us = _bilinear_in(values, attention, 0, chunk_weight, count_weight)
    cost = _entry(keys, need, st, _COST, requests, int(values[attention[0], 1 + mode]), 0, 0, 0, 0)
    if cost < 0:
        return False
    answer[0] = values[cost, 1]  # StepTimeModel.compose
    for stage in range(pp):
        answer[1 + stage] = (_bilinear_in(values, rest, stage, token_weight, request_weight)
                             + layers[stage] * (attention_us + values[cost, 0]))
    return True


@jit
def _core_loop(cfg_i: np.ndarray, cfg_f: np.ndarray, prompt: np.ndarray, output: np.ndarray, arrival_s: np.ndarray,
               token_offsets: np.ndarray, req_i: np.ndarray, req_s: np.ndarray, queues: np.ndarray,
               flight_rids: np.ndarray, flight_new: np.ndarray, flight_i: np.ndarray, flight_end: np.ndarray,
               chunks: np.ndarray, heap_s: np.ndarray, heap_i: np.ndarray, keys: np.ndarray, values: np.ndarray,
               need: np.ndarray, layers: np.ndarray, answer: np.ndarray, rule_i: np.ndarray, rule_ms: np.ndarray,
               rows: np.ndarray, gap_values: np.ndarray, gap_counts: np.ndarray, token_times: np.ndarray,
               st: np.ndarray, sf: np.ndarray, segments: np.ndarray, nodes: np.ndarray, children: np.ndarray,
               lru: np.ndarray, path: np.ndarray, cs: np.ndarray) -> int:
    """Run events until the run ends or Python must act (the module docstring says when); returns why. Every
    array is state that a later call goes on from."""
    n, sends, closed, pp = cfg_i[_C_N], cfg_i[_C_SENDS], cfg_i[_C_CLOSED], cfg_i[_C_PP]
    waiting, running, finished_rids = queues[0], queues[1], queues[2]
    while True:
        if st[_PENDING]:  # a step formed at sf[_NOW] in the flight slot after the last waits for its time
            if st[_ROWS] == len(rows):
                return _ROWS_FULL
            slot = (st[_F_HEAD] + st[_F_COUNT]) % pp
            summary = flight_i[slot]
            num_decodes = summary[_M_DECODES]
            if summary[_M_CHUNKS] == 0:  # decodes only: step_cache.decode_step_time_us
                context = summary[_M_CONTEXTS] // num_decodes
                low = grid_bounds(context, DECODE_BITS, EXACT_BELOW)[0]
                spread = decode_spread(context, summary[_M_LONGEST])
                st[_NEEDS] = 0
                at = _entry(keys, need, st, _SPAN, num_decodes, low, spread, 0, 0, 0)
                if at < 0:
                    need[0, 7], need[0, 8] = summary[_M_CONTEXTS], summary[_M_LONGEST]
                    return _NEED_ENTRIES
                times = values[at]
                weight = 0.0 if context == low else (context - low) / times[2 * pp + 2]  # DecodeSpan.at
            else:
                if not _mixed_step_time(pp, layers, chunks, summary, keys, values, need, st, answer):
                    return _NEED_ENTRIES
                times = answer
                weight = 0.0
            overhead_us = times[0] if weight == 0.0 else times[0] + weight * times[pp + 1]
            now_s = sf[_NOW]
            if cfg_i[_C_ASYNC]:  # _Replica.occupy_async (one stage)
                stage_us = times[1] if weight == 0.0 else times[1] + weight * times[pp + 2]
                ready_s = sf[_CPU_FREE] = sf[_HOST_START] + overhead_us * 1e-6
                start_s = now_s if now_s > ready_s else ready_s
                if sf[_STAGE_FREE] > start_s:
                    start_s = sf[_STAGE_FREE]
                sf[_GPU_START] = start_s
                end_s = sf[_STAGE_FREE] = start_s + stage_us * 1e-6
            else:  # _Replica.occupy
                start_s = now_s if now_s > sf[_CPU_FREE] else sf[_CPU_FREE]
                end_s = sf[_CPU_FREE] = start_s + overhead_us * 1e-6
                for stage in range(pp):
                    stage_us = times[1 + stage] if weight == 0.0 else times[1 + stage] + weight * times[pp + 2 + stage]
                    free_s = sf[_STAGE_FREE + stage]
                    end_s = sf[_STAGE_FREE + stage] = (end_s if end_s > free_s else free_s) + stage_us * 1e-6
            prefill_tokens = 0
            for chunk in range(summary[_M_CHUNKS]):
                prefill_tokens += chunks[chunk, 0]
            row = rows[st[_ROWS]]
            row[0], row[1], row[2], row[3] = 0, start_s, end_s, summary[_M_LEN]
            row[4], row[5], row[6] = prefill_tokens + num_decodes, prefill_tokens, num_decodes
            row[7] = (cfg_i[_C_CAPACITY] - st[_FREE] - cs[EVICTABLE]) * cfg_i[_C_UNIT]
            st[_ROWS] += 1
            flight_end[slot] = end_s
            st[_F_COUNT] += 1
            st[_PENDING] = 0
            continue
        if st[_LAUNCH]:  # every event of the instant is in: form steps while the pipeline has room
            slot = (st[_F_HEAD] + st[_F_COUNT]) % pp
            if st[_F_COUNT] < pp and _form_step(cfg_i, cfg_f, prompt, output, req_i, req_s, queues,
                                                flight_rids[slot], flight_new[slot], flight_i[slot], chunks, st, sf,
                                                segments, nodes, children, lru, path, cs):
                st[_PENDING] = 1
            else:
                st[_LAUNCH] = 0
            continue
        report = False
        in_flight = st[_F_COUNT] > 0
        first_end_s = flight_end[st[_F_HEAD]] if in_flight else np.inf
        if st[_H_SIZE] == 0 and not in_flight:
            return _DONE
        if st[_H_SIZE] and (not in_flight or heap_s[0] <= first_end_s):  # an arrival
            now_s = sf[_NOW] = heap_s[0]
            tie, rid, where = heap_i[0, 0], heap_i[0, 1], heap_i[0, 2]
            heap_pop(heap_s, heap_i, st, _H_SIZE)
            reaches = True
            if where < 0:  # the client's send
                if tie + 1 < sends:
                    heap_push(heap_s, heap_i, st, _H_SIZE, arrival_s[tie + 1], tie + 1, tie + 1, -1)
                req_s[rid, _ISSUE] = req_s[rid, _REACHED] = now_s
                if cfg_i[_C_FRONT_END]:  # _Replica.front_end: it reaches the engine later
                    start_s = now_s if now_s > sf[_FRONT_FREE] else sf[_FRONT_FREE]
                    sf[_FRONT_FREE] = start_s + (cfg_f[_F_REQUEST_US]
                                                 + cfg_f[_F_PER_PROMPT_TOKEN_US] * prompt[rid]) * 1e-6
                    heap_push(heap_s, heap_i, st, _H_SIZE, sf[_FRONT_FREE] + cfg_f[_F_LATENCY_US] * 1e-6, st[_SEQ],
                              rid, 0)
                    st[_SEQ] += 1
                    reaches = False
            else:
                req_s[rid, _REACHED] = now_s
            if reaches:
                _append_waiting(waiting, st, n, rid)
                st[_READY] = 1
        else:  # the first micro-batch in flight completes: finish_step
            slot = st[_F_HEAD]
            summary, rids, news = flight_i[slot], flight_rids[slot], flight_new[slot]
            if not cfg_i[_C_KEEP_TIMES] and 2 * (st[_GAPS] + summary[_M_LEN]) > len(gap_values):
                return _GAPS_FULL  # each of the step's tokens may add a value
            if cfg_i[_C_CACHE]:  # each request may add a node per segment of its prompt and one for its answer
                new_nodes = 0
                for k in range(summary[_M_LEN]):
                    new_nodes += req_i[rids[k], _SEG_HI] - req_i[rids[k], _SEG_LO] + 1
                if cs[NODES] + new_nodes > len(nodes):
                    return _CACHE_FULL
            now_s = sf[_NOW] = first_end_s
            st[_F_HEAD] = (slot + 1) % pp
            st[_F_COUNT] -= 1
            finished = 0
            # Gaps are counted a run of equal ones at a time: the step's requests mostly sampled their last token
            # in the same step before it.
            run_gap_s, run = 0.0, 0
            for k in range(summary[_M_LEN]):
                rid = rids[k]
                req_i[rid, _IN_FLIGHT] = 0
                computed = req_i[rid, _COMPUTED] = req_i[rid, _COMPUTED] + news[k]
                generated = req_i[rid, _GENERATED]
                if computed == prompt[rid] + generated:
                    if not generated:
                        req_s[rid, _FIRST_TOKEN] = now_s
                    gap_s = _emit(cfg_i, output, token_offsets, req_s, token_times, rid, generated, now_s)
                    if gap_s >= 0.0:
                        if run and gap_s == run_gap_s:
                            run += 1
                        else:
                            if run:
                                _count_gaps(gap_values, gap_counts, st, run_gap_s, run)
                            run_gap_s, run = gap_s, 1
                    generated = req_i[rid, _GENERATED] = generated + 1
                    if generated == output[rid]:
                        finished_rids[finished] = rid
                        finished += 1
            if run:
                _count_gaps(gap_values, gap_counts, st, run_gap_s, run)
            if cfg_i[_C_CACHE]:  # Scheduler.step_done: prompts the step completed join the cache
                for k in range(summary[_M_LEN]):
                    rid = rids[k]
                    computed = req_i[rid, _COMPUTED]
                    if computed - news[k] < prompt[rid] <= computed:
                        _cache_segments(req_i, nodes, children, cs, segments, path, rid,
                                        req_i[rid, _SEG_LO] + req_i[rid, _PATH_LEN], req_i[rid, _SEG_HI],
                                        cfg_i[_C_UNIT])
            for rule in range(len(rule_i)):  # ViolationCounter.step_done
                metric = rule_i[rule, 0]
                if metric == 0 and summary[_M_CHUNKS]:
                    for k in range(summary[_M_LEN]):
                        rid = rids[k]
                        if (req_i[rid, _GENERATED] == 1 and req_s[rid, _FIRST_TOKEN] == now_s
                                and _over(rule_i, rule_ms, st, rule, now_s - req_s[rid, _ISSUE])):
                            return _STOPPED
                for k in range(finished):
                    rid = finished_rids[k]
                    if metric == 2 and _over(rule_i, rule_ms, st, rule, now_s - req_s[rid, _ISSUE]):
                        return _STOPPED
                    if metric == 1 and output[rid] > 1 and _over(
                            rule_i, rule_ms, st, rule, (now_s - req_s[rid, _FIRST_TOKEN]) / (output[rid] - 1)):
                        return _STOPPED
            for k in range(finished):  # scheduler.release, in step order
                rid = finished_rids[k]
                _remove_running(running, st, rid)
                lo, hi = req_i[rid, _SEG_LO], req_i[rid, _SEG_HI]
                if cfg_i[_C_CACHE] and req_i[rid, _OUTPUT_ID] >= 0 and req_i[rid, _PATH_LEN] == hi - lo:
                    # its answer joins the cache, a segment of one row after its prompt's
                    segments[0, len(segments[0]) - 1], segments[1, len(segments[0]) - 1] = (req_i[rid, _OUTPUT_ID],
                                                                                            output[rid])
                    _cache_segments(req_i, nodes, children, cs, segments, path, rid, len(segments[0]) - 1,
                                    len(segments[0]), cfg_i[_C_UNIT])
                _drop(req_i, st, nodes, lru, cs, path, rid)
                st[_FINISHED] += 1
                if closed and st[_ISSUED] < n:
                    issued = st[_ISSUED]
                    heap_push(heap_s, heap_i, st, _H_SIZE, max(now_s, arrival_s[issued]), st[_SEQ], issued, -1)
                    st[_SEQ] += 1
                    st[_ISSUED] = issued + 1
            st[_READY] = 1
            report = cfg_i[_C_PROGRESS] and st[_FINISHED] >= st[_REPORT_AT]
            if report:
                report_at = st[_FINISHED] + cfg_i[_C_REPORT_EVERY]
                st[_REPORT_AT] = report_at if report_at < n else n
        next_s = heap_s[0] if st[_H_SIZE] else np.inf
        if st[_F_COUNT] and flight_end[st[_F_HEAD]] < next_s:
            next_s = flight_end[st[_F_HEAD]]
        if next_s > sf[_NOW]:
            if st[_READY]:
                st[_LAUNCH] = 1
            st[_READY] = 0
        if report:
            return _PROGRESS
