"""The serving simulator: invariants over random workloads, engine policies, routers, metrics and the CLI."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.errors import ServesimError
from servesim.hardware import get_gpu
from servesim.models import get_model
from servesim.models.parallel import Parallelism
from servesim.serving.deployment import build_deployment
from servesim.serving.simulator import simulate
from servesim.serving.state import STEP_LOG_COLUMNS, StepLog
from servesim.serving.step_time import StepTimeModel
from servesim.serving.stop import StopRule, StoppedEarly, violations_to_fail
from servesim.workloads import build_workload

from workload_strategies import make_workload, workload_specs

MODEL = get_model("llama3-8b")
GPU = get_gpu("H100")
TP1 = Parallelism(1, 1)
#: Leaves a few thousand KV tokens beside llama3-8b's 16 GB of weights, so memory runs short.
SMALL_MEMORY = 0.235


def deployment(engine="vllm", par=TP1, **overrides):
    return build_deployment(MODEL, GPU, par, engine, estimator="roofline", **overrides)


@pytest.fixture(scope="module")
def step_models():
    return {engine: StepTimeModel(deployment(engine)) for engine in ("vllm", "sglang")}


def run(step_models, engine, workload, replicas=1, router="round_robin", fast_forward_decodes=True, **overrides):
    served = deployment(engine, **overrides)
    steps = step_models[engine]
    if steps.deployment.timing_identity() != served.timing_identity():  # e.g. vLLM's graphs follow max_num_seqs
        steps = StepTimeModel(served)
    return simulate(served, workload, step_model=steps, replicas=replicas, router=router,
                    fast_forward_decodes=fast_forward_decodes)


workloads = workload_specs(max_requests=24, max_output=120, max_concurrency=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=workloads, engine=st.sampled_from(["vllm", "sglang"]), small=st.booleans(),
       replicas=st.integers(1, 2))
def test_invariants_hold_for_any_workload(step_models, spec, engine, small, replicas):
    prompts, outputs, arrivals, concurrency = spec
    workload = make_workload(prompts, outputs, arrivals, concurrency)
    overrides = {"memory_fraction": SMALL_MEMORY, "max_num_batched_tokens": 1024} if small else {}
    result = run(step_models, engine, workload, replicas=replicas, **overrides)

    # Every request is served exactly once and gets exactly its output tokens.
    assert len(result) == len(workload)
    np.testing.assert_array_equal(np.diff(result.token_offsets), workload.output_tokens)
    np.testing.assert_array_equal(result.prompt_tokens, workload.prompt_tokens)
    # Causality: sent <= scheduled <= first token <= last token; tokens in time order.
    assert (result.first_scheduled_s >= result.issue_s - 1e-12).all()
    assert (result.first_token_s > result.first_scheduled_s).all()
    assert (result.ttft_s <= result.e2e_s).all()
    for i in range(len(result)):
        assert (np.diff(result.token_times_s[result.token_offsets[i]:result.token_offsets[i + 1]]) >= 0).all()
    # KV in use never exceeds capacity; each replica's clock never goes back.
    steps = result.steps
    assert (steps.kv_used_tokens <= steps.kv_capacity_tokens).all()
    assert (steps.end_s > steps.start_s).all()
    for r in range(replicas):
        assert (np.diff(steps.start_s[steps.replica == r]) >= 0).all()
    # Closed loop: never more requests in flight than clients.
    if concurrency:
        assert max_in_flight(result) <= concurrency
    # Same inputs, same result; stepping every decode through the scheduler too.
    again = run(step_models, engine, workload, replicas=replicas, **overrides)
    np.testing.assert_array_equal(again.token_times_s, result.token_times_s)
    stepped = run(step_models, engine, workload, replicas=replicas, fast_forward_decodes=False, **overrides)
    np.testing.assert_array_equal(stepped.token_times_s, result.token_times_s)
    np.testing.assert_array_equal(stepped.steps.kv_used_tokens, result.steps.kv_used_tokens)


def max_in_flight(result) -> int:
    events = sorted([(t, 1) for t in result.issue_s] + [(t, -1) for t in result.finish_s], key=lambda e: (e[0], e[1]))
    return int(np.max(np.cumsum([d for _, d in events])))


def test_vllm_respects_token_budget_and_max_num_seqs(step_models):
    workload = build_workload("fixed:3000:20", 40, arrival="burst")
    result = run(step_models, "vllm", workload, max_num_batched_tokens=2048, max_num_seqs=8)
    assert result.steps.num_tokens.max() == 2048  # budget filled by chunks, never exceeded
    assert result.steps.num_requests.max() <= 8


def test_vllm_mixes_decodes_with_chunked_prefill(step_models):
    workload = build_workload("fixed:3000:50", 10, arrival="burst")
    steps = run(step_models, "vllm", workload, max_num_batched_tokens=2048).steps
    assert ((steps.num_decodes > 0) & (steps.prefill_tokens > 0)).any()


def test_sglang_runs_prefill_and_decode_batches_separately(step_models):
    workload = build_workload("fixed:3000:50", 10, arrival="burst")
    steps = run(step_models, "sglang", workload, max_num_batched_tokens=2048).steps
    assert not ((steps.num_decodes > 0) & (steps.prefill_tokens > 0)).any()
    assert steps.prefill_tokens.max() <= 2048
    assert ((steps.num_decodes > 0) & (steps.prefill_tokens == 0)).any()


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_short_memory_preempts_and_still_finishes(step_models, engine):
    workload = build_workload("fixed:1500:600", 24, arrival="burst")
    result = run(step_models, engine, workload, memory_fraction=SMALL_MEMORY)
    assert result.preemptions.sum() > 0
    np.testing.assert_array_equal(np.diff(result.token_offsets), workload.output_tokens)
    roomy = run(step_models, engine, workload)
    assert roomy.preemptions.sum() == 0


def test_sglang_reserves_memory_for_future_tokens(step_models):
    """With the new-token ratio, SGLang admits fewer requests at once than the prompts alone would allow."""
    workload = build_workload("fixed:1000:1000", 30, arrival="burst")
    result = run(step_models, "sglang", workload, memory_fraction=SMALL_MEMORY)
    capacity = result.steps.kv_capacity_tokens
    first_prefill = result.steps.num_requests[0]
    assert first_prefill < capacity // 1000


def test_closed_loop_concurrency_sets_the_batch(step_models):
    workload = build_workload("fixed:256:64", 64, concurrency=4)
    result = run(step_models, "vllm", workload)
    assert max_in_flight(result) == 4
    assert result.steps.num_requests.max() == 4


def test_routers_spread_requests(step_models):
    workload = build_workload("fixed:512:32", 40, qps=50, seed=1)
    rr = run(step_models, "vllm", workload, replicas=4, router="round_robin")
    np.testing.assert_array_equal(rr.replica, np.arange(40) % 4)
    lo = run(step_models, "vllm", workload, replicas=4, router="least_outstanding")
    assert np.bincount(lo.replica, minlength=4).min() > 0


def test_more_replicas_lower_latency_under_load(step_models):
    workload = build_workload("splitwise-conv", 300, qps=40, seed=0)
    one = run(step_models, "vllm", workload).summary()
    two = run(step_models, "vllm", workload, replicas=2, router="least_outstanding").summary()
    assert two["e2e_mean_ms"] < one["e2e_mean_ms"]


def test_pipeline_keeps_micro_batches_in_flight():
    par = Parallelism(1, 2)
    workload = build_workload("fixed:512:64", 32, concurrency=32)
    steps = simulate(deployment("vllm", par), workload).steps
    assert (steps.start_s[1:] < steps.end_s[:-1]).any()  # a step starts before the previous one ends


STEP_COLUMNS = ("replica", "start_s", "end_s", "num_requests", "num_tokens", "prefill_tokens", "num_decodes",
                "kv_used_tokens")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("closed", [False, True])
@pytest.mark.parametrize("small", [False, True])
def test_fast_forward_gives_exactly_the_stepped_result(engine, pp, closed, small):
    """Running steady decode stretches in one go changes nothing: token times, steps, KV and preemptions."""
    par = Parallelism(1, pp)
    overrides = {"memory_fraction": SMALL_MEMORY, "max_num_batched_tokens": 1024} if small else {}
    dep = deployment(engine, par, **overrides)
    step_model = StepTimeModel(dep)
    workload = (build_workload("splitwise-conv", 120, concurrency=16, seed=1) if closed
                else build_workload("splitwise-conv", 120, qps=4.0, seed=1))
    runs = [simulate(dep, workload, step_model=step_model, replicas=2, fast_forward_decodes=ff)
            for ff in (False, True)]
    stepped, forwarded = runs
    np.testing.assert_array_equal(forwarded.token_offsets, stepped.token_offsets)
    np.testing.assert_array_equal(forwarded.token_times_s, stepped.token_times_s)
    np.testing.assert_array_equal(forwarded.preemptions, stepped.preemptions)
    for column in STEP_COLUMNS:
        np.testing.assert_array_equal(getattr(forwarded.steps, column), getattr(stepped.steps, column))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 10), min_size=1, max_size=60), st.floats(0, 10), st.sampled_from([50, 90, 99, 99.9, 100]))
def test_violations_to_fail_is_enough_to_decide_the_percentile(values, limit, percentile):
    values = np.array(values)
    over = int((values > limit).sum())
    needed = violations_to_fail(len(values), percentile)
    if over >= needed:
        assert np.percentile(values, percentile) > limit
    # Fewer do not decide it: with the rest far below the limit, the lower of the two interpolated values is.
    below = np.full(len(values), limit - 1e3)
    below[:needed - 1] = limit + 1
    assert np.sort(below)[math.floor(percentile / 100 * (len(values) - 1))] <= limit


def test_run_stops_early_only_when_its_percentile_fails(step_models):
    workload = build_workload("splitwise-conv", 200, qps=40.0, seed=2)
    full = run(step_models, "vllm", workload)
    tpot_p90_ms = float(np.nanpercentile(full.tpot_s * 1e3, 90))
    values = int((workload.output_tokens > 1).sum())
    rule = StopRule("tpot_p90", "tpot", tpot_p90_ms / 2, violations_to_fail(values, 90))
    with pytest.raises(StoppedEarly) as stopped:
        simulate(deployment(), workload, step_model=step_models["vllm"], stop_rules=(rule,))
    assert stopped.value.rule is rule and stopped.value.time_s < full.finish_s.max()
    met = StopRule("tpot_p90", "tpot", tpot_p90_ms * 1.01, violations_to_fail(values, 90))
    again = simulate(deployment(), workload, step_model=step_models["vllm"], stop_rules=(met,))
    np.testing.assert_array_equal(again.token_times_s, full.token_times_s)


def test_fp8_kv_cache_holds_twice_the_tokens_and_must_match_the_step_model(step_models):
    workload = build_workload("fixed:512:16", 4, arrival="burst")
    base, fp8 = deployment(), deployment(kv_cache_dtype="fp8")
    tokens = {dep.kv_cache_dtype: simulate(dep, workload).info["kv_tokens_per_replica"] for dep in (base, fp8)}
    assert 1.95 < tokens["fp8"] / tokens["auto"] < 2.05
    with pytest.raises(ServesimError, match="KV cache"):
        simulate(fp8, workload, step_model=step_models["vllm"])


def test_metric_definitions(step_models):
    workload = build_workload("fixed:128:10", 3, arrival="burst")
    result = run(step_models, "vllm", workload)
    frame = result.requests
    np.testing.assert_allclose(frame.tpot_ms, (frame.e2e_ms - frame.ttft_ms) / 9)
    np.testing.assert_allclose(frame.tpot_incl_ms, frame.e2e_ms / 10)
    assert len(result.itl_s) == 3 * 9
    np.testing.assert_allclose(result.request_itl_ms(0).mean(), frame.tpot_ms[0])
    summary = result.summary()
    assert summary["request_throughput_per_s"] == pytest.approx(3 / result.duration_s)
    assert result.goodput({"ttft_ms": 1e9}) == pytest.approx(summary["request_throughput_per_s"])
    assert result.goodput({"ttft_ms": 0.0}) == 0.0


def test_simulate_cli_json_and_files(tmp_path):
    from servesim.cli.serving import simulate_command

    trace, csv = tmp_path / "trace.json", tmp_path / "requests.csv"
    out = CliRunner().invoke(simulate_command, [
        "--model", "llama3-8b", "--workload", "fixed:256:16", "-n", "20", "--concurrency", "4", "--engine", "sglang",
        "--goodput", "ttft_ms=1000", "--trace", str(trace), "--requests-csv", str(csv), "--json"])
    assert out.exit_code == 0, out.output
    payload = json.loads(out.output)
    assert payload["summary"]["requests"] == 20
    assert payload["summary"]["goodput_req_per_s"] > 0
    assert json.loads(trace.read_text())["traceEvents"]
    assert len(csv.read_text().splitlines()) == 21


def test_simulate_cli_keeps_step_times_for_the_next_run(tmp_path, monkeypatch):
    """A second simulation of the deployment reads the step times the first kept and predicts none of them again;
    its output is the same as with nothing kept."""
    from servesim.cli.serving import simulate_command
    from servesim.serving import step_cache

    args = ["--model", "llama3-8b", "--workload", "splitwise-conv", "-n", "60", "--qps", "4", "--json"]
    monkeypatch.setenv("SERVESIM_CACHE_DIR", "")
    nothing_kept = CliRunner().invoke(simulate_command, args)
    monkeypatch.setenv("SERVESIM_CACHE_DIR", str(tmp_path))
    spans = []
    predict = step_cache.decode_span
    monkeypatch.setattr(step_cache, "decode_span", lambda *a: spans.append(a) or predict(*a))
    first = CliRunner().invoke(simulate_command, args)
    predicted = len(spans)
    again = CliRunner().invoke(simulate_command, args)
    assert nothing_kept.exit_code == first.exit_code == again.exit_code == 0, first.output
    assert predicted and len(spans) == predicted
    assert again.output == first.output == nothing_kept.output
    assert len(list(tmp_path.rglob("*.npz"))) == 1


def test_latency_cli_mirrors_vllm_bench_latency():
    from servesim.cli.serving import latency_command

    out = CliRunner().invoke(latency_command, ["--model", "llama3-8b", "--batch-size", "4", "--input-len", "64",
                                               "--output-len", "16", "--json"])
    assert out.exit_code == 0, out.output
    payload = json.loads(out.output)
    assert payload["steps"] == 16  # one prefill step, then 15 decode steps for the whole batch
    assert payload["latency_s"] > payload["ttft_ms"] / 1e3


def test_request_too_long_for_the_cache_is_a_clear_error(step_models):
    # within llama3-8b's 8,192-token context, but 23 % of an H100 leaves a pool of about 4,900 tokens
    workload = make_workload([8000], [10])
    with pytest.raises(ServesimError, match="KV cache"):
        run(step_models, "vllm", workload, memory_fraction=0.23)


def test_request_longer_than_the_context_is_refused(step_models):
    workload = make_workload([100, 8000], [10, 200])
    with pytest.raises(ServesimError, match=r"1 of 2 requests \(up to 8,200 .*context of 8,192 tokens"):
        run(step_models, "vllm", workload)


@pytest.mark.parametrize("command,args,message", [
    ("simulate", ["--replicas", "1000000000"], "1<=x<=100000"),
    ("latency", ["--batch-size", "10000000"], "1<=x<=1000000"),
    ("latency", ["--max-num-batched-tokens", "512"], "max_num_batched_tokens (512) >= max_num_seqs (1024)"),
])
def test_runs_beyond_what_a_machine_or_the_engine_takes_are_refused_up_front(command, args, message):
    from servesim.cli import main

    result = CliRunner().invoke(main, [command, "--model", "llama3-8b", "--gpu", "H100", *args])
    assert result.exit_code == 2, result.output
    assert message in (result.output + str(result.exception))


def test_step_log_keeps_launch_order_across_single_rows_and_fast_forwarded_blocks():
    log = StepLog()
    row = (0, 0.0, 1.0, 2, 9, 7, 2, 32)
    log.append(row)
    block = np.array([(1, 1.0, 2.0, 2, 2, 0, 2, 48), (0, 2.0, 3.0, 2, 2, 0, 2, 64)], dtype=np.float64)
    log.extend(block)
    log.extend(block[:0])  # a run that relaunched nothing
    log.append((1, 3.0, 4.0, 1, 1, 0, 1, 16))
    rows = np.stack([log.column(name) for name in STEP_LOG_COLUMNS], axis=1)
    assert rows.shape == (4, len(STEP_LOG_COLUMNS))
    assert log.column("start_s").tolist() == [0.0, 1.0, 2.0, 3.0]
    assert rows[0].tolist() == list(row) and rows[1:3].tolist() == block.tolist()
    assert StepLog().column("kv_used_tokens").shape == (0,)


def test_simulate_shows_progress_only_on_a_terminal_for_long_runs(monkeypatch):
    from servesim.cli import serving

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(serving.sys, "stderr", terminal)
    with serving._progress(serving.PROGRESS_MIN_REQUESTS - 1) as progress:
        assert progress is None
    with serving._progress(serving.PROGRESS_MIN_REQUESTS) as progress:
        progress(100)
        progress(serving.PROGRESS_MIN_REQUESTS)
    assert "simulating" in terminal.getvalue() and f"{serving.PROGRESS_MIN_REQUESTS}/" in terminal.getvalue()
    monkeypatch.setattr(serving.sys, "stderr", io.StringIO())
    with serving._progress(serving.PROGRESS_MIN_REQUESTS) as progress:
        assert progress is None


def test_sglang_recv_interval_holds_arrivals_for_decode_batches():
    """SGLang's --scheduler-recv-interval N: a request reaching a busy engine waits for the next poll, every N decode
    batches (managers/scheduler_recv_skipper.py), so TTFT grows by up to N decode steps and TPOT barely moves;
    with N = 1 (the default) nothing changes, and the stepped and fast-forwarded runs agree."""
    model, gpu, par = get_model("llama3.1-8b"), get_gpu("H100"), Parallelism(1, 1)
    workload = build_workload("uniform:800-1000:100-120", 64, concurrency=4, seed=1)
    results = {}
    for n in (1, 10):
        dep = build_deployment(model, gpu, par, "sglang", scheduler_recv_interval=n)
        step_model = StepTimeModel(dep)
        results[n] = simulate(dep, workload, step_model=step_model)
        stepped = simulate(dep, workload, step_model=step_model, fast_forward_decodes=False)
        assert stepped.ttft_s.mean() == pytest.approx(results[n].ttft_s.mean(), rel=1e-9)
        assert f"--scheduler-recv-interval {n}" in dep.launch_command() or n == 1
    decode_s = np.nanmean(results[1].tpot_s)
    extra_s = results[10].ttft_s.mean() - results[1].ttft_s.mean()
    assert 1 * decode_s < extra_s < 10 * decode_s
    assert np.nanmean(results[10].tpot_s) == pytest.approx(decode_s, rel=0.05)
    with pytest.raises(ServesimError):
        build_deployment(model, gpu, par, "vllm", scheduler_recv_interval=10)
