"""Attention data-parallel ranks stepping together (docs/parallelism.md).

Under attention data parallelism each rank is an engine of its own (vLLM: one engine core, SGLang: one scheduler)
with its own requests and KV cache, but the ranks meet in every MoE layer, so they run their forward passes
together: a rank with nothing to do runs a dummy batch, and a step lasts as long as its slowest rank's (vLLM pads
every rank's tokens to the largest for the MoE dispatch). :class:`DataParallelScheduler` holds one engine scheduler
per rank and forms the ranks' steps as one :class:`RankedStep`, whose time is its slowest part's
(:func:`ranked_step_time_us`); requests go to a rank as the engine picks one (:data:`RANK_BALANCERS`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from servesim.errors import ServesimError
from servesim.serving.router import make_router
from servesim.serving.scheduler import Scheduler
from servesim.serving.state import RequestState, Step
from servesim.serving.step_cache import step_time_us
from servesim.serving.step_time import StepTimeModel


@dataclass(frozen=True, eq=False)
class RankedStep(Step):
    """The ranks' steps run together: their requests and batches joined, and each rank's own step (None for an
    idle rank) in ``parts``."""

    parts: tuple[Step | None, ...] = ()


def ranked_step_time_us(step_model: StepTimeModel, step: Step) -> tuple[float, tuple[float, ...]]:
    """``(host overhead, per-stage GPU time)`` of a step, µs: a ranked step's is its slowest rank's (each rank's
    MoE layers timed for as many tokens on every rank as on it, the padding vLLM applies to the largest)."""
    if not isinstance(step, RankedStep):
        return step_time_us(step_model, step)
    times = [step_time_us(step_model, part) for part in step.parts if part is not None]
    return max(t[0] for t in times), tuple(max(stages) for stages in zip(*(t[1] for t in times)))


def _vllm_load(rank: Scheduler) -> int:
    """vLLM's API server weighs a rank by ``4 × waiting + running`` (``DPLBAsyncMPClient``,
    v1/engine/core_client.py, 0.19.0)."""
    return 4 * len(rank.waiting) + len(rank.running)


#: How each engine hands a request to one of its ranks: a router (servesim/serving/router.py) over each rank's load.
#: vLLM takes the least loaded rank, the lowest index among equals; SGLang's data-parallel controller takes turns
#: (``--load-balance-method auto``: round robin, managers/data_parallel_controller.py, 0.5.9).
RANK_BALANCERS: dict[str, tuple[str, Callable[[Scheduler], int]]] = {
    "least_loaded": ("least_outstanding", _vllm_load),
    "round_robin": ("round_robin", lambda rank: rank.outstanding()),
}


class DataParallelScheduler:
    """One engine scheduler per attention data-parallel rank, stepping together. It answers what the simulator
    asks of a scheduler; fast-forwarding (servesim/serving/fast_forward.py) is for one rank and stays off."""

    def __init__(self, ranks: Sequence[Scheduler], balancer: str) -> None:
        if balancer not in RANK_BALANCERS:
            raise ServesimError(f"unknown rank balancer {balancer!r}; use one of {', '.join(RANK_BALANCERS)}")
        self.ranks = tuple(ranks)
        router, self._load = RANK_BALANCERS[balancer]
        self._route = make_router(router)
        self._rank_of: dict[int, Scheduler] = {}

    @property
    def cache(self):
        """The first rank's prefix cache (every rank has one or none)."""
        return self.ranks[0].cache

    @property
    def waiting(self) -> list[RequestState]:
        return [req for rank in self.ranks for req in rank.waiting]

    @property
    def admit_before_s(self) -> float:
        return self.ranks[0].admit_before_s

    @admit_before_s.setter
    def admit_before_s(self, value: float) -> None:
        for rank in self.ranks:
            rank.admit_before_s = value

    @property
    def kv_capacity_tokens(self) -> int:
        """Every rank's pool together."""
        return sum(rank.kv_capacity_tokens for rank in self.ranks)

    @property
    def request_capacity_tokens(self) -> int:
        """The most KV one request can hold: one rank's pool."""
        return self.ranks[0].kv_capacity_tokens

    @property
    def kv_used_tokens(self) -> int:
        return sum(rank.kv_used_tokens for rank in self.ranks)

    def outstanding(self) -> int:
        return sum(rank.outstanding() for rank in self.ranks)

    def add(self, req: RequestState) -> None:
        rank = self.ranks[self._route([self._load(rank) for rank in self.ranks])]
        self._rank_of[req.rid] = rank
        rank.add(req)

    def release(self, req: RequestState) -> None:
        self._rank_of.pop(req.rid).release(req)

    def step_done(self, step: Step) -> None:
        for rank, part in zip(self.ranks, step.parts):
            if part is not None:
                rank.step_done(part)

    def steady_decode(self, batch_sizes: Sequence[int]) -> bool:
        return False

    def schedule(self) -> RankedStep | None:
        """Every rank's next step, joined; None when no rank has one."""
        parts = tuple(rank.schedule() for rank in self.ranks)
        steps = [part for part in parts if part is not None]
        if not steps:
            return None
        return RankedStep(
            requests=tuple(req for part in steps for req in part.requests),
            new_tokens=tuple(new for part in steps for new in part.new_tokens),
            num_decodes=sum(part.num_decodes for part in steps),
            decode_context_tokens=sum(part.decode_context_tokens for part in steps),
            decode_max_context=max(part.decode_max_context for part in steps),
            prefills=tuple(chunk for part in steps for chunk in part.prefills),
            admitted=tuple(req for part in steps for req in part.admitted),
            parts=parts,
        )
