"""``build_workload``: the one entry point from a user's words (profile, spec or trace; rate or concurrency) to a
:class:`Workload`."""

from __future__ import annotations

import math

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from servesim.errors import ServesimError, suggest
from servesim.workloads.arrivals import ArrivalProcess, Burst, EmpiricalGaps, Gamma, Poisson, Replay
from servesim.workloads.generators import GENERATOR_KINDS, PRESETS, is_generator_spec, parse_generator_spec
from servesim.workloads.lengths import SPEC_KINDS, is_length_spec, parse_length_spec
from servesim.workloads.prefix import PromptSegments
from servesim.workloads.profiles import load_profile, profile_names
from servesim.workloads.request import Workload
from servesim.workloads.sharing import truncate_segments
from servesim.workloads.stats import arrival_stats
from servesim.workloads.traces import HASH_BLOCK_TOKENS, load_trace

ARRIVALS = ("poisson", "gamma", "burst", "trace")
DEFAULT_REQUESTS = 1000  # generated sources, when no count is given
_TRACE_SUFFIXES = (".csv", ".csv.gz", ".jsonl", ".ndjson")


@dataclasses.dataclass(frozen=True, eq=False)
class _Drawn:
    """Lengths for ``n`` requests, the source's own arrival process (None when it has no timing) and the prompts'
    segments (None when every prompt is its own text)."""

    name: str
    lengths: np.ndarray  # (n, 2): prompt, output tokens
    own_arrivals: Replay | EmpiricalGaps | None
    prefixes: PromptSegments | None = None


class NoArrivalTimes(ServesimError):
    """A source without timing of its own (a profile of lengths only, a length spec, a trace without arrival
    times) was asked for its own arrivals: no rate, concurrency or arrival process was given."""


def source_names() -> list[str]:
    """The built-in named sources: the profiles and the generator presets."""
    return sorted([*profile_names(), *PRESETS])


def _unknown(source: str) -> ServesimError:
    examples = ", ".join(example for _, _, example in SPEC_KINDS.values())
    generators = ", ".join(example for *_, example in GENERATOR_KINDS.values())
    return ServesimError(
        f"unknown workload {source!r}.{suggest(source, source_names())} Give a profile "
        f"({', '.join(source_names())}), a length spec ({examples}), a shared-prompt spec ({generators}) or the "
        f"path of a CSV/JSONL trace"
    )


def _draw(source: str, num_requests: int | None, rng: np.random.Generator, columns: Mapping[str, str] | None,
          hash_block_tokens: int) -> _Drawn:
    is_trace = source.lower().endswith(_TRACE_SUFFIXES) or Path(source).is_file()
    if columns is not None and not is_trace:
        raise ServesimError("a column mapping applies only to trace files")
    if is_length_spec(source):
        return _Drawn(source, parse_length_spec(source).sample(rng, num_requests or DEFAULT_REQUESTS), None)
    key = source.strip().lower()
    if is_generator_spec(source) or key in PRESETS:
        generator = PRESETS[key].generator if key in PRESETS else parse_generator_spec(source)
        lengths, prefixes = generator.sample(rng, num_requests or DEFAULT_REQUESTS)
        return _Drawn(key if key in PRESETS else source, lengths, None, prefixes)
    if key in profile_names():
        profile = load_profile(source)
        return _Drawn(profile.name, profile.lengths.sample(rng, num_requests or DEFAULT_REQUESTS), profile.arrivals)
    if not is_trace:
        if Path(source).is_dir():
            raise ServesimError(f"workload {source!r} is a folder; give the path of one CSV/JSONL trace file in it")
        raise _unknown(source)
    trace = load_trace(source, columns, hash_block_tokens)
    n = len(trace) if num_requests is None else num_requests
    if n > len(trace):
        raise ServesimError(f"{source} has {len(trace)} requests, fewer than the {n} asked for; ask for at most "
                            f"{len(trace)} (or leave the count out to replay them all)")
    lengths = np.column_stack([trace.prompt_tokens[:n], trace.output_tokens[:n]])
    own = None if trace.arrival_s is None else Replay(trace.arrival_s[:n])
    prefixes = trace.prefixes if trace.prefixes is None or n == len(trace) else trace.prefixes.take(np.arange(n))
    return _Drawn(trace.name, lengths, own, prefixes)


def _resolve_arrival(arrival: str | None, qps: float | None, concurrency: int | None, drawn: _Drawn) -> str:
    if arrival is None:
        if qps is not None:
            return "poisson"
        if concurrency is not None:
            return "burst"
        if drawn.own_arrivals is not None:
            return "trace"
        raise NoArrivalTimes(f"{drawn.name!r} has no arrival times: give a rate (qps / --qps), a closed-loop "
                            f"concurrency (--concurrency) or arrival 'burst' (--arrival burst)")
    if arrival not in ARRIVALS:
        raise ServesimError(f"unknown arrival process {arrival!r}; choose one of {', '.join(ARRIVALS)}")
    return arrival


def _arrival_process(arrival: str, qps: float | None, cv: float, time_scale: float, drawn: _Drawn) -> ArrivalProcess:
    if cv != 1.0 and arrival != "gamma":
        raise ServesimError(f"cv (gap coefficient of variation) applies to gamma arrivals, not {arrival}; "
                            f"use arrival 'gamma'")
    if time_scale != 1.0 and (arrival != "trace" or qps is not None):
        raise ServesimError("time_scale rescales a trace's own timing (arrival 'trace' without a rate); with a "
                            "rate (qps) the rate alone sets the timing")
    if arrival == "burst":
        if qps is not None:
            raise ServesimError("a burst sends every request at t = 0 and takes no rate; drop qps or pick poisson")
        return Burst()
    if arrival == "trace":
        own = drawn.own_arrivals
        if own is None:
            raise ServesimError(f"{drawn.name!r} has no arrival times to replay; pick poisson, gamma or burst")
        if isinstance(own, EmpiricalGaps):
            return dataclasses.replace(own, rate_per_s=qps if qps is not None else own.rate_per_s / time_scale)
        if qps is None:
            return dataclasses.replace(own, time_scale=time_scale)
        trace_rate = arrival_stats(own.trace_arrival_s)["rate_per_s"]
        if not np.isfinite(trace_rate):
            raise ServesimError(f"{drawn.name!r} has no spread of arrival times to rescale to a rate")
        return dataclasses.replace(own, time_scale=trace_rate / qps)
    if qps is None:
        raise ServesimError(f"{arrival} arrivals need a rate: give qps (requests per second)")
    return Poisson(qps) if arrival == "poisson" else Gamma(qps, cv)


def _check_arrivals(arrival_s: np.ndarray, name: str, qps: float | None) -> None:
    """Refuse arrival times past :data:`servesim.limits.MAX_ARRIVAL_S` (or not finite)."""
    from servesim.limits import MAX_ARRIVAL_S

    latest = float(np.max(arrival_s)) if len(arrival_s) else 0.0
    if math.isfinite(latest) and latest <= MAX_ARRIVAL_S:
        return
    fix = (f"raise --qps to at least {2 * len(arrival_s) / MAX_ARRIVAL_S:.3g}" if qps is not None
           else "check the arrival column's unit (seconds) or give --qps")
    raise ServesimError(f"{name}: the last request would arrive at {latest:.3g} s, later than the "
                        f"{MAX_ARRIVAL_S:.0e} s a workload may span; {fix}")


def build_workload(
    profile_or_trace: str,
    num_requests: int | None = None,
    qps: float | None = None,
    concurrency: int | None = None,
    seed: int = 0,
    arrival: str | None = None,
    cv: float = 1.0,
    time_scale: float = 1.0,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    columns: Mapping[str, str] | None = None,
    hash_block_tokens: int = HASH_BLOCK_TOKENS,
) -> Workload:
    """Build a seeded, reproducible workload.

    ``profile_or_trace`` is one of:

    - a built-in profile (``arxiv``, ``splitwise-conv``, ``splitwise-code``) or generator preset
      (``chat-shared-prefix``; :data:`servesim.workloads.generators.PRESETS`);
    - a length spec (``fixed:1024:128``, ``uniform:512-2048:64-256``, ``lognormal:2048,0.5:256,1.0``,
      ``zipf:16-8192,1.1:128``; see :func:`parse_length_spec`): every prompt its own text;
    - a shared-prompt spec (:func:`servesim.workloads.generators.parse_generator_spec`), each length a whole
      number of tokens or a range ``LOW-HIGH``: ``shared-prefix:GROUPS,PROMPTS_PER_GROUP:SYSTEM:QUESTION:OUTPUT``
      (each prompt its group's system prompt then its own question), ``repeat:DISTINCT:PROMPT:OUTPUT`` (a set of
      prompts sent again and again) or ``multi-turn:ACTIVE,TURNS:MESSAGE:OUTPUT`` (conversations, each turn's
      prompt the previous prompt, its answer and a new message; turn k + 1 comes ACTIVE requests after turn k,
      without waiting for the answer);
    - a ``vllm bench serve`` dataset: ``random:INPUT:OUTPUT[:RANGE_RATIO[:PREFIX_LEN]]`` (its ``random`` dataset,
      one prefix shared by every prompt) or ``prefix-repetition:PREFIX_LEN:SUFFIX_LEN:NUM_PREFIXES:OUTPUT_LEN``;
    - a CSV/JSONL trace path (``columns`` maps its columns when its format is not recognised; ``prompt_id`` or
      Mooncake's ``hash_ids``, of ``hash_block_tokens`` tokens per block, say which prompts share text).

    A trace gives its first ``num_requests`` rows (all when None), in order; the others draw ``num_requests``
    (``DEFAULT_REQUESTS`` when None). The workload's ``prefixes`` say which prompts share text (None for sources
    that do not say).

    Arrivals (``arrival``): ``poisson`` or ``gamma`` (gap coefficient of variation ``cv``) at ``qps`` requests/s;
    ``burst``, every request at t = 0; ``trace``, the source's own timing: a trace's timestamps replayed
    (multiplied by ``time_scale``, or rescaled to ``qps``) or a Splitwise profile's gap distribution (at its
    recorded rate, or ``qps``). When ``arrival`` is None: poisson if ``qps`` is given, else burst if
    ``concurrency`` is, else the source's own timing.

    ``concurrency`` makes the workload closed-loop: at most that many requests in flight, the next one sent as one
    finishes (with ``qps`` too, the arrivals are also paced, like ``vllm bench serve --request-rate R
    --max-concurrency N``). ``max_prompt_tokens`` / ``max_output_tokens`` truncate longer requests (a truncated
    prompt keeps its leading segments, the last one cut).

    The same arguments give the same workload; lengths and arrivals use separate random streams, so changing the
    arrival process or rate keeps the request lengths.
    """
    if num_requests is not None and num_requests < 1:
        raise ServesimError(f"the number of requests must be at least 1, not {num_requests}")
    if concurrency is not None and concurrency < 1:
        raise ServesimError(f"concurrency must be at least 1 client, not {concurrency}")
    for label, limit in (("max_prompt_tokens", max_prompt_tokens), ("max_output_tokens", max_output_tokens)):
        if limit is not None and limit < 1:
            raise ServesimError(f"{label} must be at least 1, not {limit}")
    length_rng, arrival_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    drawn = _draw(profile_or_trace, num_requests, length_rng, columns, hash_block_tokens)
    arrival = _resolve_arrival(arrival, qps, concurrency, drawn)
    process = _arrival_process(arrival, qps, cv, time_scale, drawn)
    prompt, output = drawn.lengths[:, 0], drawn.lengths[:, 1]
    with np.errstate(all="ignore"):
        arrival_s = process.arrival_times_s(arrival_rng, len(prompt))
    _check_arrivals(arrival_s, drawn.name, qps)
    return Workload(
        name=drawn.name,
        prompt_tokens=np.clip(prompt, 1, max_prompt_tokens),
        output_tokens=np.clip(output, 1, max_output_tokens),
        arrival_s=arrival_s,
        arrival_mode="open" if concurrency is None else "closed",
        concurrency=concurrency,
        seed=seed,
        arrival_process=arrival,
        prefixes=None if drawn.prefixes is None else truncate_segments(drawn.prefixes, max_prompt_tokens),
    )
