"""Built-in workload profiles: compact statistics of public traces (``profiles/*.json``).

Each profile stores an :class:`EmpiricalLengths` (quantile tables of prompt and output tokens plus their rank
copula) and, when the trace has arrival times, its gap distribution and rate; with the trace's own summary
statistics and where it came from. ``scripts/derive_profiles.py`` writes them with :func:`derive_profile_record`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources

import numpy as np

from servesim.errors import ServesimError, suggest
from servesim.workloads.arrivals import EmpiricalGaps
from servesim.workloads.lengths import EmpiricalLengths, QuantileTable
from servesim.workloads.stats import arrival_stats, length_stats
from servesim.workloads.traces import Trace

DERIVATION = (
    "scripts/derive_profiles.py: prompt/output token quantile tables (257 evenly spaced probabilities plus the 32 "
    "largest values), a 20x20 copula of (prompt rank, output rank) counts, and for timed traces the quantile table "
    "of inter-arrival gaps and the mean rate; trace_stats are the trace's own statistics"
)


@dataclass(frozen=True, eq=False)
class Profile:
    name: str
    description: str
    lengths: EmpiricalLengths
    arrivals: EmpiricalGaps | None  # None: the trace has no arrival times
    trace_stats: dict  # {"requests", "prompt_tokens": length_stats, "output_tokens": ..., "arrivals": arrival_stats}
    source: dict


def derive_profile_record(trace: Trace, description: str, source: dict) -> dict:
    """The JSON record of a profile fitted to ``trace``."""
    stats = {
        "requests": len(trace),
        "prompt_tokens": length_stats(trace.prompt_tokens),
        "output_tokens": length_stats(trace.output_tokens),
    }
    record = {"name": trace.name, "description": description, "source": source, "derivation": DERIVATION}
    if trace.arrival_s is not None:
        stats["arrivals"] = arrival_stats(trace.arrival_s)
        gaps = QuantileTable.fit(np.diff(trace.arrival_s))
        record["arrivals"] = {"rate_per_s": round(stats["arrivals"]["rate_per_s"], 6), "gaps_s": gaps.to_dict()}
    record["trace_stats"] = stats
    record["lengths"] = EmpiricalLengths.fit(trace.prompt_tokens, trace.output_tokens).to_dict()
    return record


@functools.cache
def _profile_texts() -> dict[str, str]:
    folder = resources.files("servesim.workloads").joinpath("profiles")
    return {
        entry.name.removesuffix(".json"): entry.read_text(encoding="utf-8")
        for entry in folder.iterdir()
        if entry.name.endswith(".json")
    }


def profile_names() -> list[str]:
    return sorted(_profile_texts())


@functools.cache
def load_profile(name: str) -> Profile:
    """A built-in profile by name (case-insensitive)."""
    key = name.strip().lower()
    if key not in _profile_texts():
        raise ServesimError(f"unknown workload profile {name!r}.{suggest(name, profile_names())} "
                            f"Profiles: {', '.join(profile_names())}")
    record = json.loads(_profile_texts()[key])
    arrivals = record.get("arrivals")
    return Profile(
        name=record["name"],
        description=record["description"],
        lengths=EmpiricalLengths.from_dict(record["lengths"]),
        arrivals=(EmpiricalGaps(QuantileTable.from_dict(arrivals["gaps_s"]), arrivals["rate_per_s"])
                  if arrivals else None),
        trace_stats=record["trace_stats"],
        source=record["source"],
    )
