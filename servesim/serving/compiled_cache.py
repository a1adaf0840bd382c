"""The prefix cache of servesim/serving/prefix_cache.py over arrays, for the compiled event loop
(servesim/serving/compiled_loop.py): the same radix tree of prompt segments, the same references, the same least
recently used eviction, operation for operation, so that both loops evict the same nodes at the same moments.

- A node is a row of ``nodes`` (:data:`NODE_COLUMNS`); row 0 is the root. An evicted node's parent is
  :data:`EVICTED`.
- A node's children are found by (parent, segment id, tokens) in ``children``, an open-addressing table whose
  rows are the key and the node. An evicted child's row stays and points at a dead node, which reads as absent;
  the key made again takes the row over.
- The queue of unreferenced leaves is a binary heap (``servesim.compiled.heap_push``) in ``lru``: rows of (last
  used, tie-breaker, node, 0), its stale rows skipped when popped as ``PrefixCache.evict`` skips them. A full heap
  drops the rows that can never be valid again (the node was evicted or used since), which leaves the order of
  the others as it was.
- A request's path (the nodes it references) is its segments' nodes in order, then its answer's: ``path`` holds
  them at the request's first segment's index plus its request number.

Counters (``cs``): nodes made, the clock, the heap's tie-breaker, the heap's size, the units of unreferenced nodes
(evictable) and of all cached ones.
"""

from __future__ import annotations

import numpy as np

from servesim.compiled import heap_pop, heap_push, heap_sift_down, inner, jit
from servesim.workloads.prefix import UNIQUE, PromptSegments

#: A node's columns in ``nodes``.
NODE_COLUMNS = ("parent", "segment", "tokens", "start", "end", "units", "refs", "last_used", "children")
_PARENT, _SEGMENT, _TOKENS, _START, _END, _UNITS, _REFS, _LAST_USED, _CHILDREN = range(len(NODE_COLUMNS))
#: The parent of an evicted node (the root's is -1).
EVICTED = -2
#: Counters, by index of ``cs``.
NODES, CLOCK, TIE, LRU_SIZE, EVICTABLE, CACHED = range(6)


def new_cache(segments: PromptSegments) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(nodes, children, lru, path, cs) of an empty cache for a run of ``segments``' requests: room for a node per
    segment and per answer at first (:func:`grown` makes more when a run re-inserts what it evicted)."""
    nodes = np.zeros((1 + len(segments.segment_ids) + len(segments), len(NODE_COLUMNS)), dtype=np.int64)
    nodes[0, _PARENT], nodes[0, _SEGMENT], nodes[0, _REFS] = -1, UNIQUE, 1  # the root, never evicted
    cs = np.zeros(6, dtype=np.int64)
    cs[NODES] = 1
    children = np.full((_table_slots(len(nodes)), 4), -1, dtype=np.int64)
    return nodes, children, np.zeros((2 * len(nodes), 4), dtype=np.int64), np.zeros(
        len(segments.segment_ids) + len(segments), dtype=np.int64), cs


def grown(nodes: np.ndarray, children: np.ndarray, lru: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The cache's arrays with room for twice the nodes."""
    more = np.zeros((2 * len(nodes), nodes.shape[1]), dtype=np.int64)
    more[:len(nodes)] = nodes
    table = np.full((_table_slots(len(more)), 4), -1, dtype=np.int64)
    _refile_children(nodes, children, table)
    heap = np.zeros((2 * len(more), 4), dtype=np.int64)
    heap[:len(lru)] = lru
    return more, table, heap


def _table_slots(nodes: int) -> int:
    """Slots of a children table for ``nodes`` nodes: a power of two, at most half full."""
    slots = 16
    while slots < 2 * nodes:
        slots *= 2
    return slots


@jit
def _refile_children(nodes: np.ndarray, old: np.ndarray, new: np.ndarray) -> None:
    """The rows of ``old`` whose node is alive, filed in ``new``."""
    for row in range(len(old)):
        node = old[row, 3]
        if node >= 0 and nodes[node, _PARENT] != EVICTED:
            slot = _child_slot(new, old[row, 0], old[row, 1], old[row, 2])
            for column in range(4):
                new[slot, column] = old[row, column]


@inner
def _child_slot(children: np.ndarray, parent: int, segment: int, tokens: int) -> int:
    """The slot of key (parent, segment, tokens) in the children table: where it is, or the empty one where it
    would go."""
    mask = len(children) - 1
    slot = (((parent * 1000003) ^ segment) * 1000003 ^ tokens) & mask
    while children[slot, 3] >= 0 and not (children[slot, 0] == parent and children[slot, 1] == segment
                                           and children[slot, 2] == tokens):
        slot = (slot + 1) & mask
    return slot


@inner
def _child(nodes: np.ndarray, children: np.ndarray, parent: int, segment: int, tokens: int) -> int:
    """The live child of ``parent`` under (segment, tokens), or -1."""
    node = children[_child_slot(children, parent, segment, tokens), 3]
    return node if node >= 0 and nodes[node, _PARENT] == parent else -1


@inner
def _tick(cs: np.ndarray) -> int:
    cs[CLOCK] += 1
    return cs[CLOCK]


@inner
def _lru_push(nodes: np.ndarray, lru: np.ndarray, cs: np.ndarray, last_used: int, node: int) -> None:
    """``heapq.heappush(self._lru, (last_used, next(self._tie), node))``; a full heap first drops its rows that
    can never be valid again (its node evicted, or used since the row was pushed: ``last_used`` only grows)."""
    if cs[LRU_SIZE] == len(lru):
        kept = 0
        for row in range(cs[LRU_SIZE]):
            other = lru[row, 2]
            if nodes[other, _PARENT] != EVICTED and nodes[other, _LAST_USED] == lru[row, 0]:
                for column in range(3):
                    lru[kept, column] = lru[row, column]
                kept += 1
        cs[LRU_SIZE] = kept
        for at in range(kept // 2 - 1, -1, -1):
            heap_sift_down(lru[:, 0], lru[:, 1:], kept, at)
    heap_push(lru[:, 0], lru[:, 1:], cs, LRU_SIZE, last_used, cs[TIE], node, 0)
    cs[TIE] += 1


@inner
def match(nodes: np.ndarray, children: np.ndarray, segments: np.ndarray, lo: int, hi: int, path: np.ndarray,
          at: int) -> tuple[int, int]:
    """``PrefixCache.match`` of the prompt of segments ``lo:hi`` (``segments``' rows: ids, tokens): its nodes into
    ``path`` from ``at``; returns how many, and the tokens they cover."""
    node, count, matched = 0, 0, 0
    for segment in range(lo, hi):
        segment_id = segments[0, segment]
        if segment_id == UNIQUE:
            break
        node = _child(nodes, children, node, segment_id, segments[1, segment])
        if node < 0:
            break
        path[at + count] = node
        count += 1
        matched = nodes[node, _END]
    return count, matched


@inner
def covering(nodes: np.ndarray, path: np.ndarray, at: int, count: int, hit: int) -> tuple[int, int]:
    """``PrefixCache.covering`` (how many of the ``count`` path nodes a hit of ``hit`` tokens reads) and
    ``units_to_pin`` of those."""
    covered, pinned = 0, 0
    while covered < count and nodes[path[at + covered], _START] < hit:
        if nodes[path[at + covered], _REFS] == 0:
            pinned += nodes[path[at + covered], _UNITS]
        covered += 1
    return covered, pinned


@inner
def acquire(nodes: np.ndarray, cs: np.ndarray, path: np.ndarray, at: int, count: int) -> None:
    now = _tick(cs)
    for k in range(at, at + count):
        node = path[k]
        if nodes[node, _REFS] == 0:
            cs[EVICTABLE] -= nodes[node, _UNITS]
        nodes[node, _REFS] += 1
        nodes[node, _LAST_USED] = now


@inner
def release(nodes: np.ndarray, lru: np.ndarray, cs: np.ndarray, path: np.ndarray, at: int, count: int) -> None:
    now = _tick(cs)
    for k in range(at + count - 1, at - 1, -1):
        node = path[k]
        nodes[node, _REFS] -= 1
        nodes[node, _LAST_USED] = now
        if nodes[node, _REFS] == 0:
            cs[EVICTABLE] += nodes[node, _UNITS]
            if nodes[node, _CHILDREN] == 0:
                _lru_push(nodes, lru, cs, now, node)


@inner
def insert(nodes: np.ndarray, children: np.ndarray, cs: np.ndarray, segments: np.ndarray, lo: int, hi: int,
           path: np.ndarray, at: int, count: int, unit_tokens: int) -> tuple[int, int]:
    """``PrefixCache.insert`` of segments ``lo:hi`` after the ``count`` path nodes at ``at`` (their nodes follow
    them in ``path``); returns the nodes added to the path and the units of the nodes made."""
    node = path[at + count - 1] if count else 0
    added, new_units = 0, 0
    now = _tick(cs)
    for segment in range(lo, hi):
        segment_id, tokens = segments[0, segment], segments[1, segment]
        if segment_id == UNIQUE:
            break
        child = _child(nodes, children, node, segment_id, tokens)
        if child < 0:
            child = cs[NODES]
            cs[NODES] += 1
            start, end = nodes[node, _END], nodes[node, _END] + tokens
            units = end // unit_tokens - start // unit_tokens
            row = nodes[child]
            row[_PARENT], row[_SEGMENT], row[_TOKENS], row[_START], row[_END] = node, segment_id, tokens, start, end
            row[_UNITS], row[_REFS], row[_LAST_USED], row[_CHILDREN] = units, 0, 0, 0
            slot = _child_slot(children, node, segment_id, tokens)
            children[slot, 0], children[slot, 1], children[slot, 2], children[slot, 3] = node, segment_id, tokens, child
            nodes[node, _CHILDREN] += 1
            cs[CACHED] += units
            new_units += units
        elif nodes[child, _REFS] == 0:
            cs[EVICTABLE] -= nodes[child, _UNITS]
        nodes[child, _REFS] += 1
        nodes[child, _LAST_USED] = now
        path[at + count + added] = child
        added += 1
        node = child
    return added, new_units


@inner
def evict(nodes: np.ndarray, lru: np.ndarray, cs: np.ndarray, units: int) -> int:
    """``PrefixCache.evict``: unreferenced leaves, least recently used first, until ``units`` are freed or none is
    left; returns the units freed."""
    freed = 0
    while freed < units and cs[LRU_SIZE]:
        last_used, node = lru[0, 0], lru[0, 2]
        heap_pop(lru[:, 0], lru[:, 1:], cs, LRU_SIZE)
        if (nodes[node, _REFS] or nodes[node, _CHILDREN] or nodes[node, _LAST_USED] != last_used
                or nodes[node, _PARENT] == EVICTED):
            continue
        parent = nodes[node, _PARENT]
        nodes[parent, _CHILDREN] -= 1
        nodes[node, _PARENT] = EVICTED
        freed += nodes[node, _UNITS]
        cs[CACHED] -= nodes[node, _UNITS]
        cs[EVICTABLE] -= nodes[node, _UNITS]
        if nodes[parent, _REFS] == 0 and nodes[parent, _CHILDREN] == 0:
            _lru_push(nodes, lru, cs, nodes[parent, _LAST_USED], parent)
    return freed
