"""Ending a run early once a latency percentile is known to break its limit.

A capacity search only needs to know whether a load meets its SLOs. Once enough requests are over a limit, the
percentile is over it whatever the rest do: with ``N`` values and numpy's linear interpolation, percentile ``q``
lies between the sorted values at ``⌊q/100·(N−1)⌋`` and the next, so it exceeds the limit as soon as
``N − ⌊q/100·(N−1)⌋`` values do (:func:`violations_to_fail`). The simulator counts requests over each limit as
their latencies become final — TTFT at the first token, TPOT and E2E at the last — and stops at the first rule
that reaches its count, which saves most of an overloaded run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from servesim.errors import ServesimError
from servesim.serving.state import RequestState, Step

STOP_METRICS = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class StopRule:
    """Stop once ``count`` requests have ``metric`` (ttft, tpot or e2e; TPOT over requests of two or more output
    tokens) above ``limit_ms``, compared in milliseconds as the SLO percentiles are."""

    name: str  # how the caller names it, e.g. the SLO's ``tpot_p90``
    metric: str
    limit_ms: float
    count: int

    def __post_init__(self) -> None:
        if self.metric not in STOP_METRICS:
            raise ServesimError(f"unknown stop metric {self.metric!r}; use one of {', '.join(STOP_METRICS)}")


class StoppedEarly(Exception):
    """Raised by the simulator when a :class:`StopRule` reached its count: the run breaks that limit."""

    def __init__(self, rule: StopRule, time_s: float) -> None:
        super().__init__(f"{rule.name}: {rule.count} requests over {rule.limit_ms:g} ms at t = {time_s:.3f} s")
        self.rule = rule
        self.time_s = time_s
        # What the engine had done by then, filled in by the simulator.
        self.peak_kv_occupancy = 0.0
        self.preemptions = 0


def violations_to_fail(values: int, percentile: float) -> int:
    """How many of ``values`` latencies above a limit put numpy's ``percentile`` of them above it."""
    return values - math.floor(percentile / 100 * (values - 1))


class ViolationCounter:
    """Counts requests over each rule's limit as their latencies become final; raises :class:`StoppedEarly`."""

    def __init__(self, rules: Sequence[StopRule]) -> None:
        self.rules = tuple(rules)
        self.counts = [0] * len(self.rules)

    def _over(self, index: int, value_s: float, now_s: float) -> None:
        rule = self.rules[index]
        if value_s * 1e3 > rule.limit_ms:
            self.counts[index] += 1
            if self.counts[index] >= rule.count:
                raise StoppedEarly(rule, now_s)

    def step_done(self, step: Step, finished: Sequence[RequestState], now_s: float) -> None:
        """Account for a completed step: first tokens it produced, requests it finished."""
        for index, rule in enumerate(self.rules):
            if rule.metric == "ttft" and step.prefills:
                for req in step.requests:
                    if req.generated == 1 and req.first_token_s == now_s:
                        self._over(index, now_s - req.issue_s, now_s)
            elif rule.metric == "e2e":
                for req in finished:
                    self._over(index, now_s - req.issue_s, now_s)
            elif rule.metric == "tpot":
                for req in finished:
                    if req.output > 1:
                        self._over(index, (now_s - req.first_token_s) / (req.output - 1), now_s)
