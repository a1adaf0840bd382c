"""Expert parallelism inside the TP group (vLLM --enable-expert-parallel, SGLang --ep-size): each GPU holds
``E / ep`` whole experts, each expert's width split over ``tp / ep`` GPUs."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from servesim.cli import main
from servesim.errors import ServesimError
from servesim.hardware import get_gpu
from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.kernels.expand import expand, local_pairs, reached_experts
from servesim.kernels.types import FusedMoE
from servesim.models import get_model
from servesim.models.parallel import Parallelism, validate_parallelism
from servesim.planner.plan import candidate_layouts
from servesim.serving.deployment import build_deployment
from servesim.validate.silicon import _layout


def _experts(step) -> FusedMoE:
    (op,) = {op for run in step.runs for op in run.ops if isinstance(op, FusedMoE)}
    return op


@given(st.integers(1, 20_000), st.sampled_from([(8, 128, 4), (8, 256, 8), (4, 128, 2), (2, 8, 2), (10, 512, 8)]))
def test_the_busiest_gpu_reaches_at_most_its_own_experts_with_at_least_its_share(tokens: int, routing) -> None:
    top_k, experts, ep = routing
    reached, pairs = reached_experts(tokens, top_k, experts, ep), local_pairs(tokens, top_k, experts, ep)
    assert 1 <= reached <= min(experts // ep, pairs)
    assert tokens * top_k / ep <= pairs <= tokens * top_k
    # the busiest GPU reaches at least the mean GPU's experts, and more experts as the batch grows
    assert reached >= min(experts // ep, round(experts / ep * (1 - (1 - top_k / experts) ** tokens)))
    assert reached_experts(tokens + 1, top_k, experts, ep) >= reached
    assert local_pairs(tokens + 1, top_k, experts, ep) >= pairs


def test_expert_parallel_decode_waits_for_the_busiest_gpu() -> None:
    # 16 tokens top-10 over 512 experts on 8 GPUs: a GPU reaches 17.3 of its 64 experts on average, the busiest
    # about 5 more (a standard deviation of 3.6 times 1.43, the expected largest of 8 standard normals).
    assert reached_experts(16, 10, 512, 8) == 22
    assert reached_experts(16, 10, 512, 1) == 139  # without expert parallelism every GPU reads the same experts


def test_ep_one_is_tensor_parallelism_alone() -> None:
    model, gpu = get_model("qwen3-235b-a22b"), get_gpu("H200")
    batch = BatchSpec(decodes=(1024,) * 24)
    assert expand("vllm", model, gpu, batch, 4, 1, 0, "bf16", ep=1) == expand("vllm", model, gpu, batch, 4)


@pytest.mark.parametrize("tokens", [16, 4096])
def test_each_gpu_runs_whole_experts_of_its_share(tokens: int) -> None:
    model, gpu = get_model("qwen3-235b-a22b"), get_gpu("H200")
    batch = BatchSpec(decodes=(1024,) * tokens) if tokens < 512 else BatchSpec(prefills=(PrefillChunk(tokens, 0),))
    tp_only = _experts(expand("vllm", model, gpu, batch, 4))
    ep = _experts(expand("vllm", model, gpu, batch, 4, ep=4))
    assert ep.intermediate == model.moe_intermediate_size == 4 * tp_only.intermediate
    assert ep.num_experts <= model.num_experts // 4
    k = model.num_experts_per_tok
    assert ep.routed_pairs() == local_pairs(tokens, k, model.num_experts, 4) >= tokens * k / 4
    if tokens >= 512:  # a prefill reaches every expert: the same expert bytes per GPU either way
        assert ep.num_experts * ep.intermediate == tp_only.num_experts * tp_only.intermediate


def test_expert_parallelism_keeps_the_bytes_each_gpu_holds() -> None:
    model, gpu = get_model("qwen3-235b-a22b"), get_gpu("H200")
    tp_only = build_deployment(model, gpu, Parallelism(8), "sglang", "fp8-block").memory
    ep = build_deployment(model, gpu, Parallelism(8, 1, 8), "sglang", "fp8-block").memory
    assert ep.weight_bytes == pytest.approx(tp_only.weight_bytes)
    assert ep.kv_tokens == tp_only.kv_tokens


@pytest.mark.parametrize(("model", "par", "fragment"), [
    ("llama3-8b", Parallelism(2, 1, 2), "has no experts"),
    ("qwen3-235b-a22b", Parallelism(4, 1, 3), "does not divide TP=4"),
])
def test_layouts_the_engines_refuse(model: str, par: Parallelism, fragment: str) -> None:
    with pytest.raises(ServesimError, match=fragment):
        validate_parallelism(get_model(model), par)


def test_vllm_splits_experts_over_all_tp_gpus_or_none_and_its_suggestions_run() -> None:
    model, gpu = get_model("qwen3-235b-a22b"), get_gpu("H200")
    with pytest.raises(ServesimError, match=r"use --ep 1 or --ep 4, or --engine sglang \(--ep-size 2\)"):
        build_deployment(model, gpu, Parallelism(4, 1, 2), "vllm", "fp8-block")
    for engine, par in (("vllm", Parallelism(4, 1, 4)), ("vllm", Parallelism(4)), ("sglang", Parallelism(4, 1, 2))):
        build_deployment(model, gpu, par, engine, "fp8-block")


@pytest.mark.parametrize(("engine", "ep", "flag"), [("vllm", 4, "--enable-expert-parallel"),
                                                    ("sglang", 2, "--ep-size 2")])
def test_launch_command_carries_the_expert_split(engine: str, ep: int, flag: str) -> None:
    deployment = build_deployment(get_model("qwen3-235b-a22b"), get_gpu("H200"), Parallelism(4, 1, ep), engine,
                                  "fp8-block")
    assert flag in deployment.launch_command()
    plain = build_deployment(get_model("qwen3-235b-a22b"), get_gpu("H200"), Parallelism(4), engine, "fp8-block")
    assert "expert" not in plain.launch_command() and "--ep-size" not in plain.launch_command()


def test_plan_search_tries_expert_parallel_layouts_of_moe_models_only() -> None:
    gpu = get_gpu("H200")
    moe = candidate_layouts(get_model("qwen3-235b-a22b"), gpu, 4, 1, None)
    assert moe == [Parallelism(4, 1, 1), Parallelism(4, 1, 4)]
    assert candidate_layouts(get_model("llama3-8b"), gpu, 4, 1, None) == [Parallelism(4)]
    assert all(par.tp % 2 == 0 for par in candidate_layouts(get_model("qwen3-235b-a22b"), gpu, None, 1, 2))


def test_cli_refuses_ep_on_a_dense_model_in_one_line() -> None:
    result = CliRunner().invoke(main, ["latency", "--model", "llama3-8b", "--tp", "2", "--ep", "2"])
    assert result.exit_code != 0
    assert "has no experts; drop --ep" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(("tp", "moe_tp", "moe_ep", "attention_dp", "source", "expected"), [
    (4, 1, 4, 1, "", (4, 4, 1)),  # experts over all 4 GPUs
    (16, 4, 4, 1, "", (4, 4, 1)),  # tp_size recorded as TP x EP (row id "_tp4_ep4_")
    (8, 8, 1, 1, "", (8, 1, 1)),
    # how InferenceX's exports label its vLLM EP runs, DP or not; the launches known to run DP replay with ranks
    (2, 1, 4, 2, "db-dump/2026-04-27; config_id=706", (2, 2, 1)),
    (2, 1, 4, 2, "db-dump/2026-04-27; config_id=707", (2, 2, 2)),
    (8, 1, 8, 8, "", "attention data parallelism 8 with TP 8 and EP 8"),
])
def test_silicon_rows_layouts(tp, moe_tp, moe_ep, attention_dp, source, expected) -> None:
    row = {"tp": tp, "moe_tp": moe_tp, "moe_ep": moe_ep, "attention_dp": attention_dp, "source": source,
           "backend": "vllm"}
    layout = _layout(row, is_moe=True)
    assert layout == expected if isinstance(expected, tuple) else layout.startswith(expected)


def test_replay_times_each_expert_split_with_its_own_step_model() -> None:
    from dataclasses import replace

    from servesim.validate.replay import ServingCase, StepModels, replay
    from servesim.workloads import build_workload

    case = ServingCase(case_id="tp2", model_id="Qwen/Qwen3-30B-A3B", preset="qwen3-30b-a3b", gpu="H100-SXM",
                       engine="vllm", engine_version="", dtype="bf16", tp=2, pp=1, isl=512, osl=32, concurrency=4,
                       workload=build_workload("fixed:512:32", 8, concurrency=4), measured_ttft_ms=50.0,
                       measured_tpot_ms=10.0)
    rows, skipped = replay([case, replace(case, case_id="tp2ep2", ep=2)], "mlp", step_models=StepModels("mlp"))
    assert not skipped
    assert [row["ep"] for row in rows] == [1, 2]


def test_the_python_api_takes_the_expert_split() -> None:
    import servesim

    dep = servesim.deployment("qwen3-30b-a3b", "H100", tp=2, ep=2)
    assert dep.par == Parallelism(2, 1, 2) and "--enable-expert-parallel" in dep.launch_command()
    with pytest.raises(ServesimError, match="already fixes ep"):
        servesim.simulate(dep, ep=2)
