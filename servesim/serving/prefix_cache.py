"""The engines' prefix caches, as a radix tree of prompt segments over the KV pool.

vLLM V1 (automatic prefix caching, ``vllm/v1/core/kv_cache_manager.py``, ``block_pool.py``) keeps every full
block it computed under a hash chained over all tokens before it; a new request takes the longest run of cached
blocks its prompt starts with, at most ``prompt - 1`` tokens (one token must be computed to sample from), and
blocks nobody references stay cached until the pool needs them, least recently used first. SGLang's radix cache
(``srt/mem_cache/radix_cache.py``) does the same at its page size over a radix tree of token ids, and evicts the
least recently used unreferenced leaves. Both count unreferenced cached KV as free when they admit a request.

Here the tree's edges are the workload's prompt segments (:mod:`servesim.workloads.prefix`): a node is one
segment (id and length) after the segments on its path, so it stands for the chained hashes of every block ending
inside it. A node owns the KV units (blocks of ``unit_tokens``) that end inside it; a request references the nodes
its cache hit covers until it finishes or is preempted, and inserts its own shareable segments once it has
computed them (its prompt after the last prompt chunk, its answer when it finishes), handing their units from its
own account to the tree. Text no later prompt repeats (:data:`~servesim.workloads.prefix.UNIQUE`) is never
inserted: its blocks could never be hit, and freeing them at once is what an LRU pool that evicts them first does.
Eviction takes whole unreferenced leaves, least recently used first.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

from servesim.workloads.prefix import UNIQUE


class CacheNode:
    """One cached segment (its ``key``: segment id and tokens) at global token positions ``[start, end)``."""

    __slots__ = ("parent", "key", "children", "start", "end", "units", "refs", "last_used")

    def __init__(self, parent: CacheNode | None, key: tuple[int, int], start: int, end: int, unit_tokens: int) -> None:
        self.parent = parent
        self.key = key  # (segment id, tokens): its name among its parent's children
        self.children: dict[tuple[int, int], CacheNode] = {}
        self.start = start
        self.end = end
        self.units = end // unit_tokens - start // unit_tokens  # the full units that end inside it
        self.refs = 0
        self.last_used = 0


class PrefixCache:
    """A radix tree of cached prompt segments and the KV units it owns."""

    def __init__(self, unit_tokens: int, page_tokens: int) -> None:
        self.unit_tokens = unit_tokens  # the pool's unit of account
        self.page_tokens = page_tokens  # hits are whole pages (vLLM's blocks, SGLang's pages)
        self.root = CacheNode(None, (UNIQUE, 0), 0, 0, unit_tokens)
        self.root.refs = 1  # never evicted
        self.cached_units = 0
        self.evictable_units = 0  # units of nodes nobody references
        self._clock = itertools.count(1)
        self._lru: list[tuple[int, int, CacheNode]] = []  # (last used, tie, node), stale entries skipped
        self._tie = itertools.count()

    def match(self, ids: Sequence[int], tokens: Sequence[int]) -> tuple[list[CacheNode], int]:
        """The cached nodes a prompt of segments (``ids``, ``tokens``) starts with, and the tokens they cover."""
        path, node, matched = [], self.root, 0
        for segment_id, length in zip(ids, tokens):
            if segment_id == UNIQUE:
                break
            node = node.children.get((segment_id, length))
            if node is None:
                break
            path.append(node)
            matched = node.end
        return path, matched

    def hit_tokens(self, matched: int, prompt: int) -> int:
        """The tokens an engine serves from cache when ``matched`` leading tokens of a ``prompt``-token prompt are
        cached: whole pages, and at least one prompt token left to compute."""
        return min(matched, prompt - 1) // self.page_tokens * self.page_tokens

    @staticmethod
    def covering(path: list[CacheNode], hit: int) -> list[CacheNode]:
        """The nodes of ``path`` a hit of ``hit`` tokens reads from."""
        return [node for node in path if node.start < hit]

    @staticmethod
    def units_to_pin(path: list[CacheNode]) -> int:
        """Units of ``path`` nobody references now: referencing the path takes them out of the evictable ones."""
        return sum(node.units for node in path if node.refs == 0)

    def acquire(self, path: list[CacheNode]) -> None:
        """Reference every node of ``path`` (a request reads from them)."""
        now = next(self._clock)
        for node in path:
            if node.refs == 0:
                self.evictable_units -= node.units
            node.refs += 1
            node.last_used = now

    def release(self, path: list[CacheNode]) -> None:
        """Drop a reference to every node of ``path``; the unreferenced become evictable, deepest first."""
        now = next(self._clock)
        for node in reversed(path):
            node.refs -= 1
            node.last_used = now
            if node.refs == 0:
                self.evictable_units += node.units
                if not node.children:
                    heapq.heappush(self._lru, (now, next(self._tie), node))

    def insert(self, path: list[CacheNode], ids: Sequence[int], tokens: Sequence[int]) -> tuple[list[CacheNode], int]:
        """Insert the shareable segments (``ids``, ``tokens``) that follow ``path`` (the nodes a request already
        references), referenced by that request. Returns the nodes it now references in addition, and the units
        of the nodes this made (the request hands them to the tree)."""
        node = path[-1] if path else self.root
        added, new_units = [], 0
        now = next(self._clock)
        for segment_id, length in zip(ids, tokens):
            if segment_id == UNIQUE:
                break
            key = (int(segment_id), int(length))
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = CacheNode(node, key, node.end, node.end + key[1], self.unit_tokens)
                self.cached_units += child.units
                new_units += child.units
            elif child.refs == 0:
                self.evictable_units -= child.units
            child.refs += 1
            child.last_used = now
            added.append(child)
            node = child
        return added, new_units

    def evict(self, units: int) -> int:
        """Evict unreferenced leaves, least recently used first, until ``units`` are freed or none is left;
        returns the units freed."""
        freed = 0
        while freed < units and self._lru:
            last_used, _, node = heapq.heappop(self._lru)
            if node.refs or node.children or node.last_used != last_used or node.parent is None:
                continue  # referenced again, grown or already evicted since it was queued
            parent = node.parent
            del parent.children[node.key]
            node.parent = None
            freed += node.units
            self.cached_units -= node.units
            self.evictable_units -= node.units
            if parent.refs == 0 and not parent.children:
                heapq.heappush(self._lru, (parent.last_used, next(self._tie), parent))
        return freed
