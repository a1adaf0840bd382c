"""Request streams for the serving simulator: length distributions, arrival processes, closed-loop concurrency,
trace loaders, built-in profiles fitted to public traces and generators of prompts that share text (for a prefix
cache). :func:`build_workload` is the entry point."""

from servesim.workloads.arrivals import ArrivalProcess, Burst, EmpiricalGaps, Gamma, Poisson, Replay
from servesim.workloads.build import ARRIVALS, DEFAULT_REQUESTS, NoArrivalTimes, build_workload, source_names
from servesim.workloads.generators import (
    PRESETS,
    Conversations,
    PrefixRepetition,
    RandomPrompts,
    RepeatedPrompts,
    SharedPrefix,
    parse_generator_spec,
    preset_names,
)
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
from servesim.workloads.prefix import UNIQUE, PromptSegments, unique_prompts
from servesim.workloads.request import Request, Workload
from servesim.workloads.sharing import CACHE_BLOCK_TOKENS, cached_prompt_tokens, prefix_sharing, truncate_segments
from servesim.workloads.stats import arrival_stats, describe_workload, length_stats
from servesim.workloads.traces import HASH_BLOCK_TOKENS, Trace, load_trace, parse_columns

__all__ = [
    "NoArrivalTimes",
    "ARRIVALS",
    "CACHE_BLOCK_TOKENS",
    "DEFAULT_REQUESTS",
    "HASH_BLOCK_TOKENS",
    "PRESETS",
    "UNIQUE",
    "ArrivalProcess",
    "Burst",
    "Conversations",
    "EmpiricalGaps",
    "EmpiricalLengths",
    "Fixed",
    "Gamma",
    "IndependentLengths",
    "LogNormal",
    "Poisson",
    "PrefixRepetition",
    "Profile",
    "PromptSegments",
    "QuantileTable",
    "RandomPrompts",
    "RepeatedPrompts",
    "Replay",
    "Request",
    "SharedPrefix",
    "Trace",
    "Uniform",
    "Workload",
    "Zipf",
    "arrival_stats",
    "build_workload",
    "cached_prompt_tokens",
    "describe_workload",
    "length_stats",
    "load_profile",
    "load_trace",
    "parse_columns",
    "parse_generator_spec",
    "parse_length_spec",
    "prefix_sharing",
    "preset_names",
    "profile_names",
    "source_names",
    "truncate_segments",
    "unique_prompts",
]
