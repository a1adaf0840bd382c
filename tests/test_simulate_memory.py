"""Bounded memory in the serving simulator: finished requests kept as arrays, inter-token gaps counted rather than
every token's time kept, and the results of both ways agreeing."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.errors import ServesimError
from servesim.hardware import get_gpu
from servesim.models import get_model
from servesim.models.parallel import Parallelism
from servesim.serving import simulator
from servesim.serving.deployment import build_deployment
from servesim.serving.metrics import PERCENTILES, GapCounts, counted_percentiles
from servesim.serving.state import STEP_LOG_COLUMNS, GapCounter, RequestState, StepLog, merge_counts
from servesim.serving.step_time import StepTimeModel
from servesim.serving.trace import chrome_trace
from servesim.workloads import build_workload

PER_REQUEST = ("issue_s", "prompt_tokens", "output_tokens", "replica", "first_scheduled_s", "first_token_s",
               "finish_s", "preemptions", "cached_tokens", "token_offsets")
STEP_COLUMNS = ("replica", "start_s", "end_s", "num_requests", "num_tokens", "prefill_tokens", "num_decodes",
                "kv_used_tokens")


@pytest.fixture(scope="module")
def setup():
    dep = build_deployment(get_model("llama3-8b"), get_gpu("H100"), Parallelism(1, 2), "vllm", estimator="roofline",
                           memory_fraction=0.13, max_num_batched_tokens=1024)
    return dep, StepTimeModel(dep)


@pytest.fixture(scope="module")
def both(setup):
    """One run that keeps every token's time and the same run counting the gaps (preemptions, two replicas and
    two pipeline stages, so that gaps are irregular)."""
    dep, step_model = setup
    workload = build_workload("splitwise-conv", 300, qps=8.0, seed=3)
    return [simulator.simulate(dep, workload, step_model=step_model, replicas=2, token_times=keep)
            for keep in (True, False)]


def test_counted_gaps_give_the_exact_itl_statistics(both):
    exact, counted = both
    assert exact.itl_counts is None and counted.token_times_s is None
    assert counted.summary()["preemptions"] > 0
    values, counts = np.unique(exact.itl_s, return_counts=True)
    np.testing.assert_array_equal(counted.itl_counts.values_s, values)
    np.testing.assert_array_equal(counted.itl_counts.counts, counts)
    exact_summary, counted_summary = exact.summary(), counted.summary()
    assert counted_summary.keys() == exact_summary.keys()
    for key, value in exact_summary.items():
        if key == "itl_mean_ms":  # an exactly rounded sum against numpy's pairwise one: documented as 1e-12
            assert counted_summary[key] == pytest.approx(value, rel=1e-12)
        else:
            assert counted_summary[key] == value, key


def test_both_ways_keep_the_same_per_request_and_step_record(both):
    exact, counted = both
    for name in PER_REQUEST:
        np.testing.assert_array_equal(getattr(counted, name), getattr(exact, name))
    for name in STEP_COLUMNS:
        np.testing.assert_array_equal(getattr(counted.steps, name), getattr(exact.steps, name))
    assert counted.requests.equals(exact.requests)
    assert counted.timeline().equals(exact.timeline())
    assert chrome_trace(counted) == chrome_trace(exact)


def test_a_run_without_token_times_says_how_to_get_them(both):
    _, counted = both
    with pytest.raises(ServesimError, match="token_times=True"):
        counted.request_itl_ms(0)
    with pytest.raises(ServesimError, match="token_times=True"):
        _ = counted.itl_s


def test_token_times_are_kept_up_to_the_threshold(setup, monkeypatch):
    dep, step_model = setup
    workload = build_workload("fixed:64:8", 4, arrival="burst")
    monkeypatch.setattr(simulator, "TOKEN_TIMES_MAX_TOKENS", 32)
    assert simulator.simulate(dep, workload, step_model=step_model).token_times_s is not None
    monkeypatch.setattr(simulator, "TOKEN_TIMES_MAX_TOKENS", 31)
    assert simulator.simulate(dep, workload, step_model=step_model).token_times_s is None


@pytest.mark.parametrize("keep", [True, False])
def test_only_requests_in_the_system_are_objects_and_progress_is_reported(setup, keep):
    """Finished requests leave no RequestState (nor its token buffer) behind, whichever way token times are kept;
    progress reaches every request."""
    dep, step_model = setup
    workload = build_workload("fixed:256:32", 400, qps=2.0, seed=0)  # a few requests in the system at a time
    live, reported = [], []
    gc.collect()  # earlier tests' unreachable requests would otherwise count until a full collection

    def progress(done: int) -> None:
        reported.append(done)
        live.append(sum(type(obj) is RequestState for obj in gc.get_objects()))

    simulator.simulate(dep, workload, step_model=step_model, token_times=keep, progress=progress)
    assert reported == sorted(reported) and reported[-1] == len(workload) and len(reported) >= 50
    assert max(live) < 20


def test_gap_counter_folds_its_buffer_and_long_requests():
    rng = np.random.default_rng(0)
    steps_s = np.cumsum(rng.integers(1, 40, 500) / 1000)
    requests = [np.sort(rng.choice(steps_s, size, replace=False)) for size in (1, 2, 7, 3, 30, 5, 11)]
    counter = GapCounter(buffer_gaps=8)
    for times_s in requests:
        counter.add(times_s)
    counts = counter.counts()
    values, expected = np.unique(np.concatenate([np.diff(t) for t in requests]), return_counts=True)
    np.testing.assert_array_equal(counts.values_s, values)
    np.testing.assert_array_equal(counts.counts, expected)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=80), st.lists(st.integers(0, 30), max_size=80),
       st.floats(0, 100))
def test_counted_percentiles_and_merges_are_numpys(first, second, percentile):
    gaps = np.array(first + second) / 7
    values, counts = np.unique(gaps, return_counts=True)
    percentiles = (*PERCENTILES, percentile)
    np.testing.assert_array_equal(counted_percentiles(values, counts, percentiles), np.percentile(gaps, percentiles))
    summary = GapCounts(values / 1e3, counts).aggregate_ms("itl_ms")
    assert summary["itl_mean_ms"] == pytest.approx(float(np.mean(gaps / 1e3 * 1e3)), rel=1e-12)
    merged = merge_counts(*np.unique(np.array(first) / 7, return_counts=True),
                          *np.unique(np.array(second, dtype=np.int64) / 7, return_counts=True))
    np.testing.assert_array_equal(merged[0], values)
    np.testing.assert_array_equal(merged[1], counts)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2_000), min_size=1, max_size=8))
def test_step_log_keeps_launch_order_and_exact_counts(batches):
    """Single rows and blocks of many come back in the order they were logged, counts as exact integers, however
    they interleave and whenever the rows turn into blocks."""
    log, expected = StepLog(), []
    step = 0
    for i, size in enumerate(batches):
        if i % 2:  # a decode stretch logged as one block
            rows = np.array([(0, s * 0.5, s * 0.5 + 0.25, 3, 3, 0, 3, 2**52 + s) for s in range(step, step + size)],
                            dtype=np.float64).reshape(-1, len(STEP_LOG_COLUMNS))
            log.extend(rows)
            expected += rows.tolist()
        else:
            for s in range(step, step + size):
                row = (0, s * 0.5, s * 0.5 + 0.25, 1, 100, 99, 0, 2**52 + s)
                log.append(row)
                expected.append(list(row))
        step += size
        if i == len(batches) // 2:
            log.column("start_s")  # a read in between: later rows still join the log
    expected = np.array(expected, dtype=np.float64).reshape(-1, len(STEP_LOG_COLUMNS))
    for i, name in enumerate(STEP_LOG_COLUMNS):
        column = log.column(name)
        assert column.dtype == (np.float64 if name.endswith("_s") else np.int64)
        assert column.tolist() == (expected[:, i] if name.endswith("_s") else expected[:, i].astype(np.int64)).tolist()


@pytest.fixture(scope="module")
def streamed(setup):
    """The run of ``both`` (tokens kept, then gaps counted) with the API server streaming every 8th token."""
    dep, step_model = setup
    chunked = build_deployment(get_model("llama3-8b"), get_gpu("H100"), Parallelism(1, 2), "vllm",
                               estimator="roofline", memory_fraction=0.13, max_num_batched_tokens=1024,
                               stream_interval=8)
    workload = build_workload("splitwise-conv", 300, qps=8.0, seed=3)
    return [simulator.simulate(chunked, workload, step_model=step_model, replicas=2, token_times=keep)
            for keep in (True, False)]


def test_a_stream_interval_changes_what_the_client_times_between_and_nothing_else(both, streamed):
    """With --stream-interval N the client gets a request's first token, every N-th after it and its last: TTFT,
    TPOT and E2E stay, each request's chunk gaps add up to its E2E less its TTFT, and there are
    ceil((output - 1) / N) of them."""
    exact, chunked = both[0], streamed[0]
    plain, summary = exact.summary(), chunked.summary()
    for key in ("ttft_mean_ms", "tpot_mean_ms", "e2e_mean_ms", "ttft_p99_ms", "e2e_p99_ms"):
        assert summary[key] == plain[key], key
    outputs = chunked.output_tokens
    assert len(chunked.itl_s) == int((-(-(outputs - 1) // 8)).sum())
    for rid in np.flatnonzero(outputs > 1)[:50]:
        gaps = chunked.request_itl_ms(rid)
        assert len(gaps) == -(-(outputs[rid] - 1) // 8)
        assert gaps.sum() == pytest.approx((chunked.e2e_s[rid] - chunked.ttft_s[rid]) * 1e3, rel=1e-9)
    assert summary["itl_p50_ms"] > plain["itl_p50_ms"]


def test_counted_chunk_gaps_give_the_exact_itl_statistics(streamed):
    exact, counted = streamed
    values, counts = np.unique(exact.itl_s, return_counts=True)
    np.testing.assert_array_equal(counted.itl_counts.values_s, values)
    np.testing.assert_array_equal(counted.itl_counts.counts, counts)
