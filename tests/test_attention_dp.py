"""Attention data parallelism (vLLM --data-parallel-size, SGLang --dp-size --enable-dp-attention): a MoE model's TP
group split into ranks, each with its own requests, KV cache and attention over TP/DP GPUs, joined for the MoE
layers."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.errors import ServesimError
from servesim.hardware import get_gpu
from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.kernels.expand import expand
from servesim.kernels.types import AttentionDecode, AttentionPrefill, Collective, FusedMoE
from servesim.models import get_model
from servesim.models.memory import kv_bytes_per_token_per_gpu, weight_bytes_per_gpu
from servesim.models.parallel import Parallelism, validate_parallelism
from servesim.serving.deployment import build_deployment
from servesim.serving.simulator import simulate
from servesim.workloads import build_workload


def _ops(step, kind):
    return [op for run in step.runs for op in run.ops if isinstance(op, kind)]


def _moe_layer_collectives(step) -> list[str]:
    """The collectives of the step's last (MoE) layer run, by op."""
    return [op.op for op in step.runs[-2].ops if isinstance(op, Collective)]


@pytest.mark.parametrize("batch", [BatchSpec(decodes=(2048,) * 16), BatchSpec((PrefillChunk(1021),), (900,) * 3)])
def test_a_rank_runs_the_moe_of_every_ranks_tokens_as_tensor_parallelism_would(batch: BatchSpec) -> None:
    """DP ranks of ``b`` tokens each feed the MoE layer ``dp × b`` tokens (each rank padded to its CUDA-graph size,
    here none): the kernel a TP step of that many tokens launches; attention sees only the rank's requests, with
    the heads of TP/DP GPUs."""
    model, gpu = get_model("qwen3-235b-a22b"), get_gpu("H200")
    dp = expand("vllm", model, gpu, batch, 4, ep=4, dp=4)
    many = BatchSpec(decodes=batch.decodes * 4, prefills=batch.prefills * 4)
    tp = expand("vllm", model, gpu, many, 4, ep=4)
    assert _ops(dp, FusedMoE)[0] == _ops(tp, FusedMoE)[0]
    (attention,) = set(_ops(dp, (AttentionDecode, AttentionPrefill)))
    assert attention.num_heads == model.num_attention_heads  # attention TP 1: every head on each GPU
    assert attention.kv_lens == batch.kv_lens  # the rank's requests only


def test_ranks_gather_before_the_experts_and_reduce_scatter_after() -> None:
    model, gpu = get_model("deepseek-v3"), get_gpu("H200")
    batch = BatchSpec(decodes=(1024,) * 16)
    assert _moe_layer_collectives(expand("sglang", model, gpu, batch, 8, dtype="fp8-block")) == ["all_reduce"] * 2
    dp = expand("sglang", model, gpu, batch, 8, dtype="fp8-block", ep=8, dp=8)
    assert _moe_layer_collectives(dp) == ["all_gather", "reduce_scatter"]  # attention TP 1: no all-reduce left
    gather = next(op for op in dp.runs[-2].ops if isinstance(op, Collective))
    assert gather.group_size == 8 and gather.bytes == 16 * 8 * model.hidden_size * 2
    # With two GPUs per rank the attention's all-reduce stays, over those two.
    half = expand("sglang", model, gpu, batch, 8, dtype="fp8-block", ep=8, dp=4)
    assert {op.group_size for op in half.runs[-2].ops if isinstance(op, Collective) and op.op == "all_reduce"} == {2}


def test_ranks_replicate_attention_weights_and_split_the_experts_as_before() -> None:
    model = get_model("minimax-m2.5")
    tp = Parallelism(4, ep=4)
    dp = Parallelism(4, ep=4, dp=4)
    tp_bytes, dp_bytes = (weight_bytes_per_gpu(model, par, 0, "fp8") for par in (tp, dp))
    experts = model.num_layers * model.num_experts * 3 * model.hidden_size * model.moe_intermediate_size / 4
    # The experts stay split over all four GPUs; the rest (attention, embedding, LM head) is a whole rank's on each,
    # four times a TP GPU's share but for what every GPU holds whole either way (norms, router).
    assert 3 * (tp_bytes - experts) < dp_bytes - experts <= 4 * (tp_bytes - experts)
    # KV heads: 8 over 4 GPUs is 2 a GPU; one rank's GPU holds all 8 of its requests' heads.
    assert kv_bytes_per_token_per_gpu(model, dp, 0, "fp8") == 4 * kv_bytes_per_token_per_gpu(model, tp, 0, "fp8")


def test_mla_ranks_hold_more_requests_than_one_tensor_parallel_group() -> None:
    """MLA's latent cache is whole on every GPU under TP, so DP attention multiplies the requests a replica keeps
    by the ranks, less the replicated attention weights: why DeepSeek deployments run it."""
    model, gpu = get_model("deepseek-r1"), get_gpu("H200")
    tp = build_deployment(model, gpu, Parallelism(8, ep=8), "sglang", "fp8-block")
    dp = build_deployment(model, gpu, Parallelism(8, ep=8, dp=8), "sglang", "fp8-block")
    assert dp.memory.kv_tokens < tp.memory.kv_tokens
    assert 8 * dp.memory.kv_tokens > 4 * tp.memory.kv_tokens


def test_the_simulator_runs_one_scheduler_and_kv_cache_per_rank() -> None:
    model, gpu = get_model("qwen3-235b-a22b"), get_gpu("H200")
    deployment = build_deployment(model, gpu, Parallelism(4, ep=4, dp=4), "vllm", "fp8")
    scheduler = deployment.make_scheduler()
    assert len(scheduler.ranks) == 4
    assert scheduler.kv_capacity_tokens == 4 * scheduler.request_capacity_tokens
    result = simulate(deployment, build_workload("fixed:512:64", 64, concurrency=16))
    assert result.info["dp"] == 4 and result.info["kv_tokens_per_replica"] == scheduler.kv_capacity_tokens
    assert result.summary()["requests"] == 64


@pytest.mark.parametrize(("engine", "shares"), [("vllm", [4, 4, 4, 4]), ("sglang", [4, 4, 4, 4])])
def test_each_engine_spreads_requests_over_its_ranks(engine: str, shares: list[int]) -> None:
    """vLLM's API server picks the rank of least 4 × waiting + running, SGLang's controller takes turns."""
    from servesim.serving.state import RequestState

    deployment = build_deployment(get_model("qwen3-235b-a22b"), get_gpu("H200"), Parallelism(4, ep=4, dp=4), engine,
                                  "fp8")
    scheduler = deployment.make_scheduler()
    for rid in range(16):
        scheduler.add(RequestState(rid, 512, 64, 0.0))
    assert [len(rank.waiting) for rank in scheduler.ranks] == shares


def test_ranks_step_together_as_long_as_the_slowest() -> None:
    """A rank with a prompt chunk holds the others' decodes: the joined step lasts as long as its slowest part."""
    from servesim.serving.scheduler_dp import RankedStep, ranked_step_time_us
    from servesim.serving.state import RequestState, make_step
    from servesim.serving.step_time import StepTimeModel

    deployment = build_deployment(get_model("qwen3-235b-a22b"), get_gpu("H200"), Parallelism(4, ep=4, dp=2), "vllm",
                                  "fp8")
    model = StepTimeModel(deployment)
    decoding = RequestState(0, 512, 64, 0.0)
    decoding.computed, decoding.generated = 600, 89
    decode = make_step([decoding], [1], [])
    prompt = make_step([RequestState(1, 4096, 64, 0.0)], [4096], [])
    joined = RankedStep(requests=(), new_tokens=(), num_decodes=1, decode_context_tokens=600, decode_max_context=600,
                        prefills=prompt.prefills, parts=(decode, prompt))
    (decode_host, (decode_gpu,)), (prompt_host, (prompt_gpu,)) = (ranked_step_time_us(model, part)
                                                                  for part in (decode, prompt))
    assert prompt_gpu > decode_gpu
    # each rank's host schedules its own part at once (vLLM: one engine core process a rank)
    assert ranked_step_time_us(model, joined) == (max(decode_host, prompt_host), (prompt_gpu,))


def test_launch_commands_name_the_ranks_as_each_engine_does() -> None:
    model, gpu = get_model("deepseek-r1"), get_gpu("H200")
    vllm = build_deployment(model, gpu, Parallelism(8, ep=8, dp=4), "vllm", "fp8-block").launch_command()
    assert "--tensor-parallel-size 2 --data-parallel-size 4 --enable-expert-parallel" in vllm
    sglang = build_deployment(model, gpu, Parallelism(8, ep=8, dp=8), "sglang", "fp8-block").launch_command()
    assert "--tp-size 8 --dp-size 8 --enable-dp-attention --ep-size 8" in sglang


@pytest.mark.parametrize(("model_name", "par", "message"), [
    ("llama3-8b", Parallelism(2, dp=2), "has no experts"),
    ("qwen3-235b-a22b", Parallelism(4, dp=3), "--dp 4"),
])
def test_layouts_the_engines_refuse_are_refused_with_a_working_suggestion(model_name: str, par: Parallelism,
                                                                          message: str) -> None:
    model = get_model(model_name)
    with pytest.raises(ServesimError, match=message):
        validate_parallelism(model, par)
    if model.is_moe:
        validate_parallelism(model, Parallelism(par.tp, dp=par.tp))  # the suggested layout is accepted


def test_cli_simulates_and_lists_kernels_with_dp() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["kernels", "--model", "qwen3-235b-a22b", "--gpu", "H200", "--tp", "4", "--ep", "4",
                                  "--dp", "4", "--batch", "decode:8x1024"])
    assert result.exit_code == 0, result.output
    assert "moe.dp_gather" in result.output and "dp=4" in result.output
    result = runner.invoke(main, ["latency", "--model", "llama3-8b", "--tp", "2", "--dp", "2"])
    assert result.exit_code == 2 and "has no experts" in result.output and "Traceback" not in result.output


def test_plan_refuses_a_degree_no_layout_takes_and_names_those_that_work() -> None:
    from servesim.planner.plan import candidate_layouts

    model, gpu = get_model("qwen3-235b-a22b"), get_gpu("H200")
    with pytest.raises(ServesimError, match=r"DP=16 divides; use --dp 2 or 4 or 8, or --dp 1"):
        candidate_layouts(model, gpu, None, None, 1, 16)
    assert all(candidate_layouts(model, gpu, None, None, 1, dp) for dp in (2, 4, 8))
    assert {par.dp for par in candidate_layouts(model, gpu, 8, 1, 8, None)} == {1, 8}  # --dp search
    with pytest.raises(ServesimError, match="llama3-70b has no experts; serve copies of it with --replicas instead "
                                            "and drop --dp"):
        candidate_layouts(get_model("llama3-70b"), get_gpu("H100"), None, None, 1, 2)


def test_sglang_ranks_admit_with_less_conservative_reservations() -> None:
    """SGLang's dp attention scales --schedule-conservativeness by 0.3: each rank starts its new-token ratio at
    0.21 rather than 0.7, reserving less KV for the running requests' future tokens."""
    model, gpu = get_model("deepseek-r1"), get_gpu("H200")
    one = build_deployment(model, gpu, Parallelism(8, ep=8), "sglang", "fp8-block").make_scheduler()
    ranks = build_deployment(model, gpu, Parallelism(8, ep=8, dp=8), "sglang", "fp8-block").make_scheduler()
    assert one.init_ratio == pytest.approx(0.7)
    assert [rank.init_ratio for rank in ranks.ranks] == pytest.approx([0.21] * 8)
