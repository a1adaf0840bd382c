"""Summary statistics of request lengths and arrivals, shared by ``servesim workload`` and the profile derivation."""

from __future__ import annotations

import math

from typing import TYPE_CHECKING

import numpy as np

from servesim.workloads.sharing import prefix_sharing

if TYPE_CHECKING:
    from servesim.workloads.request import Workload

PERCENTILES = (50, 90, 99)


def length_stats(tokens: np.ndarray) -> dict[str, float]:
    """Mean, p50, p90, p99 and max of a token count."""
    values = np.asarray(tokens, dtype=np.float64)
    if not len(values):
        return {"mean": math.nan, **{f"p{p}": math.nan for p in PERCENTILES}, "max": math.nan}
    percentiles = np.percentile(values, PERCENTILES)
    return {"mean": float(values.mean()), **{f"p{p}": float(v) for p, v in zip(PERCENTILES, percentiles)},
            "max": float(values.max())}


def arrival_stats(arrival_s: np.ndarray) -> dict[str, float]:
    """Rate (gaps per second between the first and last arrival; inf for a burst), gap coefficient of variation
    (1 for Poisson, larger when burstier) and the span from first to last arrival."""
    times = np.asarray(arrival_s, dtype=np.float64)
    if len(times) < 2:
        return {"rate_per_s": math.nan, "gap_cv": math.nan, "duration_s": 0.0}
    gaps = np.diff(times)
    duration_s = float(times[-1] - times[0])
    mean_gap = gaps.mean()
    return {
        "rate_per_s": (len(gaps) / duration_s) if duration_s > 0 else math.inf,
        "gap_cv": float(gaps.std() / mean_gap) if mean_gap > 0 else math.nan,
        "duration_s": duration_s,
    }


def describe_workload(workload: Workload) -> dict:
    """What a user wants to know about a workload: size, arrival mode and process, rate, burstiness and the
    prompt/output token statistics, and when the prompts say which share text, their sharing statistics
    (:func:`servesim.workloads.sharing.prefix_sharing`; None otherwise). A pure closed loop (every request ready at
    t = 0) has no rate."""
    arrivals = arrival_stats(workload.arrival_s)
    if workload.arrival_mode == "closed" and workload.arrival_process == "burst":
        arrivals = {key: math.nan for key in arrivals}
    return {
        "workload": workload.name,
        "requests": len(workload),
        "seed": workload.seed,
        "arrival_mode": workload.arrival_mode,
        "concurrency": workload.concurrency,
        "arrival": workload.arrival_process,
        **arrivals,
        "prompt_tokens": length_stats(workload.prompt_tokens),
        "output_tokens": length_stats(workload.output_tokens),
        "prefix_sharing": (None if workload.prefixes is None
                           else prefix_sharing(workload.prefixes, workload.output_tokens)),
    }
