"""FlashInfer's TRT-LLM fused MoE: which steps run it, and that its own category times it as measured."""

from __future__ import annotations

import pytest

from servesim.estimator import get_estimator
from servesim.hardware import get_gpu
from servesim.kernels.batch import BatchSpec
from servesim.kernels.expand import expand
from servesim.kernels.types import FusedMoE, TrtllmMoE
from servesim.models import get_model
from servesim.training.datasets import collector_routing


def _experts(engine: str, model: str, gpu: str, dtype: str, tp: int = 8) -> FusedMoE:
    step = expand(engine, get_model(model), get_gpu(gpu), BatchSpec(decodes=(1024,) * 4), tp, dtype=dtype)
    (op,) = {op for run in step.runs for op in run.ops if isinstance(op, FusedMoE)}
    return op


@pytest.mark.parametrize(("engine", "model", "gpu", "dtype", "trtllm"), [
    ("sglang", "deepseek-r1", "B200", "fp8-block", True),
    ("sglang", "qwen3.5-397b-a17b", "B200", "bf16", True),
    ("sglang", "deepseek-r1", "H200", "fp8-block", False),  # Hopper: the Triton fused_moe
    ("sglang", "deepseek-r1", "B200", "bf16", False),  # SGLang switches DeepSeek to TRT-LLM for FP8 only
    ("sglang", "gpt-oss-120b", "B200", "mxfp4", True),  # flashinfer_mxfp4 for MXFP4 experts on SM100
    ("vllm", "gpt-oss-120b", "B200", "mxfp4", True),  # vLLM's SM100 MXFP4 default, FlashInfer's TRT-LLM MoE
    ("vllm", "gpt-oss-120b", "H200", "mxfp4", False),
    ("vllm", "deepseek-r1", "B200", "fp8-block", False),
])
def test_the_engines_run_the_trtllm_moe_on_blackwell_for_the_families_they_switch(engine, model, gpu, dtype,
                                                                              trtllm) -> None:
    assert isinstance(_experts(engine, model, gpu, dtype), TrtllmMoE) is trtllm


def test_trtllm_moe_is_timed_near_its_measured_decode_layer() -> None:
    # aiconfigurator's B200 table (sglang_flashinfer_trtllm_moe, block FP8, balanced routing): DeepSeek-R1's routed
    # experts at 4 tokens on TP 8 take 41.7 us; the Triton path's estimate for the same layer is over twice that.
    layer = _experts("sglang", "deepseek-r1", "B200", "fp8-block")
    predicted_us = get_estimator("mlp").predict_us([layer], get_gpu("B200"))[0]
    assert 41.7 / 1.35 <= predicted_us <= 41.7 * 1.35


def test_mxfp4_trtllm_moe_is_timed_near_its_measured_decode_layer() -> None:
    # aiconfigurator's B200 table (vLLM 0.24, vllm_gptossmxfp4moe_flashinfer_trtllm_mxfp4_bf16, balanced routing):
    # gpt-oss-120b's routed experts at 4 tokens on one GPU take 72.3 us, 16 of its 128 experts reached.
    routing = collector_routing(4, 128, 4, 128)
    layer = TrtllmMoE(tokens=4, num_experts=128, top_k=4, hidden=2880, intermediate=2880,
                      expert_tokens=tuple(int(n) for n in routing), dtype="bf16", weight_dtype="mxfp4")
    assert layer.active_experts() == 16
    predicted_us = get_estimator("mlp").predict_us([layer], get_gpu("B200"))[0]
    assert 72.3 / 1.35 <= predicted_us <= 72.3 * 1.35


@pytest.mark.parametrize(("engine", "model", "dtype", "requested", "trtllm"), [
    ("vllm", "minimax-m2.5", "fp8", "flashinfer-trtllm", True),  # VLLM_USE_FLASHINFER_MOE_FP8=1
    ("vllm", "minimax-m2.5", "fp8", "auto", False),
    ("sglang", "deepseek-r1", "fp8-block", "triton", False),  # --moe-runner-backend triton
    ("sglang", "deepseek-r1", "fp8-block", "auto", True),
])
def test_the_moe_backend_a_user_picks_runs_the_experts(engine, model, dtype, requested, trtllm) -> None:
    step = expand(engine, get_model(model), get_gpu("B200"), BatchSpec(decodes=(1024,) * 4), 8, dtype=dtype,
                  moe_backend=requested)
    (op,) = {op for run in step.runs for op in run.ops if isinstance(op, FusedMoE)}
    assert isinstance(op, TrtllmMoE) is trtllm


def test_the_trtllm_moe_is_refused_off_blackwell_and_the_launch_names_it() -> None:
    from click.testing import CliRunner

    from servesim.cli import main

    args = ["simulate", "--model", "minimax-m2.5", "--tp", "4", "--dtype", "fp8", "--workload", "fixed:256:8",
            "--concurrency", "2", "-n", "2"]
    refused = CliRunner().invoke(main, [*args, "--gpu", "H100", "--moe-backend", "flashinfer-trtllm"])
    assert refused.exit_code != 0 and "Blackwell" in refused.output and "--moe-backend auto" in refused.output
    assert "Traceback" not in refused.output
    assert CliRunner().invoke(main, [*args, "--gpu", "H100", "--moe-backend", "auto"]).exit_code == 0
    triton = CliRunner().invoke(main, [*args, "--gpu", "H100", "--moe-backend", "triton"])
    assert "VLLM_USE_FLASHINFER_MOE_FP8=0 VLLM_MOE_USE_DEEP_GEMM=0 vllm serve" in triton.output
    served = CliRunner().invoke(main, [*args, "--gpu", "B200", "--moe-backend", "flashinfer-trtllm"])
    assert served.exit_code == 0, served.output
    assert "VLLM_USE_FLASHINFER_MOE_FP8=1" in served.output
