"""What both engines' schedulers share: the request queues and the KV pool, with its prefix cache.

The pool is counted in units of ``kv_unit_tokens`` tokens (vLLM's blocks, SGLang's pages). ``free`` units hold
nothing; the prefix cache (:mod:`servesim.serving.prefix_cache`) owns the units of cached prompt segments, and those
nobody references count as free when a request is admitted, as both engines count them (vLLM's free block queue,
SGLang's ``available_size + evictable_size``): taking more units than are free evicts them, least recently used
first. A request holds ``kv_held`` units of its own and reads ``cached_units`` from the cache; its cache hit is
looked up when it is admitted from the waiting queue (again after a preemption), and it hands its shareable
segments to the cache once computed.
"""

from __future__ import annotations

import math
from collections import deque

from servesim.serving.prefix_cache import PrefixCache
from servesim.serving.state import RequestState, Step


class Scheduler:
    """The queues and KV pool of one engine instance; the engines' schedulers add how a step is formed."""

    def __init__(self, capacity_units: int, unit_tokens: int, page_tokens: int, prefix_caching: bool) -> None:
        self.capacity = capacity_units
        self.free = capacity_units
        self.kv_unit_tokens = unit_tokens
        self.cache = PrefixCache(unit_tokens, page_tokens) if prefix_caching else None
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        #: Waiting requests that reached the engine after this are not admitted yet: under async scheduling the
        #: host formed the step before they arrived (set by the simulator before each :meth:`schedule`).
        self.admit_before_s = math.inf

    @property
    def kv_capacity_tokens(self) -> int:
        return self.capacity * self.kv_unit_tokens

    @property
    def request_capacity_tokens(self) -> int:
        """The most KV one request can hold: the whole pool."""
        return self.kv_capacity_tokens

    @property
    def kv_used_tokens(self) -> int:
        """KV memory in use, in token slots (whole units): what neither is free nor could be evicted."""
        return (self.capacity - self.available) * self.kv_unit_tokens

    @property
    def available(self) -> int:
        """Units a request may be given: the free ones and the cached ones nobody references."""
        return self.free + (self.cache.evictable_units if self.cache is not None else 0)

    def add(self, req: RequestState) -> None:
        self.waiting.append(req)

    def _take(self, req: RequestState, units: int) -> None:
        """Give ``req`` ``units`` more units, evicting cached ones when too few are free (the caller checked
        :attr:`available`)."""
        if units > self.free:
            self.free += self.cache.evict(units - self.free)
        self.free -= units
        req.kv_held += units

    def _drop(self, req: RequestState) -> None:
        """Free what ``req`` holds and drop its references to the cache (it finished or is preempted)."""
        self.free += req.kv_held
        req.kv_held = 0
        if req.cache_path:
            self.cache.release(req.cache_path)
            req.cache_path = []
        req.cached_units = 0

    def release(self, req: RequestState) -> None:
        """A request finished: its answer joins the cache when a later prompt may repeat it; its units go back."""
        self.running.remove(req)
        if self.cache is not None and req.segment_ids is not None and req.output_id >= 0 and self._cached_whole(req):
            self._cache_segments(req, (req.output_id,), (req.output,))
        self._drop(req)

    def _preempted(self, req: RequestState) -> None:
        """``req`` loses its KV and its progress (vLLM's preemption, SGLang's retraction)."""
        self._drop(req)
        req.computed = 0
        req.preemptions += 1

    def lookup(self, req: RequestState) -> tuple[list, int, int]:
        """The cache hit of a waiting request with nothing computed: (nodes it reads, tokens served from cache,
        units that referencing them takes out of the evictable ones)."""
        if self.cache is None or req.segment_ids is None or req.computed:
            return [], 0, 0
        path, matched = self.cache.match(req.segment_ids, req.segment_tokens)
        hit = self.cache.hit_tokens(matched, req.seq_len)
        if not hit:
            return [], 0, 0
        path = self.cache.covering(path, hit)
        return path, hit, self.cache.units_to_pin(path)

    def admit_hit(self, req: RequestState, path: list, hit: int) -> None:
        """``req`` is admitted with the cache hit :meth:`lookup` found: it reads ``hit`` tokens from ``path``."""
        if path:
            self.cache.acquire(path)
            req.cache_path = list(path)
            req.cached_units = hit // self.kv_unit_tokens
            req.computed = hit
        req.cached_tokens = hit

    def prompt_computed(self, req: RequestState) -> None:
        """``req``'s prompt is all computed: its shareable segments join the cache."""
        if self.cache is not None and req.segment_ids is not None:
            done = len(req.cache_path)
            self._cache_segments(req, req.segment_ids[done:], req.segment_tokens[done:])

    def step_done(self, step: Step) -> None:
        """``step`` finished (after :func:`~servesim.serving.state.finish_step`): prompts it completed join the
        cache."""
        for req, new in zip(step.requests, step.new_tokens):
            if req.computed - new < req.prompt <= req.computed:
                self.prompt_computed(req)

    def _cached_whole(self, req: RequestState) -> bool:
        """Whether every prompt segment of ``req`` is in the cache on its path (so its answer can follow)."""
        return len(req.cache_path) == len(req.segment_ids)

    def _cache_segments(self, req: RequestState, ids, tokens) -> None:
        added, units = self.cache.insert(req.cache_path, ids, tokens)
        req.cache_path.extend(added)
        units = min(units, req.kv_held)
        req.kv_held -= units
        req.cached_units += units
