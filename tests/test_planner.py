"""The SLO capacity planner as a library: the rate search, replicas, cost, ranking and infeasible inputs."""

import dataclasses
import math
import os

import numpy as np
import pytest

from servesim.hardware import get_gpu
from servesim.models import get_model
from servesim.models.parallel import Parallelism
from servesim.planner.executor import LocalExecutor
from servesim.planner import search, step_store
from servesim.planner.plan import (
    PlanRequest,
    build_plan,
    candidate_layouts,
    cost_option,
    plan_payload,
    run_plan,
    search_options,
)
from servesim.planner.search import OptionTask, Probe, _crossing_load, search_capacity, step_model
from servesim.planner.slo import Slo
from servesim.serving import compiled_loop, step_cache
from servesim.serving.compiled_loop import table_rows
from servesim.serving.deployment import build_deployment
from servesim.serving.simulator import simulate
from servesim.workloads import build_workload

MODEL = get_model("llama3-8b")
H100 = get_gpu("H100")
WORKLOAD = build_workload("fixed:512:48", 300, qps=1.0, seed=0)


def task(tpot_ms: float = 10.0, gpu=H100, par=Parallelism(1, 1), mode="qps", workload=WORKLOAD, model=MODEL,
         tolerance=0.05, ttft_ms: float | None = None) -> OptionTask:
    slos = (Slo("tpot", 90, tpot_ms),) + ((Slo("ttft", 90, ttft_ms),) if ttft_ms else ())
    return OptionTask(build_deployment(model, gpu, par, estimator="roofline"), workload, slos, mode, tolerance)


@pytest.fixture(autouse=True)
def store(tmp_path, monkeypatch):
    """Plans keep their step times in a folder of the test's own."""
    monkeypatch.setenv("SERVESIM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def unloaded_tpot_ms() -> float:
    """TPOT of the workload's requests one at a time on one H100: the SLOs below are set relative to it, so that
    the tests hold whatever the step-time model predicts."""
    alone = build_workload("fixed:512:48", 20, concurrency=1, seed=0)
    par = Parallelism(1, 1)
    return simulate(build_deployment(MODEL, H100, par, estimator="roofline"), alone).summary()["tpot_p90_ms"]


@pytest.fixture(scope="module")
def searched(unloaded_tpot_ms):
    """Capacities of one option under a tight, a medium and a loose TPOT SLO."""
    return [search_capacity(task(factor * unloaded_tpot_ms)) for factor in (1.1, 1.5, 2.5)]


def test_capacity_grows_as_slos_loosen(searched):
    capacities = [r.capacity.load for r in searched]
    assert all(r.status == "ok" for r in searched)
    assert capacities == sorted(capacities) and capacities[-1] > 1.5 * capacities[0]


def test_search_brackets_the_capacity_within_the_tolerance(searched):
    for result in searched:
        assert result.capacity.meets_slos and not result.above.meets_slos
        assert result.capacity.load < result.above.load <= result.capacity.load * 1.05
        # every probe below the capacity met the SLOs, every one above failed them (latency grows with load)
        assert all(p.meets_slos == (p.load <= result.capacity.load) for p in result.probes)
    assert searched[0].binding == "tpot"


def probe_at(load: float, tpot_ratio: float | None) -> Probe:
    """A probe of a TPOT p90 ≤ 10 ms SLO at ``tpot_ratio`` of the limit; None: the run stopped early."""
    value = math.nan if tpot_ratio is None else 10.0 * tpot_ratio
    return Probe(load=load, meets_slos=tpot_ratio is not None and tpot_ratio <= 1, sustained=True,
                 slo_values_ms=(value,), latency_ms={}, request_rate_per_s=load, completion_ratio=1.0,
                 output_tokens_per_s=0.0, peak_kv_occupancy=0.0, preemptions=0,
                 stopped_by=None if tpot_ratio is not None else "tpot_p90")


@pytest.mark.parametrize("par", [Parallelism(1, 1), Parallelism(1, 2)])
def test_searching_with_every_engine_step_scheduled_finds_the_same_probes(monkeypatch, unloaded_tpot_ms, par):
    """The simulator's fast path through decode stretches (servesim/serving/fast_forward.py) is what every search
    runs; the reference path schedules each step. A search on either gives the same probes, to the last bit."""
    fast = search_capacity(task(1.5 * unloaded_tpot_ms, par=par))

    def stepping(*args, **kwargs):
        return simulate(*args, fast_forward_decodes=False, **kwargs)

    monkeypatch.setattr(search, "simulate", stepping)
    reference = search_capacity(task(1.5 * unloaded_tpot_ms, par=par))
    assert repr(reference) == repr(fast)  # NaN percentiles of runs stopped early compare equal as text
    assert len(fast.probes) >= 3


def test_splits_aim_where_the_slo_ratio_reaches_its_limit():
    slos = (Slo("tpot", 90, 10.0),)
    # between the bracket's ends: the ratio doubles from load 2 to 8, log-linearly, so it reaches 1 at 4
    bracketed = {2.0: probe_at(2.0, 0.5), 8.0: probe_at(8.0, 2.0)}
    assert _crossing_load(bracketed, 2.0, 8.0, slos) == pytest.approx(4.0)
    # the failing end stopped early: extrapolated from the two highest passing loads
    stopped = {1.0: probe_at(1.0, 0.25), 2.0: probe_at(2.0, 0.5), 9.0: probe_at(9.0, None)}
    assert _crossing_load(stopped, 2.0, 9.0, slos) == pytest.approx(4.0)
    # one passing load and no percentiles above it: nothing to aim at (the split is the midpoint)
    assert _crossing_load({2.0: probe_at(2.0, 0.5), 9.0: probe_at(9.0, None)}, 2.0, 9.0, slos) is None
    # a ratio that barely rises crosses 1 far beyond the bracket (once an overflow): aimed at its top
    flat = {1.0: probe_at(1.0, 0.5), 2.0: probe_at(2.0, 0.5 * (1 + 1e-12)), 9.0: probe_at(9.0, None)}
    assert _crossing_load(flat, 2.0, 9.0, slos) == pytest.approx(9.0)


def test_replicas_times_capacity_covers_the_target(searched):
    result = searched[1]
    capacity = result.capacity.load
    for target in (0.3 * capacity, capacity, 2 * capacity, 7.01 * capacity, 1000.0):
        option = cost_option(result, target, None)
        assert option.replicas * capacity >= target
        assert (option.replicas - 1) * capacity < target
        assert option.total_gpus == option.replicas
        assert option.usd_per_hour == pytest.approx(option.replicas * H100.price_usd_per_gpu_hour)
    alone = cost_option(result, None, None)
    tokens_per_hour = alone.output_tokens_per_s_per_gpu * 3600
    assert alone.usd_per_million_output_tokens * tokens_per_hour / 1e6 == pytest.approx(H100.price_usd_per_gpu_hour)


def test_gpu_budget_marks_options_over_it_without_dropping_them(searched):
    result = searched[1]
    target = 3.5 * result.capacity.load
    assert cost_option(result, target, 4).status == "ok"
    over = cost_option(result, target, 3)
    assert over.status == "over_budget" and over.replicas == 4
    plan = build_plan(_request(target=target, gpu_budget=3), [result])
    assert [o.status for o in plan.options] == ["over_budget"]
    assert plan.recommended is None and "raise --gpu-budget to 4" in plan.infeasible


def _request(**fields) -> PlanRequest:
    base = PlanRequest(model=MODEL, gpus=(H100,), engine="vllm", workload=WORKLOAD, slos=(Slo("tpot", 90, 10.0),),
                       estimator="roofline")
    return dataclasses.replace(base, **fields)


def _priced(result, usd_per_gpu_hour: float):
    gpu = result.task.gpu.with_price(usd_per_gpu_hour, "2026-01-01", "test")
    deployment = dataclasses.replace(result.task.deployment, gpu=gpu)
    return dataclasses.replace(result, task=dataclasses.replace(result.task, deployment=deployment))


def test_ranking_follows_cost_and_the_explanation_compares_the_runner_up(searched):
    slow, fast = searched[0], searched[2]  # the same option searched under two SLOs: different capacities
    target = 2 * fast.capacity.load
    for slow_price, fast_price in ((1.0, 1.0), (0.1, 1.0)):
        options = [_priced(slow, slow_price), _priced(fast, fast_price)]
        plan = build_plan(_request(target=target), options)
        ranked = [o for o in plan.options if o.rank]
        assert [o.rank for o in ranked] == [1, 2]
        assert ranked[0].usd_per_hour <= ranked[1].usd_per_hour
        assert plan.explanation.startswith(f"{ranked[0].label} is the cheapest option to serve {target:g} req/s")
        assert "per token than the next option" in plan.explanation
    # with no target, options rank by $ per 1M output tokens
    plan = build_plan(_request(), [_priced(slow, 1.0), _priced(fast, 3.0)])
    costs = [o.usd_per_million_output_tokens for o in plan.options]
    assert costs == sorted(costs)


def test_an_slo_tighter_than_the_unloaded_latency_is_reported_with_what_would_work(unloaded_tpot_ms):
    limit_ms = unloaded_tpot_ms / 2
    result = search_capacity(task(tpot_ms=limit_ms))
    assert result.status == "slo_unmet" and result.capacity is None
    assert result.unloaded_ms[0] == pytest.approx(unloaded_tpot_ms, rel=0.01)
    plan = build_plan(_request(slos=(Slo("tpot", 90, limit_ms),)), [result])
    assert plan.recommended is None
    assert "tighter than the unloaded latency" in plan.infeasible and "--tpot-p90" in plan.infeasible


def test_a_model_that_does_not_fit_is_reported_with_a_gpu_that_holds_it():
    model = get_model("llama3-70b")
    result = search_capacity(task(model=model, gpu=H100, par=Parallelism(1, 1)))
    assert result.status == "no_fit" and result.binding == "memory" and not result.probes
    plan = build_plan(_request(model=model), [result])
    assert "fits no layout tried" in plan.infeasible and "it fits" in plan.infeasible


def test_concurrency_search_finds_a_whole_number_of_clients(unloaded_tpot_ms):
    closed = build_workload("fixed:512:48", 300, concurrency=1, seed=0)
    result = search_capacity(task(1.5 * unloaded_tpot_ms, mode="concurrency", workload=closed))
    assert result.status == "ok"
    capacity, above = result.capacity.load, result.above.load
    assert capacity == int(capacity) and above == int(above)
    assert above - capacity <= max(1, math.floor(0.05 * capacity))
    assert result.capacity.request_rate_per_s > 0


def test_concurrency_search_stops_at_every_request_in_flight(unloaded_tpot_ms):
    """More clients than requests change nothing, so a search whose SLOs still hold there reports that bound and
    how to go past it, not a client count from further bracketing."""
    closed = build_workload("fixed:512:48", 40, concurrency=1, seed=0)
    result = search_capacity(task(100 * unloaded_tpot_ms, mode="concurrency", workload=closed))
    assert result.status == "ok" and result.binding == "none"
    assert result.capacity.load == 40 and max(p.load for p in result.probes) == 40
    assert "all 40 requests in flight at once" in result.note and "-n" in result.note


def test_layouts_are_those_that_divide_a_node():
    model = get_model("llama3-70b")
    layouts = {str(p) for p in candidate_layouts(model, H100, None, None)}
    assert layouts == {"TP1", "TP1xPP2", "TP1xPP4", "TP1xPP8", "TP2", "TP2xPP2", "TP2xPP4", "TP4", "TP4xPP2", "TP8"}
    assert [str(p) for p in candidate_layouts(model, H100, 4, None)] == ["TP4", "TP4xPP2"]


def test_the_ray_executor_gives_the_local_results():
    ray = pytest.importorskip("ray")
    from servesim.planner.executor import RayExecutor

    request = _request(gpus=(H100, get_gpu("A100")), tp=1, pp=1, target=50.0)
    local = plan_payload(run_plan(request, LocalExecutor(jobs=1)), "roofline")
    executor = RayExecutor(jobs=2)  # starts a local Ray instance with 2 CPUs
    try:
        remote = plan_payload(run_plan(request, executor), "roofline")
    finally:
        executor.close()
    assert not ray.is_initialized()
    assert remote == local
    assert [o["gpu"] for o in local["options"]] and local["recommendation"] is not None


@pytest.mark.parametrize("workers", [1, 2, 8, 64])
def test_search_groups_share_gpu_and_tp_and_keep_every_worker_busy(workers):
    from servesim.planner.plan import _search_groups

    model = get_model("llama3-70b")
    a100 = get_gpu("A100")
    tasks = [task(gpu=gpu, par=par, model=model) for gpu in (H100, a100)
             for par in candidate_layouts(model, gpu, None, None)]
    groups = _search_groups(tasks, workers)
    assert sorted(i for group in groups for i in group) == list(range(len(tasks)))
    assert all(len({(tasks[i].gpu.name, tasks[i].par.tp) for i in group}) == 1 for group in groups)
    assert len(groups) >= min(workers, len(tasks))
    if workers == 1:
        assert len(groups) == 8  # TP 1, 2, 4 and 8 on each GPU


def test_a_later_plan_times_steps_from_the_memos_an_earlier_one_kept(store, monkeypatch, unloaded_tpot_ms):
    spans = []
    predict = step_cache.decode_span
    monkeypatch.setattr(step_cache, "decode_span", lambda *args: spans.append(args) or predict(*args))
    (first,) = search_options([task(1.5 * unloaded_tpot_ms)])
    (path,) = store.rglob("*.npz")
    predicted = len(spans)
    (again,) = search_options([task(1.5 * unloaded_tpot_ms)])
    assert repr(again) == repr(first)  # NaN percentiles of runs stopped early compare equal as text
    assert len(spans) == predicted
    # other SLOs search other loads, which meet few steps the first plan did not
    (other,) = search_options([task(1.2 * unloaded_tpot_ms)])
    assert other.capacity.load < first.capacity.load
    assert len(spans) - predicted < predicted / 2
    assert [p.name for p in store.rglob("*.npz")] == [path.name]


def test_stored_memos_read_back_exactly(unloaded_tpot_ms):
    steps = step_model(task(1.5 * unloaded_tpot_ms))
    search_capacity(task(1.5 * unloaded_tpot_ms), steps)
    memos = {name: getattr(steps, name) for name in step_store.MEMOS}
    assert all(memos.values())
    keys, values = table_rows(steps.loop_table)
    assert len(keys) == steps.loop_table[2] > 0
    read = step_store.decode(step_store.encode({**memos, "loop_table": (keys, values)}))
    assert {name: read[name] for name in step_store.MEMOS} == memos
    assert np.array_equal(read["loop_table"][0], keys) and np.array_equal(read["loop_table"][1], values)


def test_a_run_from_a_stored_loop_table_hands_nothing_back_and_gives_the_same_result(store, monkeypatch,
                                                                                    unloaded_tpot_ms):
    first = step_model(task(1.5 * unloaded_tpot_ms))
    with step_store.kept_step_times(first):
        result = search_capacity(task(1.5 * unloaded_tpot_ms), first)
    handed_back = []
    entries = compiled_loop._entries
    monkeypatch.setattr(compiled_loop, "_entries", lambda *args: handed_back.append(args) or entries(*args))
    again = step_model(task(1.5 * unloaded_tpot_ms))
    with step_store.kept_step_times(again):
        assert again.loop_table[2] == first.loop_table[2]
        assert repr(search_capacity(task(1.5 * unloaded_tpot_ms), again)) == repr(result)
    assert not handed_back


def test_memos_are_kept_per_deployment_whatever_its_price():
    steps = step_model(task())
    priced = step_model(dataclasses.replace(task(), deployment=dataclasses.replace(
        task().deployment, gpu=H100.with_price(0.5, "2026-01-01", "test"))))
    assert step_store.timing_key(priced) == step_store.timing_key(steps)
    assert step_store.timing_key(step_model(task(gpu=get_gpu("A100")))) != step_store.timing_key(steps)
    assert step_store.timing_key(step_model(task(par=Parallelism(1, 2)))) != step_store.timing_key(steps)


def test_an_unreadable_store_costs_time_only(store, monkeypatch):
    steps = step_model(task())
    path = store / f"step-times-{step_store.code_fingerprint()}" / f"{step_store.timing_key(steps)}.npz"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not an npz file")
    (result,) = search_options([task()])
    assert result.status == "ok" and step_store.read_memos(path)["decode_spans"]  # rewritten
    monkeypatch.setenv("SERVESIM_CACHE_DIR", "")
    assert step_store.store_dir() is None


def test_a_new_code_version_keeps_the_newest_others_and_removes_the_rest(store):
    # Folders of other fingerprints, written one after another: the newest KEEP_OTHERS survive a new version.
    others = [store / f"step-times-{i:016x}" for i in range(step_store.KEEP_OTHERS + 2)]
    for age, folder in enumerate(others):
        folder.mkdir(parents=True)
        (folder / "stale.npz").write_bytes(b"")
        os.utime(folder, (1_000_000 + age, 1_000_000 + age))
    step_store.save_memos(step_model(task()))
    kept = {p.name for p in store.iterdir()}
    assert kept == {f"step-times-{step_store.code_fingerprint()}",
                    *(folder.name for folder in others[-step_store.KEEP_OTHERS:])}
