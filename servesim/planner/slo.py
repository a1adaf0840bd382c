"""Service-level objectives on latency percentiles, and checking a simulated run against them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from servesim.errors import ServesimError
from servesim.serving.metrics import SimulationResult

METRICS = ("ttft", "tpot", "e2e")
METRIC_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}
#: SLOs when the user gives none: interactive chat with a reading-speed stream.
DEFAULT_SLOS_MS = {("ttft", 90): 2000.0, ("tpot", 90): 100.0}


@dataclass(frozen=True)
class Slo:
    """``metric`` at ``percentile`` must be at most ``limit_ms`` (TPOT excludes the first token, as in
    ``vllm bench serve``)."""

    metric: str  # ttft | tpot | e2e
    percentile: float
    limit_ms: float

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ServesimError(f"unknown SLO metric {self.metric!r}; use one of {', '.join(METRICS)}")
        if not 0 < self.percentile <= 100:
            raise ServesimError(f"SLO percentile {self.percentile} must be in (0, 100]")
        if not (self.limit_ms > 0 and np.isfinite(self.limit_ms)):
            raise ServesimError(f"the {self.name} SLO must be a positive number of milliseconds, not {self.limit_ms}")

    @property
    def name(self) -> str:
        """``ttft_p90`` — the key stem used in JSON."""
        return f"{self.metric}_p{self.percentile:g}"

    @property
    def label(self) -> str:
        """``TTFT p90 ≤ 2000 ms``."""
        return f"{METRIC_LABELS[self.metric]} p{self.percentile:g} ≤ {self.limit_ms:g} ms"


def slos_from_limits(limits: Mapping[tuple[str, float], float | None]) -> tuple[Slo, ...]:
    """SLOs from ``{(metric, percentile): limit_ms or None}``; the defaults when every limit is None."""
    given = {key: value for key, value in limits.items() if value is not None}
    chosen = given or DEFAULT_SLOS_MS
    return tuple(Slo(metric, float(p), float(limit)) for (metric, p), limit in chosen.items())


def latencies_ms(result: SimulationResult, metric: str) -> np.ndarray:
    """Per-request latency of ``metric`` in ms; one-token requests have no TPOT and are left out."""
    values = {"ttft": result.ttft_s, "tpot": result.tpot_s, "e2e": result.e2e_s}[metric] * 1e3
    return values[~np.isnan(values)]


def percentile_ms(result: SimulationResult, metric: str, percentile: float) -> float:
    values = latencies_ms(result, metric)
    return float(np.percentile(values, percentile)) if len(values) else 0.0


def measure(result: SimulationResult, slos: Sequence[Slo]) -> tuple[float, ...]:
    """Each SLO's percentile in ``result``, ms, in the order of ``slos``."""
    return tuple(percentile_ms(result, slo.metric, slo.percentile) for slo in slos)


def meets(values_ms: Sequence[float], slos: Sequence[Slo]) -> bool:
    return all(value <= slo.limit_ms for value, slo in zip(values_ms, slos))


def ratios(values_ms: Sequence[float], slos: Sequence[Slo]) -> list[float]:
    """Each SLO's percentile relative to its limit (above 1: violated)."""
    return [value / slo.limit_ms for value, slo in zip(values_ms, slos)]


def worst(values_ms: Sequence[float], slos: Sequence[Slo]) -> Slo:
    """The SLO furthest over (or nearest to) its limit, relative to the limit."""
    relative = ratios(values_ms, slos)
    return slos[relative.index(max(relative))]


def ms(value_ms: float) -> str:
    """A latency for a sentence: three significant digits, whole milliseconds from 100 ms."""
    return f"{value_ms:,.0f} ms" if value_ms >= 100 else f"{value_ms:.3g} ms"
