"""Request streams for the serving simulator: length distributions, arrival processes, closed-loop concurrency,
trace loaders and built-in profiles fitted to public traces. :func:`build_workload` is the entry point."""

from servesim.workloads.arrivals import ArrivalProcess, Burst, EmpiricalGaps, Gamma, Poisson, Replay
from servesim.workloads.build import ARRIVALS, DEFAULT_REQUESTS, build_workload
from servesim.workloads.lengths import (
    EmpiricalLengths,
    Fixed,
    IndependentLengths,
    LogNormal,
    QuantileTable,
    Uniform,
    Zipf,
    parse_length_spec,
)
from servesim.workloads.profiles import Profile, load_profile, profile_names
from servesim.workloads.request import Request, Workload
from servesim.workloads.stats import arrival_stats, describe_workload, length_stats
from servesim.workloads.traces import Trace, load_trace, parse_columns

__all__ = [
    "ARRIVALS",
    "DEFAULT_REQUESTS",
    "ArrivalProcess",
    "Burst",
    "EmpiricalGaps",
    "EmpiricalLengths",
    "Fixed",
    "Gamma",
    "IndependentLengths",
    "LogNormal",
    "Poisson",
    "Profile",
    "QuantileTable",
    "Replay",
    "Request",
    "Trace",
    "Uniform",
    "Workload",
    "Zipf",
    "arrival_stats",
    "build_workload",
    "describe_workload",
    "length_stats",
    "load_profile",
    "load_trace",
    "parse_columns",
    "parse_length_spec",
    "profile_names",
]
