"""SGLang's scheduler (``srt/managers/scheduler.py``, ``schedule_policy.py``, ``schedule_batch.py``, 0.5.x),
reduced to what decides timing: prefill batches before decode batches, chunked prefill of one request at a time,
admission against KV memory reserved through the new-token ratio, and retraction when a decode runs out of
memory; radix-cache hits as servesim/serving/scheduler.py describes them. Mixed chunks (off by default) are not
modelled.

One step, as SGLang forms it (FCFS, page size 1):

- **Prefill batch**, whenever one can be formed. Budget: ``chunked_prefill_size`` tokens, and the memory left
  after reserving, for every running request, ``min(output left, 4096) × new_token_ratio`` future tokens. The
  request being chunked continues first; then waiting requests in order, each needing room for its prompt plus
  ``min(max_new_tokens, 4096)`` (charged unscaled at admission), at most ``max_running_requests`` running. A prompt
  longer than the chunk budget left is cut there and finishes in later prefill batches; no decode runs meanwhile.
- **Decode batch** of every running request otherwise. When the pool lacks one slot per request, requests are
  retracted (fewest generated tokens first, ties: longest prompt) to the back of the queue until it fits, and the
  ratio jumps to ``(tokens decoded + 20 × running) / Σ max_new_tokens`` (at most 1). After each decode batch the
  ratio decays linearly towards ``0.14 ×`` its initial 0.7 (times ``--schedule-conservativeness``) over 600 steps.

With ``--scheduler-recv-interval N > 1`` (``managers/scheduler_recv_skipper.py``, ``SchedulerRecvSkipper``) the
scheduler takes new requests off its socket only when a counter reaches N: the counter grows by 1 after a decode
batch and by 1000 after any other batch (``SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_*`` in ``environ.py``) and restarts
at 0 when it polls. So a request that reaches the engine while others decode waits up to N decode batches before it
can be prefilled; after a prefill batch, and on an idle engine (whose loop spins), the poll comes at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from servesim.serving.config import EngineSettings
from servesim.serving.scheduler import Scheduler
from servesim.serving.state import RequestState, Step, make_step

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096

_output, _generated = attrgetter("output"), attrgetter("generated")


class SglangScheduler(Scheduler):
    """FCFS prefill-priority batching over a pool of ``kv_tokens`` token slots."""

    def __init__(self, cfg: EngineSettings, kv_tokens: int) -> None:
        # The pool is counted in token slots; the radix cache matches whole pages.
        super().__init__(kv_tokens, 1, cfg.block_size, cfg.enable_prefix_caching)
        self.chunk_size = cfg.max_num_batched_tokens
        # SGLang caps running requests at half the pool (model_runner.py) besides the configured limit.
        self.max_running = min(cfg.max_num_seqs, kv_tokens // 2)
        self.init_ratio = min(INIT_NEW_TOKEN_RATIO * cfg.schedule_conservativeness, 1.0)
        self.min_ratio = self.init_ratio * MIN_NEW_TOKEN_RATIO_FACTOR
        self.decay = (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_ratio
        self.chunked: RequestState | None = None  # the one request whose prompt is part-way through
        self.recv_interval = cfg.scheduler_recv_interval
        self._recv_counter = 0  # SchedulerRecvSkipper's counter
        self._received: set[int] = set()  # ids of the waiting requests a poll has taken in

    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running) + (self.chunked is not None)

    def steady_decode(self, batch_sizes: Sequence[int]) -> bool:
        """Whether relaunching each in-flight decode micro-batch of ``batch_sizes`` requests unchanged is all this
        scheduler does until a request arrives or finishes (servesim/serving/fast_forward.py): every running
        request is in one of them, no prompt is part-way through, and no prefill batch can form because nothing
        waits or the running limit is reached (with room left, the shrinking reservation could admit one)."""
        return len(self.running) == sum(batch_sizes) and self._no_prefill()

    def _no_prefill(self) -> bool:
        """No prefill batch can form: no prompt part-way through, and nothing waits or the running limit is
        reached."""
        return self.chunked is None and (not self.waiting or len(self.running) >= self.max_running)

    def decode_blocks(self, requests: Sequence[RequestState]) -> list[int]:
        """Token slots that successive decode launches of ``requests`` take: one each, every launch."""
        return [len(requests)]

    def decode_launched(self, launches: int = 1) -> None:
        """``launches`` decode micro-batches were launched without :meth:`schedule`: the new-token ratio decays as
        in :meth:`_decode_step`, once per launch."""
        for _ in range(launches):
            self.new_token_ratio = max(self.new_token_ratio - self.decay, self.min_ratio)
        if self.recv_interval > 1:
            # Polls fall due every recv_interval decode batches; those passed in a fast-forward took in nothing
            # (it stops at an arrival), so only the phase is kept, and a poll falling due now stays due.
            count = self._recv_counter + launches
            if count > self.recv_interval:
                count = count % self.recv_interval or self.recv_interval
            self._recv_counter = count

    def commit_decodes(self, requests: Sequence[RequestState], launches: int) -> None:
        """Set the slots of in-flight decoding ``requests`` after ``launches`` launches without :meth:`schedule`
        (the pool's free count was kept by the caller)."""
        for req in requests:
            req.kv_held += launches

    def _poll(self) -> None:
        """SchedulerRecvSkipper.handle: take in the requests that reached the engine when a poll is due."""
        idle = not self.running and self.chunked is None
        if not (idle or self._recv_counter >= self.recv_interval):
            return
        self._recv_counter = 0
        for req in self.waiting:
            if req.reached_s <= self.admit_before_s:
                self._received.add(req.rid)

    def schedule(self) -> Step | None:
        if self.recv_interval > 1:
            self._poll()
        step = None
        if self.chunked is None or not self.chunked.in_flight:
            step = self._prefill_step()
        step = step or self._decode_step()
        if step is None and not self.running and self.chunked is None:
            self.new_token_ratio = self.init_ratio  # an idle server starts estimating afresh
        return step

    def _reserved_tokens(self) -> float:
        """Future tokens held back for the running requests' outputs. Summed as total output less total generated
        (attributes gathered in C, several times quicker than a Python loop over the requests) unless an output is
        long enough to be clipped."""
        running = self.running
        outputs = list(map(_output, running))
        if not outputs or max(outputs) <= CLIP_MAX_NEW_TOKENS:
            left = sum(outputs) - sum(map(_generated, running))
        else:
            left = sum(min(r.output - r.generated, CLIP_MAX_NEW_TOKENS) for r in running)
        return left * self.new_token_ratio

    def _prefill_step(self) -> Step | None:
        if self._no_prefill():
            return None
        rem_chunk = self.chunk_size
        rem_total = self.available - self._reserved_tokens()
        reqs: list[RequestState] = []
        news: list[int] = []
        admitted: list[RequestState] = []
        if self.chunked is not None:
            req = self.chunked
            new = min(req.seq_len - req.computed, rem_chunk)
            if new == req.seq_len - req.computed:  # last chunk: it decodes from the next step on
                self.chunked = None
                self.running.append(req)
            self._take(req, new)
            reqs.append(req)
            news.append(new)
            rem_chunk -= new
            rem_total -= new
        while self.waiting and rem_chunk > 0 and len(self.running) + (self.chunked is not None) < self.max_running:
            req = self.waiting[0]
            if req.reached_s > self.admit_before_s or (self.recv_interval > 1 and req.rid not in self._received):
                break
            path, hit, pinned = self.lookup(req)
            extend = req.seq_len - hit
            total = extend + min(req.output - req.generated, CLIP_MAX_NEW_TOKENS)
            if total + pinned > rem_total:
                break
            self.waiting.popleft()
            admitted.append(req)
            self.admit_hit(req, path, hit)
            rem_total -= pinned
            new = min(extend, rem_chunk)
            self._take(req, new)
            reqs.append(req)
            news.append(new)
            rem_chunk -= new
            rem_total -= total
            if new < extend:
                self.chunked = req
                break
            self.running.append(req)
        if not reqs:
            return None
        self._recv_counter = self.recv_interval  # a prefill batch weighs 1000: the next iteration polls
        return make_step(reqs, news, admitted)

    def _decode_step(self) -> Step | None:
        reqs = [r for r in self.running if not r.in_flight]
        if not reqs:
            return None
        if self.available < len(reqs):
            self._retract(reqs)
            if self.available < len(reqs):
                return None  # what is left waits for micro-batches still in the pipeline
        else:
            self.decode_launched()
        self._take_one_each(reqs)
        return make_step(reqs, [1] * len(reqs), ())

    def _take_one_each(self, reqs: list[RequestState]) -> None:
        """Give each of ``reqs`` one slot (as :meth:`_take` would, one request after another), at once when enough
        are free."""
        if len(reqs) > self.free:
            for req in reqs:
                self._take(req, 1)
            return
        self.free -= len(reqs)
        for req in reqs:
            req.kv_held += 1

    def _retract(self, reqs: list[RequestState]) -> None:
        """Retract decoding requests until one slot per remaining request is free (at least one retracted)."""
        reqs.sort(key=lambda r: (r.generated, -r.prompt), reverse=True)
        while len(reqs) > 1:
            victim = reqs.pop()
            self.running.remove(victim)
            self._preempted(victim)
            self.waiting.append(victim)
            if self.available >= len(reqs):
                break
        decoded = sum(r.generated for r in reqs)
        budget = sum(r.output for r in reqs)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(reqs)) / budget)
