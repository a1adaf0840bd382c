"""The compiled event loop of one vLLM or SGLang replica (servesim/serving/compiled_loop.py) gives what the Python
loop gives, stepping every step through the scheduler: the same requests, tokens, steps, stops and progress
reports."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.hardware import get_gpu
from servesim.models import get_model
from servesim.models.parallel import Parallelism
from servesim.serving import compiled_loop
from servesim.serving.compiled_cache import grown as grow
from servesim.serving.compiled_cache import new_cache
from servesim.serving.deployment import build_deployment
from servesim.serving.simulator import simulate
from servesim.serving.step_time import StepTimeModel
from servesim.serving.stop import StopRule, StoppedEarly
from servesim.workloads import build_workload

from workload_strategies import make_prefix_workload, make_workload, prefix_workload_specs, workload_specs

MODEL, GPU = get_model("llama3-8b"), get_gpu("H100")
#: Leave a few thousand KV tokens beside llama3-8b's weights (all of them, or half with two pipeline stages):
#: requests are preempted.
SMALL_MEMORY = {1: 0.235, 2: 0.125, 4: 0.08}
RESULT_FIELDS = ("issue_s", "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "cached_tokens",
                 "replica", "token_offsets", "token_times_s")
STEP_FIELDS = ("replica", "start_s", "end_s", "num_requests", "num_tokens", "prefill_tokens", "num_decodes",
               "kv_used_tokens")


@pytest.fixture(scope="module")
def step_models():
    return {}


def step_model(cache, engine: str, small: bool, front_end: bool, pp: int = 1, **overrides):
    """A deployment and its step-time model (one per configuration, shared across examples); ``front_end`` adds
    API-server costs per request and per prompt token to the release's request latency. With pipeline stages
    async scheduling is off (vLLM runs none with them)."""
    memory = {"memory_fraction": SMALL_MEMORY[pp], "max_num_batched_tokens": 1024} if small else {}
    if pp > 1:
        overrides["async_scheduling"] = False
    dep = build_deployment(MODEL, GPU, Parallelism(1, pp), engine, estimator="roofline", **memory, **overrides)
    key = (engine, small, front_end, pp, tuple(sorted(overrides.items())))
    if key not in cache:
        overhead = dep.release.overhead
        if front_end:
            overhead = dataclasses.replace(overhead, request_us=1500.0, per_prompt_token_us=0.8)
        cache[key] = StepTimeModel(dep, overhead=overhead)
    return dep, cache[key]


def both(dep, steps, workload, **kwargs):
    """(compiled, Python) runs: each a result, or the StoppedEarly it raised."""
    runs = []
    for fast in (True, False):
        try:
            runs.append(simulate(dep, workload, step_model=steps, fast_forward_decodes=fast, **kwargs))
        except StoppedEarly as stop:
            runs.append(stop)
    return runs


def assert_same(compiled, python):
    if isinstance(python, StoppedEarly):
        assert isinstance(compiled, StoppedEarly)
        assert (compiled.rule, compiled.time_s, compiled.peak_kv_occupancy, compiled.preemptions) == (
            python.rule, python.time_s, python.peak_kv_occupancy, python.preemptions)
        return
    for name in RESULT_FIELDS:
        np.testing.assert_array_equal(getattr(compiled, name), getattr(python, name), err_msg=name)
    for name in STEP_FIELDS:
        np.testing.assert_array_equal(getattr(compiled.steps, name), getattr(python.steps, name), err_msg=name)
    assert (compiled.itl_counts is None) == (python.itl_counts is None)
    if python.itl_counts is not None:
        np.testing.assert_array_equal(compiled.itl_counts.values_s, python.itl_counts.values_s)
        np.testing.assert_array_equal(compiled.itl_counts.counts, python.itl_counts.counts)
    assert repr(compiled.summary()) == repr(python.summary())  # NaN percentiles compare equal as text


workloads = workload_specs(max_requests=30, max_output=150, max_concurrency=8)


ENGINES = ["vllm==0.12.0", "vllm==0.15.1", "sglang"]


def sglang_options(engine: str, recv_interval: int) -> dict:
    """SGLang's receive interval (its other engines have none)."""
    return {"scheduler_recv_interval": recv_interval} if engine == "sglang" else {}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=workloads, engine=st.sampled_from(ENGINES), small=st.booleans(), front_end=st.booleans(),
       token_times=st.booleans(), stream_interval=st.sampled_from([1, 3]), pp=st.sampled_from([1, 1, 2, 4]),
       recv_interval=st.sampled_from([1, 1, 4]))
def test_compiled_loop_matches_the_python_loop(step_models, spec, engine, small, front_end, token_times,
                                               stream_interval, pp, recv_interval):
    workload = make_workload(*spec)
    dep, steps = step_model(step_models, engine, small, front_end, pp, stream_interval=stream_interval,
                            **sglang_options(engine, recv_interval))
    compiled, python = both(dep, steps, workload, token_times=token_times)
    assert_same(compiled, python)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=prefix_workload_specs(max_requests=30, max_concurrency=8), engine=st.sampled_from(ENGINES),
       small=st.booleans(), pp=st.sampled_from([1, 1, 2]), recv_interval=st.sampled_from([1, 4]))
def test_compiled_loop_matches_the_python_loop_with_a_prefix_cache(step_models, spec, engine, small, pp,
                                                                   recv_interval):
    """Hits, answers quoted by later prompts, eviction under KV pressure and preemption (vLLM) or retraction
    (SGLang): the same requests, cached tokens and steps."""
    workload = make_prefix_workload(*spec)
    dep, steps = step_model(step_models, engine, small, False, pp, **sglang_options(engine, recv_interval))
    compiled, python = both(dep, steps, workload)
    assert_same(compiled, python)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_shared_prefix_workload_hits_evicts_and_preempts_alike_in_both_loops(step_models, engine):
    dep, steps = step_model(step_models, engine, True, False)
    workload = build_workload("shared-prefix:4,8:1500:200:400", 200, qps=30, seed=2)
    compiled, python = both(dep, steps, workload)
    assert python.cached_tokens.sum() > 0 and python.preemptions.sum() > 0
    assert_same(compiled, python)


def test_prefix_cache_arrays_grown_from_two_nodes_give_the_same_run(step_models, monkeypatch):
    """The cache's arrays start with room for two nodes: the run grows them (refiling the children table) and
    compacts the eviction heap over and over, and still evicts what the Python cache evicts."""
    def tiny(segments):
        nodes, children, lru, path, cs = new_cache(segments)
        return nodes[:2].copy(), np.full((4, 4), -1, dtype=np.int64), lru[:4].copy(), path, cs

    monkeypatch.setattr(compiled_loop, "new_cache", tiny)
    grown = []
    monkeypatch.setattr(compiled_loop, "grown", lambda *arrays: grown.append(len(arrays[0])) or grow(*arrays))
    dep, steps = step_model(step_models, "vllm", True, False)
    workload = build_workload("shared-prefix:4,8:1500:200:400", 120, qps=30, seed=4)
    compiled, python = both(dep, steps, workload)
    assert len(grown) >= 3 and python.cached_tokens.sum() > 0 and python.preemptions.sum() > 0
    assert_same(compiled, python)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("metric", ["ttft", "tpot", "e2e"])
def test_a_stop_rule_stops_both_loops_at_the_same_event(step_models, metric, pp, engine):
    dep, steps = step_model(step_models, engine, False, False, pp)
    workload = build_workload("splitwise-conv", 400, qps=40, seed=3)
    median_ms = simulate(dep, workload, step_model=steps).summary()[f"{metric}_p50_ms"]
    rules = (StopRule(f"{metric}_p90", metric, median_ms, 30),)  # half the requests are over it
    compiled, python = both(dep, steps, workload, stop_rules=rules)
    assert isinstance(python, StoppedEarly)
    assert_same(compiled, python)


@pytest.mark.parametrize(("engine", "recv_interval"), [("vllm", 1), ("sglang", 1), ("sglang", 8)])
@pytest.mark.parametrize("pp", [1, 2])
def test_preemptions_and_progress_reports_match(step_models, pp, engine, recv_interval):
    """vLLM's preemptions and SGLang's retractions (with its receive interval or without)."""
    dep, steps = step_model(step_models, engine, True, False, pp, **sglang_options(engine, recv_interval))
    workload = build_workload("splitwise-conv", 300, qps=30, seed=1)
    reports = ([], [])
    runs = [simulate(dep, workload, step_model=steps, fast_forward_decodes=fast, progress=calls.append)
            for fast, calls in zip((True, False), reports)]
    assert runs[1].preemptions.sum() > 0
    assert_same(*runs)
    assert reports[0] == reports[1] and reports[0][-1] == len(workload)


@pytest.mark.parametrize("pp", [1, 2])
def test_tables_that_start_small_grow_to_the_same_results(step_models, monkeypatch, pp):
    """The loop's table of step-time parts and its gap table double as they fill; two slots to start with make
    them grow many times over a run."""
    monkeypatch.setattr(compiled_loop, "_TABLE_SLOTS", 2)
    monkeypatch.setattr(compiled_loop, "_GAP_SLOTS", 2)
    dep, steps = step_model(step_models, "vllm", False, False, pp)
    steps.loop_table = None  # not the table an earlier test's run left on the shared model
    workload = build_workload("splitwise-conv", 300, qps=30, seed=2)
    assert_same(*both(dep, steps, workload))
    assert len(steps.loop_table[0]) > 2


@given(st.one_of(st.floats(0, 1e7), st.integers(0, 10**6).map(lambda k: k + 0.5)))
def test_rounding_a_mixed_step_s_cached_tokens_is_python_s(value):
    """Equal chunks' cached tokens are rounded as ``round`` does, halves to the even integer."""
    assert compiled_loop._round_half_even(value) == round(value)


def test_a_later_run_starts_from_the_table_an_earlier_one_left(step_models):
    """The step-time parts a run gathered serve the next run of the same step model (a capacity search's probes)
    without asking Python again, with the same results as a fresh table."""
    dep, steps = step_model(step_models, "vllm", False, False, 2)
    workload = build_workload("splitwise-conv", 200, qps=20, seed=4)
    steps.loop_table = None
    fresh = simulate(dep, workload, step_model=steps)
    keys, values, entries = steps.loop_table
    kept = simulate(dep, workload, step_model=steps)
    assert steps.loop_table[0] is keys and steps.loop_table[2] == entries  # the same table, nothing added
    assert_same(kept, fresh)


def test_only_one_replica_takes_the_compiled_loop():
    """Several replicas keep the Python loop; pipeline stages, prompt identity and SGLang do not."""
    workload = build_workload("splitwise-conv", 10, qps=1)
    shared = build_workload("chat-shared-prefix", 10, qps=1)

    def fleet(engine="vllm", pp=1, replicas=1):
        dep = build_deployment(MODEL, GPU, Parallelism(1, pp), engine, estimator="roofline",
                               async_scheduling=False if engine == "vllm" else None)
        return [type("Replica", (), {"scheduler": dep.make_scheduler(), "pp": pp})() for _ in range(replicas)]

    assert compiled_loop.eligible(fleet(), workload)
    assert compiled_loop.eligible(fleet(), shared)
    assert not compiled_loop.eligible(fleet(replicas=2), workload)
    assert compiled_loop.eligible(fleet(pp=2), workload)
    assert compiled_loop.eligible(fleet("sglang"), workload)
    assert not compiled_loop.eligible(fleet("sglang", replicas=2), workload)
