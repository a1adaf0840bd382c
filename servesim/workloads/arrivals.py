"""Arrival processes: ``arrival_times_s(rng, n)`` gives ``n`` non-decreasing arrival times in seconds, the first at 0.

Closed-loop concurrency is not an arrival process: it is the workload's ``arrival_mode`` (see
:class:`servesim.workloads.Workload`), because when a closed-loop client sends depends on the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from servesim.errors import ServesimError
from servesim.limits import MAX_CV
from servesim.workloads.lengths import QuantileTable


class ArrivalProcess(Protocol):
    def arrival_times_s(self, rng: np.random.Generator, n: int) -> np.ndarray: ...


def _from_gaps(gaps_s: np.ndarray) -> np.ndarray:
    """Arrival times whose successive differences are ``gaps_s`` (one gap fewer than arrivals), starting at 0."""
    return np.concatenate([[0.0], np.cumsum(gaps_s)])


def _check_rate(rate_per_s: float) -> None:
    if not (rate_per_s > 0 and np.isfinite(rate_per_s)):
        raise ServesimError(f"the request rate must be a positive number of requests per second, not {rate_per_s}")


@dataclass(frozen=True)
class Poisson:
    """Independent arrivals at a constant rate: exponential gaps."""

    rate_per_s: float

    def __post_init__(self) -> None:
        _check_rate(self.rate_per_s)

    def arrival_times_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _from_gaps(rng.exponential(1 / self.rate_per_s, size=max(n - 1, 0)))[:n]


@dataclass(frozen=True)
class Gamma:
    """Gamma-distributed gaps with mean ``1 / rate_per_s`` and coefficient of variation ``cv``: cv > 1 is burstier
    than Poisson, cv < 1 more regular, cv = 1 is Poisson (``vllm bench serve --burstiness`` is ``1 / cv²``)."""

    rate_per_s: float
    cv: float

    def __post_init__(self) -> None:
        _check_rate(self.rate_per_s)
        if not 0 < self.cv <= MAX_CV:
            raise ServesimError(f"the gap coefficient of variation cv must be above 0 and at most {MAX_CV:g} (beyond, "
                                f"most gaps round to 0 s), not {self.cv}")

    def arrival_times_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        shape = 1 / self.cv**2
        return _from_gaps(rng.gamma(shape, 1 / (self.rate_per_s * shape), size=max(n - 1, 0)))[:n]


@dataclass(frozen=True)
class Burst:
    """Every request at t = 0 (``vllm bench serve --request-rate inf``)."""

    def arrival_times_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.zeros(n)


@dataclass(frozen=True)
class EmpiricalGaps:
    """Independent gaps drawn from a trace's gap distribution, rescaled so the long-run rate is ``rate_per_s``:
    keeps the trace's burstiness (gap CV and shape) at any rate."""

    gaps_s: QuantileTable
    rate_per_s: float

    def __post_init__(self) -> None:
        _check_rate(self.rate_per_s)

    def arrival_times_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        scale = 1 / (self.rate_per_s * self.gaps_s.mean)
        return _from_gaps(self.gaps_s.sample(rng, max(n - 1, 0)) * scale)[:n]


@dataclass(frozen=True, eq=False)
class Replay:
    """A trace's own arrival times, shifted to start at 0 and multiplied by ``time_scale`` (0.5 = twice as fast)."""

    trace_arrival_s: np.ndarray
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not (self.time_scale > 0 and np.isfinite(self.time_scale)):
            raise ServesimError(f"time_scale must be a positive number, not {self.time_scale}")

    def arrival_times_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if n > len(self.trace_arrival_s):
            raise ServesimError(f"the trace has only {len(self.trace_arrival_s)} requests; ask for at most that many")
        times = np.asarray(self.trace_arrival_s[:n], dtype=np.float64)
        return (times - (times[0] if n else 0.0)) * self.time_scale
