"""Length distributions, arrival processes, build_workload and the built-in profiles."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from servesim.errors import ServesimError
from servesim.workloads import (
    Burst,
    Fixed,
    Gamma,
    IndependentLengths,
    LogNormal,
    Poisson,
    Replay,
    Request,
    Uniform,
    Workload,
    Zipf,
    arrival_stats,
    build_workload,
    length_stats,
    load_profile,
    load_trace,
    parse_length_spec,
    profile_names,
)
from servesim.workloads.profiles import derive_profile_record

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "vidur" / "traces"
PROFILE_TRACES = {
    "arxiv": "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
    "splitwise-conv": "splitwise_conv.csv",
    "splitwise-code": "splitwise_code.csv",
}


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ranks = [np.argsort(np.argsort(x, kind="stable"), kind="stable") for x in (a, b)]
    return float(np.corrcoef(*ranks)[0, 1])


def assert_percentile(samples: np.ndarray, value: float, percent: float, tolerance: float = 0.01) -> None:
    """``value`` is the samples' ``percent``-th percentile to within ``tolerance`` of probability mass. Checking the
    mass rather than the value stays fair where the density is thin (a value can move a lot there) or where many
    requests share one length."""
    below, at_or_below = np.mean(samples < value), np.mean(samples <= value)
    assert below - tolerance <= percent / 100 <= at_or_below + tolerance, (value, percent, below, at_or_below)


# --- length distributions -------------------------------------------------------------------------------------


def test_uniform_covers_its_inclusive_range():
    x = Uniform(10, 13).sample(rng(), 4000)
    assert set(np.unique(x)) == {10, 11, 12, 13}


def test_lognormal_has_the_requested_mean_and_cv():
    x = LogNormal(2048, 0.5).sample(rng(), 200_000)
    assert x.mean() == pytest.approx(2048, rel=0.01)
    assert x.std() / x.mean() == pytest.approx(0.5, rel=0.03)
    assert x.min() >= 1


def test_zipf_favours_short_lengths_by_the_exponent():
    x = Zipf(100, 5000, theta=1.0).sample(rng(), 200_000)
    assert x.min() >= 100 and x.max() <= 5000
    ratio = np.mean(x == 100) / np.mean(x == 101)  # P(rank 1) / P(rank 2) = 2 ** theta
    assert ratio == pytest.approx(2.0, rel=0.1)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("fixed:1024:128", IndependentLengths(Fixed(1024), Fixed(128))),
        ("uniform:512-2048:64-256", IndependentLengths(Uniform(512, 2048), Uniform(64, 256))),
        ("lognormal:2048,0.5:256,1.0", IndependentLengths(LogNormal(2048, 0.5), LogNormal(256, 1.0))),
        ("zipf:16-8192,1.1:16-1024", IndependentLengths(Zipf(16, 8192, 1.1), Zipf(16, 1024))),
        ("LogNormal:2048,0.5:128", IndependentLengths(LogNormal(2048, 0.5), Fixed(128))),
    ],
)
def test_length_specs_read_as_documented(spec, expected):
    assert parse_length_spec(spec) == expected


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("fixed:1024", "prompt and an output"),
        ("uniform:2048-512:64", "low <= high"),
        ("lognormal:2048:abc", "output part 'abc'"),
        ("zipf:16-8192,x:16-64", "prompt part '16-8192,x'"),
        ("fixed:0:10", "1 to 2,147,483,647 tokens"),
        ("uniform:512-99999999999999999999:64", "<= 2,147,483,647"),
        ("lognormal:2048,1e300:256,1", "at most 10"),
        ("lognormal:inf,0.5:256,1", "not mean inf"),
        ("zipf:16-2000000000:16", "spans at most 16,777,216 lengths"),
    ],
)
def test_bad_length_specs_say_which_part_is_wrong(spec, named):
    with pytest.raises(ServesimError, match=named):
        parse_length_spec(spec)


# --- arrival processes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("process", "cv"), [(Poisson(8.0), 1.0), (Gamma(8.0, 3.0), 3.0), (Gamma(8.0, 0.3), 0.3)])
def test_renewal_arrivals_have_the_requested_rate_and_burstiness(process, cv):
    times = process.arrival_times_s(rng(), 100_000)
    assert times[0] == 0 and (np.diff(times) >= 0).all()
    stats = arrival_stats(times)
    assert stats["rate_per_s"] == pytest.approx(8.0, rel=0.03)
    assert stats["gap_cv"] == pytest.approx(cv, rel=0.05)


def test_burst_sends_everything_at_zero():
    assert not Burst().arrival_times_s(rng(), 5).any()


def test_replay_starts_at_zero_and_scales_time():
    replay = Replay(np.array([10.0, 11.0, 13.0, 20.0]), time_scale=0.5)
    assert replay.arrival_times_s(rng(), 3).tolist() == [0.0, 0.5, 1.5]
    with pytest.raises(ServesimError, match="only 4 requests"):
        replay.arrival_times_s(rng(), 5)


# --- Workload ---------------------------------------------------------------------------------------------------


def test_workload_exposes_requests_and_arrays():
    requests = [Request(0, 0.5, 100, 10), Request(1, 0.0, 200, 20)]
    workload = Workload.from_requests("two", requests)
    assert workload.prompt_tokens.tolist() == [200, 100]  # arrival order
    assert workload.requests == (Request(0, 0.0, 200, 20), Request(1, 0.5, 100, 10))
    assert len(workload) == 2
    with pytest.raises(ValueError):
        workload.prompt_tokens[0] = 1  # read-only


@pytest.mark.parametrize(
    "kwargs",
    [
        {"output_tokens": [0]},
        {"arrival_s": [float("nan")]},
        {"arrival_mode": "closed"},
        {"concurrency": 4},
    ],
)
def test_workload_rejects_impossible_requests(kwargs):
    fields = {"name": "w", "prompt_tokens": [10], "output_tokens": [5], "arrival_s": [0.0], **kwargs}
    with pytest.raises(ValueError):
        Workload(**fields)


# --- build_workload ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["splitwise-conv", "arxiv", "zipf:16-4096:16-512"])
def test_same_seed_same_workload(source):
    first = build_workload(source, 500, qps=4.0, seed=7)
    assert first == build_workload(source, 500, qps=4.0, seed=7)
    assert first != build_workload(source, 500, qps=4.0, seed=8)


def test_changing_the_arrival_process_keeps_the_lengths():
    poisson = build_workload("splitwise-conv", 300, qps=2.0, seed=3)
    bursty = build_workload("splitwise-conv", 300, qps=6.0, arrival="gamma", cv=4.0, seed=3)
    assert np.array_equal(poisson.prompt_tokens, bursty.prompt_tokens)
    assert np.array_equal(poisson.output_tokens, bursty.output_tokens)
    assert not np.array_equal(poisson.arrival_s, bursty.arrival_s)


def test_concurrency_makes_a_closed_loop():
    closed = build_workload("fixed:1024:128", 64, concurrency=8)
    assert (closed.arrival_mode, closed.concurrency, closed.arrival_process) == ("closed", 8, "burst")
    assert not closed.arrival_s.any()
    paced = build_workload("fixed:1024:128", 64, concurrency=8, qps=4.0)
    assert paced.arrival_mode == "closed" and paced.arrival_s[-1] > 0


def test_default_arrivals_follow_the_source():
    assert build_workload("splitwise-code", 100).arrival_process == "trace"
    assert build_workload("splitwise-code", 100, qps=1.0).arrival_process == "poisson"
    assert build_workload("arxiv", 100, arrival="burst").arrival_process == "burst"


def test_a_profiles_own_timing_follows_time_scale_or_qps():
    recorded = load_profile("splitwise-conv").arrivals.rate_per_s
    for kwargs, rate in (({}, recorded), ({"time_scale": 2.0}, recorded / 2), ({"qps": 20.0, "arrival": "trace"}, 20.0)):
        workload = build_workload("splitwise-conv", 20_000, **kwargs)
        assert arrival_stats(workload.arrival_s)["rate_per_s"] == pytest.approx(rate, rel=0.03), kwargs


def test_max_tokens_truncate_long_requests():
    workload = build_workload("arxiv", 2000, qps=1.0, max_prompt_tokens=2048, max_output_tokens=256)
    assert workload.prompt_tokens.max() == 2048 and workload.output_tokens.max() == 256


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"profile_or_trace": "arxiv"}, "has no arrival times"),
        ({"profile_or_trace": "arxv", "qps": 1.0}, "Did you mean arxiv"),
        ({"profile_or_trace": "arxiv", "qps": 1.0, "cv": 2.0}, "gamma"),
        ({"profile_or_trace": "splitwise-conv", "qps": 1.0, "time_scale": 2.0}, "time_scale"),
        ({"profile_or_trace": "arxiv", "qps": 1.0, "arrival": "burst"}, "burst"),
        ({"profile_or_trace": "arxiv", "qps": 1.0, "arrival": "trace"}, "no arrival times to replay"),
        ({"profile_or_trace": "arxiv", "arrival": "gamma"}, "need a rate"),
        ({"profile_or_trace": "arxiv", "qps": -1.0}, "positive"),
        ({"profile_or_trace": "arxiv", "qps": 1.0, "arrival": "weibull"}, "poisson, gamma, burst, trace"),
        ({"profile_or_trace": "arxiv", "concurrency": 0}, "at least 1 client"),
        ({"profile_or_trace": "arxiv", "qps": 1.0, "arrival": "gamma", "cv": 1e308}, "at most 10"),
        ({"profile_or_trace": "lognormal:1000000000,10:256", "qps": 1.0}, "drew .* tokens, beyond"),
    ],
)
def test_build_workload_explains_bad_requests(kwargs, message):
    with pytest.raises(ServesimError, match=message):
        build_workload(num_requests=10, **kwargs)


# --- built-in profiles ------------------------------------------------------------------------------------------


def test_profiles_are_the_three_public_traces():
    assert profile_names() == sorted(PROFILE_TRACES)


@pytest.mark.parametrize("name", sorted(PROFILE_TRACES))
def test_profiles_are_compact_and_cite_their_source(name):
    entry = resources.files("servesim.workloads").joinpath("profiles", f"{name}.json")
    assert len(entry.read_bytes()) < 50_000
    record = json.loads(entry.read_text(encoding="utf-8"))
    assert record["source"]["license"] == "MIT" and "vidur" in record["source"]["repository"]
    assert "derive_profiles.py" in record["derivation"]


# Published statistics (SOURCE.md): prompt mean, prompt p90, output mean, rate (req/s), gap CV.
PUBLISHED = {
    "arxiv": (2588, 3702, 291, None, None),
    "splitwise-conv": (1155, 2734, 211, 5.53, None),
    "splitwise-code": (2048, None, 28, 2.57, 13),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_generated_profiles_match_the_published_statistics(name):
    prompt_mean, prompt_p90, output_mean, rate, gap_cv = PUBLISHED[name]
    workload = build_workload(name, 20_000, seed=11, arrival=None if rate else "burst")
    prompt, output = length_stats(workload.prompt_tokens), length_stats(workload.output_tokens)
    assert prompt["mean"] == pytest.approx(prompt_mean, rel=0.03)
    assert output["mean"] == pytest.approx(output_mean, rel=0.03)
    if prompt_p90:
        assert_percentile(workload.prompt_tokens, prompt_p90, 90)
    if rate:  # the long-run rate: Splitwise-code's gaps are heavy-tailed, so it needs many arrivals to settle
        times = load_profile(name).arrivals.arrival_times_s(rng(5), 400_000)
        assert arrival_stats(times)["rate_per_s"] == pytest.approx(rate, rel=0.03)
    if gap_cv:
        assert arrival_stats(workload.arrival_s)["gap_cv"] > gap_cv / 2


@pytest.mark.parametrize("name", sorted(PROFILE_TRACES))
def test_profiles_match_their_trace_percentiles_and_correlation(name):
    profile = load_profile(name)
    pairs = profile.lengths.sample(rng(2), 50_000)
    for column, kind in enumerate(("prompt_tokens", "output_tokens")):
        trace = profile.trace_stats[kind]
        assert pairs[:, column].mean() == pytest.approx(trace["mean"], rel=0.02)
        for percent in (50, 90, 99):
            assert_percentile(pairs[:, column], trace[f"p{percent}"], percent)
    if not TRACES.is_dir():
        pytest.skip("the shared Vidur traces are absent")
    trace = load_trace(TRACES / PROFILE_TRACES[name])
    expected = spearman(trace.prompt_tokens, trace.output_tokens)
    assert spearman(pairs[:, 0], pairs[:, 1]) == pytest.approx(expected, abs=0.03)


@pytest.mark.parametrize("name", sorted(PROFILE_TRACES))
def test_committed_profiles_are_derived_from_the_shared_traces(name):
    if not TRACES.is_dir():
        pytest.skip("the shared Vidur traces are absent")
    committed = json.loads(
        resources.files("servesim.workloads").joinpath("profiles", f"{name}.json").read_text(encoding="utf-8")
    )
    derived = derive_profile_record(load_trace(TRACES / PROFILE_TRACES[name]), "", {})
    for key in ("trace_stats", "lengths", "arrivals"):
        assert json.loads(json.dumps(derived.get(key))) == committed.get(key), key


def test_a_folder_is_not_taken_for_an_unknown_workload_name(tmp_path):
    with pytest.raises(ServesimError, match="is a folder; give the path of one CSV/JSONL trace file"):
        build_workload(str(tmp_path), qps=1.0)
