"""vLLM's Marlin MoE for MXFP4 experts: where the engine runs it, how it is decomposed and timed, and how a user
asks for it."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.decompose import decompose
from servesim.decompose.moe import marlin_block_m, marlin_dims
from servesim.estimator import get_estimator
from servesim.errors import ServesimError
from servesim.hardware import get_gpu
from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.kernels.expand import balanced_routing, expand
from servesim.kernels.types import FusedMoE, MarlinMoE, TrtllmMoE
from servesim.models import get_model
from servesim.models.parallel import Parallelism
from servesim.serving.deployment import build_deployment

GPT_OSS = get_model("gpt-oss-120b")


def _experts(step) -> list:
    return [op for run in step.runs for op in run.ops if isinstance(op, FusedMoE)]


def _marlin(tokens: int, experts: int = 128, top_k: int = 4) -> MarlinMoE:
    return MarlinMoE(tokens=tokens, num_experts=experts, top_k=top_k, hidden=2880, intermediate=2880,
                     expert_tokens=balanced_routing(tokens * top_k, experts), dtype="bf16", weight_dtype="mxfp4")


@pytest.mark.parametrize("tokens", [1, 7, 32, 33, 200, 1000, 5000])
def test_block_size_follows_vllm_rule(tokens: int) -> None:
    # fused_marlin_moe: the first of 8..48 with fewer than 0.9 blocks' worth of pairs per expert, else 64.
    block = marlin_block_m(_marlin(tokens))
    per_expert = tokens * 4 / 128
    assert block in (8, 16, 32, 48, 64)
    assert block == 64 or per_expert / block < 0.9
    smaller = [b for b in (8, 16, 32, 48) if b < block]
    assert all(per_expert / b >= 0.9 for b in smaller)


def test_mxfp4_experts_are_padded_as_marlin_needs() -> None:
    hidden, inter = marlin_dims(_marlin(16))
    assert (hidden % 256, inter % 128) == (0, 0) and hidden >= 2880 and inter >= 2880


def test_marlin_only_runs_four_bit_weights() -> None:
    with pytest.raises(ValueError, match="4-bit"):
        MarlinMoE(tokens=1, num_experts=8, top_k=2, hidden=256, intermediate=256,
                  expert_tokens=(1, 1, 0, 0, 0, 0, 0, 0), dtype="bf16")


@pytest.mark.parametrize(("gpu", "requested", "kernel"), [
    ("H200", "auto", FusedMoE), ("H200", "marlin", MarlinMoE), ("A100", "auto", MarlinMoE),
    ("L40S", "auto", MarlinMoE), ("B200", "auto", TrtllmMoE), ("B200", "flashinfer-mxfp8", TrtllmMoE),
    ("B200", "marlin", MarlinMoE), ("B200", "triton", FusedMoE)])
def test_engine_picks_the_mxfp4_moe_kernel_by_gpu(gpu: str, requested: str, kernel: type) -> None:
    deployment = build_deployment(GPT_OSS, get_gpu(gpu), Parallelism(4, 1), "vllm", "mxfp4",
                                  mxfp4_moe_backend=requested)
    step = expand("vllm", GPT_OSS, get_gpu(gpu), BatchSpec(prefills=(PrefillChunk(512, 0),)), 4, 1, 0, "mxfp4",
                  "auto", requested)
    act = "fp8" if requested == "flashinfer-mxfp8" else "bf16"
    assert {(type(op), op.weight_dtype, op.dtype) for op in _experts(step)} == {(kernel, "mxfp4", act)}
    launch = deployment.launch_command()
    assert ("VLLM_MXFP4_USE_MARLIN=1" in launch) == (gpu in ("H200", "B200") and requested == "marlin")
    assert ("VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1" in launch) == (requested == "flashinfer-mxfp8")


def test_bf16_experts_never_run_on_marlin() -> None:
    step = expand("vllm", GPT_OSS, get_gpu("H200"), BatchSpec(prefills=(PrefillChunk(64, 0),)), 4, 1, 0, "bf16",
                  "auto", "marlin")
    assert {type(op) for op in _experts(step)} == {FusedMoE}


@pytest.mark.parametrize(("engine", "gpu", "requested"), [
    ("sglang", "H200", "marlin"), ("vllm", "A100", "triton"), ("vllm", "H200", "flashinfer"),
    ("sglang", "B200", "flashinfer-mxfp8")])
def test_a_kernel_the_engine_cannot_run_is_refused(engine: str, gpu: str, requested: str) -> None:
    with pytest.raises(ServesimError, match="--mxfp4-moe-backend auto"):
        build_deployment(GPT_OSS, get_gpu(gpu), Parallelism(4, 1), engine, "mxfp4", mxfp4_moe_backend=requested)


def test_marlin_prefill_is_slower_than_triton_on_hopper() -> None:
    # aiconfigurator-core's measured vLLM tables put Marlin 4-bit MoE at 2.4-4.4x the Triton BF16 fused MoE at
    # 2k-16k tokens on the H200 (experiments/marlin_moe_prefill.py); decode-sized calls are far closer.
    estimator, gpu = get_estimator("mlp"), get_gpu("H200")
    prefill, decode = _marlin(8192), _marlin(1)
    fields = ("tokens", "num_experts", "top_k", "hidden", "intermediate", "expert_tokens", "dtype", "weight_dtype")
    triton = [FusedMoE(**{f: getattr(k, f) for f in fields}) for k in (prefill, decode)]
    marlin_us = estimator.predict_us([prefill, decode], gpu)
    triton_us = estimator.predict_us(triton, gpu)
    assert marlin_us[0] / triton_us[0] > 2.0
    assert marlin_us[0] / triton_us[0] > marlin_us[1] / triton_us[1]


def test_decomposition_conserves_the_multiply_adds() -> None:
    kernel, gpu = _marlin(300), get_gpu("H100")
    gate_up, down = (launch for launch in decompose(kernel, gpu) if launch.name.startswith("marlin_moe"))
    hidden, inter = marlin_dims(kernel)
    pairs = kernel.routed_pairs()
    assert gate_up.tasks.demand["tensor"].sum() == pytest.approx(2 * pairs * 2 * inter * hidden)
    assert down.tasks.demand["tensor"].sum() == pytest.approx(2 * pairs * hidden * inter)


def test_cli_option_reaches_the_kernels() -> None:
    runner = CliRunner()
    args = ["latency", "--model", "gpt-oss-120b", "--gpu", "H200", "--dtype", "mxfp4", "--batch-size", "2",
            "--input-len", "4096", "--output-len", "4", "--json"]
    auto = json.loads(runner.invoke(main, args).output)
    marlin = json.loads(runner.invoke(main, [*args, "--mxfp4-moe-backend", "marlin"]).output)
    assert (auto["config"]["mxfp4_moe_backend"], marlin["config"]["mxfp4_moe_backend"]) == ("triton", "marlin")
    assert marlin["ttft_ms"] > 1.5 * auto["ttft_ms"]
    bad = runner.invoke(main, [*args, "--engine", "sglang", "--mxfp4-moe-backend", "marlin"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


def _names(kernel: MarlinMoE) -> list[str]:
    return [launch.name for launch in decompose(kernel, get_gpu("H200"))]


def test_call_runs_sort_gemms_activation_and_sum_in_vllm_order() -> None:
    # fused_marlin_moe: moe_align_block_size (align + count-and-sort above 64 experts), w13, activation, w2, moe_sum.
    assert _names(_marlin(4)) == ["moe_align_block_size", "count_and_sort_expert_tokens", "marlin_moe w13 (gate/up)",
                                  "silu_mul (vLLM activation_kernels.cu)", "marlin_moe w2 (down)",
                                  "moe_sum (top-k reduce)"]
    assert _names(_marlin(4, experts=32))[0] == "moe_align_block_size (small batch)"


def test_sort_pads_over_every_expert_the_router_picks_from() -> None:
    # max_num_tokens_padded = numel + E * (block_size - 1), E the global expert count under expert parallelism.
    def align_bytes(kernel: MarlinMoE) -> float:
        launch = decompose(kernel, get_gpu("H200"))[0]
        return float(launch.tasks.demand["l2"].sum())

    local = MarlinMoE(tokens=1, num_experts=7, top_k=16, hidden=3584, intermediate=3072,
                      expert_tokens=(1, 0, 0, 0, 0, 0, 0), dtype="bf16", weight_dtype="mxfp4")
    expert_parallel = dataclasses.replace(local, global_experts=896)
    assert align_bytes(expert_parallel) > 50 * align_bytes(local)
    assert "output.zero_() (expert parallel)" in _names(expert_parallel)
    assert "output.zero_() (expert parallel)" not in _names(local)


def test_global_experts_cannot_be_fewer_than_local_ones() -> None:
    with pytest.raises(ValueError, match="global_experts"):
        MarlinMoE(tokens=1, num_experts=8, top_k=2, hidden=256, intermediate=256,
                  expert_tokens=(1, 1, 0, 0, 0, 0, 0, 0), dtype="bf16", weight_dtype="int4", global_experts=4)
