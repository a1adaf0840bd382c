"""Serving fidelity: prefix caching, async scheduling and the API server, as a user relies on them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.hardware import get_gpu
from servesim.models import get_model
from servesim.models.parallel import Parallelism
from servesim.planner.search import completion_ratio
from servesim.serving.deployment import build_deployment
from servesim.serving.prefix_cache import PrefixCache
from servesim.serving.simulator import simulate
from servesim.serving.step_time import StepTimeModel
from servesim.workloads import Workload, build_workload
from servesim.workloads.prefix import UNIQUE, PromptSegments

MODEL = get_model("llama3-8b")
GPU = get_gpu("H100")
TP1 = Parallelism(1, 1)
#: Leaves a few thousand KV tokens beside llama3-8b's weights, so the pool runs short.
SMALL_MEMORY = 0.235


def deployment(engine="vllm", **overrides):
    return build_deployment(MODEL, GPU, TP1, engine, estimator="roofline", **overrides)


@pytest.fixture(scope="module")
def step_models():
    return {engine: StepTimeModel(deployment(engine)) for engine in ("vllm", "sglang")}


def workload(prompts, outputs, ids, arrivals, output_ids=None):
    """One segment per prompt with the given ids (UNIQUE for a prompt of its own)."""
    n = len(prompts)
    prefixes = PromptSegments(np.arange(n + 1), ids, prompts, output_ids if output_ids is not None else [UNIQUE] * n)
    return Workload("test", prompts, outputs, arrivals, prefixes=prefixes)


def prefill_tokens(result) -> np.ndarray:
    return result.steps.prefill_tokens


@pytest.mark.parametrize("engine, page", [("vllm", 16), ("sglang", 1)])
def test_a_prompt_seen_before_costs_only_its_uncached_tokens(step_models, engine, page):
    # The same 1,000-token prompt twice, the second long after the first finished: its prefill computes only
    # what the cache lacks, the engine's last page (vLLM recomputes the whole last block, SGLang one token).
    load = workload([1000, 1000], [4, 4], [7, 7], [0.0, 10.0])
    result = simulate(deployment(engine), load, step_model=step_models[engine])
    prefills = prefill_tokens(result)[prefill_tokens(result) > 0]
    assert prefills[0] == 1000
    assert prefills[1] == 1000 - (999 // page) * page
    assert result.summary()["prefix_cache_hit_ratio"] == pytest.approx((999 // page) * page / 2000)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_without_the_cache_or_prompt_identity_nothing_changes(step_models, engine):
    base = build_workload("splitwise-conv", 150, qps=6.0, seed=3)
    n = len(base)
    shared = PromptSegments(np.arange(n + 1), np.zeros(n, np.int64), base.prompt_tokens, np.full(n, UNIQUE))
    repeated = dataclasses.replace(base, prefixes=None)
    plain = simulate(deployment(engine), repeated, step_model=step_models[engine])
    off = simulate(deployment(engine, enable_prefix_caching=False), dataclasses.replace(base, prefixes=shared),
                   step_model=step_models[engine])
    np.testing.assert_array_equal(off.token_times_s, plain.token_times_s)
    np.testing.assert_array_equal(off.steps.kv_used_tokens, plain.steps.kv_used_tokens)


def test_prompts_of_their_own_never_hit(step_models):
    base = build_workload("fixed:600:20", 40, qps=8.0, seed=1)
    n = len(base)
    unique = PromptSegments(np.arange(n + 1), np.full(n, UNIQUE), base.prompt_tokens, np.full(n, UNIQUE))
    with_ids = simulate(deployment(), dataclasses.replace(base, prefixes=unique), step_model=step_models["vllm"])
    without = simulate(deployment(), base, step_model=step_models["vllm"])
    np.testing.assert_array_equal(with_ids.token_times_s, without.token_times_s)


def test_cached_prefixes_are_evicted_under_kv_pressure(step_models):
    # Distinct shared prefixes, more than a small pool holds: the oldest leave the cache, so a prefix seen long
    # ago is computed again, while one seen just before still hits.
    dep = deployment(memory_fraction=SMALL_MEMORY)
    capacity = dep.memory.kv_tokens
    prompts = [1024] * 40 + [1024, 1024]
    ids = list(range(40)) + [0, 39]
    arrivals = np.arange(42) * 5.0  # one at a time
    result = simulate(dep, workload(prompts, [2] * 42, ids, arrivals), step_model=step_models["vllm"])
    assert 40 * 1024 > capacity
    prefills = prefill_tokens(result)[prefill_tokens(result) > 0]
    assert prefills[40] == 1024  # prefix 0 was evicted
    assert prefills[41] < 1024  # prefix 39 is still cached


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 300)), min_size=1, max_size=12), st.integers(1, 64))
def test_pool_accounting_adds_up(segments, need):
    """Whatever is inserted, referenced, released and evicted, the cache's units add up."""
    cache = PrefixCache(16, 16)
    ids, tokens = [s[0] for s in segments], [s[1] for s in segments]
    path, units = cache.insert([], ids, tokens)
    assert units == cache.cached_units == sum(node.units for node in path)
    assert cache.evictable_units == 0
    cache.release(path)
    assert cache.evictable_units == cache.cached_units
    matched_path, matched = cache.match(ids, tokens)
    assert matched == sum(tokens)
    freed = cache.evict(need)
    assert freed >= min(need, units) and cache.cached_units == units - freed == cache.evictable_units


def test_a_cyclic_prompt_set_that_fits_never_saturates(step_models):
    # 100 prompts of 2,000 tokens cycled at a rate where prefilling every prompt in full would fall behind, but
    # prefilling only their uncached ends does not: with the cache the server keeps up.
    rate = 40.0
    n = 1000
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    ids = np.arange(n) % 100
    load = workload(np.full(n, 2000), np.full(n, 16), ids, arrivals)
    cached = simulate(deployment(), load, step_model=step_models["vllm"])
    uncached = simulate(deployment(enable_prefix_caching=False), load, step_model=step_models["vllm"])
    assert completion_ratio(cached) > 0.95 > 0.8 > completion_ratio(uncached)
    assert np.percentile(cached.ttft_s[n // 2:], 99) < 0.1  # once the cache is warm, no queue builds


def test_the_next_turn_hits_the_previous_turn_and_its_answer(step_models):
    # Turn 2's prompt is turn 1's prompt, turn 1's answer and a new message: all but the message is cached.
    prefixes = PromptSegments([0, 1, 4], [5, 5, 9, UNIQUE], [800, 800, 200, 100], [9, UNIQUE])
    load = Workload("turns", [800, 1100], [200, 4], [0.0, 30.0], prefixes=prefixes)
    result = simulate(deployment(), load, step_model=step_models["vllm"])
    prefills = prefill_tokens(result)[prefill_tokens(result) > 0]
    assert prefills[1] <= 100 + 16


def test_async_scheduling_admits_an_arrival_one_step_later(step_models):
    # A request arriving while a long decode step runs: the synchronous scheduler forms the next step when that one
    # ends and takes it; with async scheduling the next step was formed as that one started, so it waits one more.
    background = 8
    prompts = [64] * background + [64]
    arrivals = [0.0] * background + [0.5]
    load = Workload("late", prompts, [2000] * background + [4], arrivals)
    first_token = {}
    for async_scheduling in (False, True):
        dep = deployment(async_scheduling=async_scheduling)
        result = simulate(dep, load, step_model=StepTimeModel(dep, overhead=dep.release.overhead.engine_only()))
        steps = result.steps
        arrival_step = int(np.searchsorted(steps.end_s, 0.5))  # the step running when it arrives
        admitted = int(np.argmax(steps.prefill_tokens[arrival_step + 1:] > 0)) + arrival_step + 1
        first_token[async_scheduling] = admitted - arrival_step
    assert first_token == {False: 1, True: 2}


def test_async_scheduling_hides_the_host_behind_the_gpu(step_models):
    load = build_workload("fixed:128:256", 8, concurrency=8)
    tpot = {}
    for async_scheduling in (False, True):
        dep = deployment(async_scheduling=async_scheduling)
        tpot[async_scheduling] = simulate(dep, load, step_model=StepTimeModel(dep)).summary()["tpot_mean_ms"]
    overhead_ms = dep.release.overhead.step_overhead_us(8, 1) / 1e3
    assert tpot[False] - tpot[True] == pytest.approx(overhead_ms, rel=0.05)


def test_the_api_server_spreads_a_burst_of_requests_over_time():
    # Four requests sent at once reach the engine one API-server turn apart, and their TTFT (from the send)
    # includes that wait; without API-server costs they all reach it at once.
    load = build_workload("fixed:512:8", 4, arrival="burst")
    dep = deployment()
    costs = dataclasses.replace(dep.release.overhead.engine_only(), request_us=1000.0, per_prompt_token_us=1.0)
    spread = simulate(dep, load, step_model=StepTimeModel(dep, overhead=costs))
    turn_s = (1000.0 + 512 * 1.0) * 1e-6
    np.testing.assert_allclose(np.sort(spread.first_scheduled_s)[0], turn_s)
    assert (np.sort(spread.first_scheduled_s) >= turn_s * np.arange(1, 5) - 1e-12).all()
    at_once = simulate(dep, load, step_model=StepTimeModel(dep, overhead=dep.release.overhead.engine_only()))
    assert (at_once.first_scheduled_s == 0).all()


@pytest.mark.parametrize("prompt", [1024, 7000])
def test_a_lone_request_pays_the_api_server_per_prompt_token(step_models, prompt):
    # The API server tokenises a prompt before the engine sees it, so a request alone on the server gains exactly
    # its API-server time and the request latency over the engine driven in-process.
    dep = deployment()
    overhead = dataclasses.replace(dep.release.overhead, per_prompt_token_us=6.0)
    load = build_workload(f"fixed:{prompt}:4", 1, arrival="burst")
    served = simulate(dep, load, step_model=StepTimeModel(dep, overhead=overhead)).summary()["ttft_mean_ms"]
    in_process = simulate(dep, load, step_model=StepTimeModel(dep, overhead=overhead.engine_only())).summary()
    expected_ms = (overhead.front_end_us(prompt) + overhead.request_latency_us) / 1e3
    assert served - in_process["ttft_mean_ms"] == pytest.approx(expected_ms, rel=1e-9)


def test_request_latency_adds_to_every_request_without_queueing():
    # A burst of requests all reach the engine one latency after their send, none waits for another, and one
    # request alone gains exactly that latency in TTFT and E2E.
    dep = deployment()
    latency = dataclasses.replace(dep.release.overhead.engine_only(), request_latency_us=7000.0)
    none = dep.release.overhead.engine_only()
    burst = simulate(dep, build_workload("fixed:512:8", 4, arrival="burst"),
                     step_model=StepTimeModel(dep, overhead=latency))
    np.testing.assert_allclose(burst.first_scheduled_s, 7e-3)
    one = build_workload("fixed:512:8", 1, arrival="burst")
    base = simulate(dep, one, step_model=StepTimeModel(dep, overhead=none)).summary()
    late = simulate(dep, one, step_model=StepTimeModel(dep, overhead=latency)).summary()
    assert late["ttft_mean_ms"] == pytest.approx(base["ttft_mean_ms"] + 7.0)
    assert late["e2e_mean_ms"] == pytest.approx(base["e2e_mean_ms"] + 7.0)


def test_under_async_scheduling_a_late_request_joins_the_step_after_next_from_its_arrival():
    # The host formed the next step before the request reached the engine, whenever the client sent it: at light
    # load the latency moves the mean TTFT by about itself, not by nothing.
    dep = deployment(async_scheduling=True)
    load = build_workload("fixed:256:64", 200, qps=4)
    ttft_ms = {}
    for latency_us in (0.0, 6000.0):
        costs = dataclasses.replace(dep.release.overhead, request_latency_us=latency_us)
        ttft_ms[latency_us] = simulate(dep, load, step_model=StepTimeModel(dep, overhead=costs)).summary()[
            "ttft_mean_ms"]
    assert ttft_ms[6000.0] - ttft_ms[0.0] == pytest.approx(6.0, rel=0.25)


def test_async_scheduling_hides_host_time_but_not_device_time():
    # Under async scheduling a step lasts max(host, GPU): host time shorter than the GPU's is hidden, GPU time the
    # kernels leave out (device_step_us) is not.
    load = build_workload("fixed:128:128", 8, concurrency=8)
    dep = deployment(async_scheduling=True)
    base = dep.release.overhead.engine_only()
    none = {"step_us": 0.0, "per_seq_us": 0.0, "device_step_us": 0.0, "device_per_seq_us": 0.0}

    def tpot_ms(**terms):
        costs = dataclasses.replace(base, **{**none, **terms})
        return simulate(dep, load, step_model=StepTimeModel(dep, overhead=costs)).summary()["tpot_mean_ms"]

    gpu_ms = tpot_ms()
    assert tpot_ms(step_us=gpu_ms * 500) == pytest.approx(gpu_ms, rel=1e-9)  # host at half the GPU's step
    assert tpot_ms(device_step_us=1000.0) == pytest.approx(gpu_ms + 1.0, rel=1e-6)


def test_the_launch_command_carries_what_the_prediction_assumed():
    llama70 = get_model("llama3-70b")
    vllm = build_deployment(llama70, GPU, Parallelism(4, 2), "vllm", enable_prefix_caching=False, max_num_seqs=128)
    command = vllm.launch_command()
    assert command.startswith("vllm serve meta-llama/Meta-Llama-3-70B --tensor-parallel-size 4 "
                              "--pipeline-parallel-size 2")
    assert "--max-num-seqs 128" in command and "--no-enable-prefix-caching" in command
    assert "async" not in command  # vLLM turns async scheduling off with PP by itself
    sglang = build_deployment(llama70, GPU, Parallelism(4, 1), "sglang", async_scheduling=False).launch_command()
    assert sglang.startswith("python -m sglang.launch_server --model-path meta-llama/Meta-Llama-3-70B --tp-size 4")
    assert "--disable-overlap-schedule" in sglang and "--disable-radix-cache" not in sglang
