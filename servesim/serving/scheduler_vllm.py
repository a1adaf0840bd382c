"""vLLM V1's scheduler (``vllm/v1/core/sched/scheduler.py``, ``kv_cache_manager.py``), reduced to what decides
timing: the per-step token budget, ``max_num_seqs``, running requests before waiting ones, chunked prefill, paged
KV blocks, and preemption by recompute.

One step, as V1 forms it (FCFS; prefix-cache hits as servesim/serving/scheduler.py describes):

1. Running requests in order. Each gets ``min(tokens left to compute, budget left)`` new tokens: 1 for a decode,
   the rest of its prompt (a chunk) for a partial prefill. Its blocks are topped up to cover the new tokens; when
   the pool is short, the newest running request is preempted (its blocks freed, its progress dropped, back to the
   front of the waiting queue) until the allocation fits, or the request itself was the one preempted.
2. Only if nothing was preempted: waiting requests in order, while budget is left and fewer than ``max_num_seqs``
   run. Each gets ``min(prompt, budget left)`` tokens (a longer prompt is chunked and continues next step as a
   running request) if the pool has blocks for them; else admission stops. Tokens its prompt finds in the
   prefix cache are not computed: its chunk starts after them.
"""

from __future__ import annotations

from collections.abc import Sequence

from servesim.kernels.batch import PrefillChunk
from servesim.serving.config import EngineSettings
from servesim.serving.scheduler import Scheduler
from servesim.serving.state import RequestState, Step, schedule_requests


class VllmScheduler(Scheduler):
    """FCFS continuous batching over a pool of ``num_blocks`` KV blocks of ``cfg.block_size`` tokens."""

    def __init__(self, cfg: EngineSettings, kv_tokens: int) -> None:
        # The block pool keeps one null block that no request can use.
        super().__init__(kv_tokens // cfg.block_size - 1, cfg.block_size, cfg.block_size, cfg.enable_prefix_caching)
        self.block_size = cfg.block_size
        self.token_budget = cfg.max_num_batched_tokens
        self.max_num_seqs = cfg.max_num_seqs
        self.chunked_prefill = cfg.enable_chunked_prefill

    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    def _preempt_newest(self, first: int) -> RequestState | None:
        """Preempt the newest running request from position ``first`` on (those before it are scheduled this
        step) that is not still in the pipeline."""
        for i in range(len(self.running) - 1, first - 1, -1):
            victim = self.running[i]
            if not victim.in_flight:
                del self.running[i]
                self._preempted(victim)
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

    def _admission(self, req: RequestState, budget: int) -> tuple[int, int, list, int] | None:
        """(new tokens, blocks, cached nodes read, cached tokens) with which the waiting ``req`` joins a step with
        ``budget`` tokens left, or None when it cannot: no budget, an unchunkable prompt longer than it, or too few
        free blocks. Blocks of its cache hit that nobody else references count against the free ones
        (kv_cache_manager.py ``get_num_blocks_to_allocate``)."""
        path, hit, pinned = self.lookup(req)
        new = req.seq_len - req.computed - hit
        if budget <= 0 or (new > budget and not self.chunked_prefill):
            return None
        new = min(new, budget)
        need = -(-(req.computed + hit + new) // self.block_size) - req.kv_held - hit // self.block_size
        return None if need + pinned > self.available else (new, need, path, hit)

    def decode_blocks(self, requests: Sequence[RequestState]) -> list[int]:
        """Blocks that successive decode launches of ``requests`` take: launch ``k`` takes element ``k % block_size``.
        A request takes a block whenever its context is a whole number of blocks, since it holds exactly the
        blocks its context needs: launch ``k`` of a request at context ``c`` (tokens cached at the first launch)
        takes one when ``(c + 1 + k) % block_size == 0``."""
        block_size = self.block_size
        counts = [0] * block_size  # requests by the residue of their context at the first launch
        for req in requests:
            counts[(req.computed + 1) % block_size] += 1
        return [counts[-k % block_size] for k in range(block_size)]

    def decode_launched(self, launches: int = 1) -> None:
        """``launches`` decode micro-batches were launched without :meth:`schedule` (no state besides the pool
        changes)."""

    def commit_decodes(self, requests: Sequence[RequestState], launches: int) -> None:
        """Set the blocks of in-flight decoding ``requests`` after ``launches`` launches without :meth:`schedule`
        (the pool's free count was kept by the caller)."""
        block_size = self.block_size
        for req in requests:  # _blocks, inlined: this runs for every request of every fast-forward
            req.kv_held = -(-(req.computed + 1) // block_size) - req.cached_units

    def _allocate(self, req: RequestState, need: int, first: int) -> tuple[bool, bool]:
        """Give the running ``req`` (at position ``first``) ``need > 0`` more blocks, preempting the newest running
        requests from ``first`` on while too few are available. Returns whether it got them and whether anything
        was preempted."""
        preempted = False
        while need > self.available:
            victim = self._preempt_newest(first)
            preempted = True
            if victim is None or victim is req:
                return False, preempted
        self._take(req, need)
        return True, preempted

    def schedule(self) -> Step | None:
        """The next step (see the module docstring), its requests marked in flight. The running requests' loop
        summarises them as it goes, as :func:`~servesim.serving.state.schedule_requests` does for the admitted
        ones (one pass, attributes read once: it runs for every running request of every step)."""
        budget = self.token_budget
        reqs: list[RequestState] = []
        news: list[int] = []
        prefills: list[PrefillChunk] = []
        num_decodes = contexts = longest = 0
        preempted = False
        i = 0
        running = self.running
        block_size = self.block_size
        schedule_request, schedule_tokens = reqs.append, news.append  # looked up once
        while i < len(running) and budget > 0:
            req = running[i]
            i += 1
            if req.in_flight:
                continue
            computed = req.computed
            generated = req.generated
            left = req.prompt + generated - computed
            new = left if left < budget else budget  # a conditional, not min()
            need = -(-(computed + new) // block_size) - req.kv_held - req.cached_units  # the blocks to add
            if need > 0:  # a decode mostly fits the blocks it holds
                if need <= self.free:  # _take without eviction, inlined
                    self.free -= need
                    req.kv_held += need
                else:
                    got, preempted_now = self._allocate(req, need, i - 1)
                    preempted = preempted or preempted_now
                    if not got:
                        break  # this request could not get its blocks: V1 stops scheduling running requests
            req.in_flight = True
            schedule_request(req)
            schedule_tokens(new)
            budget -= new
            if left == 1 and generated:  # a decode: its one new token is the last of its sequence
                num_decodes += 1
                contexts += computed
                if computed > longest:
                    longest = computed
            else:
                prefills.append(PrefillChunk(new, computed))
        admitted: list[RequestState] = []
        admitted_tokens: list[int] = []
        if not preempted:
            while self.waiting and len(self.running) < self.max_num_seqs:
                req = self.waiting[0]
                if req.reached_s > self.admit_before_s:
                    break
                admission = self._admission(req, budget)
                if admission is None:
                    break
                new, need, path, hit = admission
                self.admit_hit(req, path, hit)
                self._take(req, need)
                self.waiting.popleft()
                self.running.append(req)
                admitted.append(req)
                admitted_tokens.append(new)
                budget -= new
        if admitted:
            decodes, context_tokens, max_context, chunks = schedule_requests(admitted, admitted_tokens)
            num_decodes += decodes
            contexts += context_tokens
            longest = max(longest, max_context)
            prefills += chunks
            reqs += admitted
            news += admitted_tokens
        if not reqs:
            return None
        return Step(tuple(reqs), tuple(news), num_decodes, contexts, longest, tuple(prefills), tuple(admitted))
