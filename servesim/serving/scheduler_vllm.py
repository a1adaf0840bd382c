"""vLLM V1's scheduler (``vllm/v1/core/sched/scheduler.py``, ``kv_cache_manager.py``), reduced to what decides
timing: the per-step token budget, ``max_num_seqs``, running requests before waiting ones, chunked prefill, paged
KV blocks, and preemption by recompute.

One step, as V1 forms it (FCFS, no prefix-cache hits):

1. Running requests in order. Each gets ``min(tokens left to compute, budget left)`` new tokens: 1 for a decode,
   the rest of its prompt (a chunk) for a partial prefill. Its blocks are topped up to cover the new tokens; when
   the pool is short, the newest running request is preempted (its blocks freed, its progress dropped, back to the
   front of the waiting queue) until the allocation fits, or the request itself was the one preempted.
2. Only if nothing was preempted: waiting requests in order, while budget is left and fewer than ``max_num_seqs``
   run. Each gets ``min(prompt, budget left)`` tokens (a longer prompt is chunked and continues next step as a
   running request) if the pool has blocks for them; else admission stops.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from servesim.serving.config import EngineConfig
from servesim.serving.state import RequestState, Step, make_step


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class VllmScheduler:
    """FCFS continuous batching over a pool of ``num_blocks`` KV blocks of ``cfg.block_size`` tokens."""

    def __init__(self, cfg: EngineConfig, kv_tokens: int) -> None:
        self.block_size = cfg.block_size
        self.token_budget = cfg.max_num_batched_tokens
        self.max_num_seqs = cfg.max_num_seqs
        self.chunked_prefill = cfg.enable_chunked_prefill
        # The block pool keeps one null block that no request can use.
        self.capacity = kv_tokens // cfg.block_size - 1
        self.free = self.capacity
        self.kv_unit_tokens = cfg.block_size  # the pool is counted in blocks
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []

    @property
    def kv_used_tokens(self) -> int:
        """KV memory in use, in token slots (whole blocks)."""
        return (self.capacity - self.free) * self.kv_unit_tokens

    @property
    def kv_capacity_tokens(self) -> int:
        return self.capacity * self.block_size

    def fits(self, req: RequestState) -> bool:
        """Whether the request's full sequence fits the pool at all (vLLM refuses longer ones)."""
        return _blocks(req.prompt + req.output, self.block_size) <= self.capacity

    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, req: RequestState) -> None:
        self.waiting.append(req)

    def release(self, req: RequestState) -> None:
        """Free a finished request's blocks."""
        self.running.remove(req)
        self.free += req.kv_held
        req.kv_held = 0

    def _blocks_to_add(self, req: RequestState, new_tokens: int) -> int:
        return -(-(req.computed + new_tokens) // self.block_size) - req.kv_held

    def _take(self, req: RequestState, blocks: int) -> None:
        self.free -= blocks
        req.kv_held += blocks

    def _preempt_newest(self, first: int) -> RequestState | None:
        """Preempt the newest running request from position ``first`` on (those before it are scheduled this
        step) that is not still in the pipeline."""
        for i in range(len(self.running) - 1, first - 1, -1):
            victim = self.running[i]
            if not victim.in_flight:
                del self.running[i]
                self.free += victim.kv_held
                victim.kv_held = 0
                victim.computed = 0
                victim.preemptions += 1
                self.waiting.appendleft(victim)
                return victim
        return None

    def steady_decode(self, batch_sizes: Sequence[int]) -> bool:
        """Whether relaunching each in-flight decode micro-batch of ``batch_sizes`` requests unchanged is all this
        scheduler does until a request arrives or finishes (servesim/serving/fast_forward.py): every running
        request is in one of them, and no waiting request can join. Admission stays impossible while nothing
        finishes, because the free pool only shrinks."""
        if len(self.running) != sum(batch_sizes):
            return False
        if not self.waiting or len(self.running) >= self.max_num_seqs:
            return True
        head = self.waiting[0]
        return all(self._admission(head, self.token_budget - size) is None for size in batch_sizes)

    def _admission(self, req: RequestState, budget: int) -> tuple[int, int] | None:
        """(new tokens, blocks) with which the waiting ``req`` joins a step with ``budget`` tokens left, or None
        when it cannot: no budget, an unchunkable prompt longer than it, or too few free blocks."""
        new = req.seq_len - req.computed
        if budget <= 0 or (new > budget and not self.chunked_prefill):
            return None
        new = min(new, budget)
        need = self._blocks_to_add(req, new)
        return None if need > self.free else (new, need)

    def decode_blocks(self, contexts: np.ndarray) -> np.ndarray:
        """Blocks that successive decode launches of requests at ``contexts`` (tokens cached at the first launch)
        take: launch ``k`` takes element ``k % block_size``. A request takes a block whenever its context is a
        whole number of blocks, since it holds exactly the blocks its context needs."""
        counts = np.bincount(contexts % self.block_size, minlength=self.block_size)
        return counts[-np.arange(self.block_size) % self.block_size]

    def decode_launched(self, launches: int = 1) -> None:
        """``launches`` decode micro-batches were launched without :meth:`schedule` (no state besides the pool
        changes)."""

    def commit_decodes(self, requests: Sequence[RequestState], launches: int) -> None:
        """Set the blocks of in-flight decoding ``requests`` after ``launches`` launches without :meth:`schedule`
        (the pool's free count was kept by the caller)."""
        block_size = self.block_size
        for req in requests:  # _blocks, inlined: this runs for every request of every fast-forward
            req.kv_held = -(-(req.computed + 1) // block_size)

    def schedule(self) -> Step | None:
        budget = self.token_budget
        reqs: list[RequestState] = []
        news: list[int] = []
        preempted = False
        i = 0
        running = self.running
        block_size = self.block_size
        while i < len(running) and budget > 0:
            req = running[i]
            i += 1
            if req.in_flight:
                continue
            new = req.prompt + req.generated - req.computed
            if new > budget:  # a conditional, not min(): this runs for every running request of every step
                new = budget
            need = -(-(req.computed + new) // block_size) - req.kv_held  # _blocks_to_add, inlined for the same reason
            while need > self.free:
                victim = self._preempt_newest(i - 1)
                preempted = True
                if victim is None or victim is req:
                    break
            else:
                if need:  # a decode mostly fits the blocks it holds
                    self._take(req, need)
                reqs.append(req)
                news.append(new)
                budget -= new
                continue
            break  # this request could not get its blocks: V1 stops scheduling running requests
        if not preempted:
            while self.waiting and len(self.running) < self.max_num_seqs:
                req = self.waiting[0]
                admitted = self._admission(req, budget)
                if admitted is None:
                    break
                new, need = admitted
                self._take(req, need)
                self.waiting.popleft()
                self.running.append(req)
                reqs.append(req)
                news.append(new)
                budget -= new
        if not reqs:
            return None
        return make_step(reqs, news)
