"""NVFP4 checkpoints (``--dtype nvfp4``): which families and GPUs run them, which layers they quantise and launch as FP4
kernels, what they weigh, how they are timed and how the measured rows labelled ``nvfp4`` are replayed."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.errors import ServesimError
from servesim.estimator import get_estimator
from servesim.hardware import get_gpu
from servesim.kernels.batch import BatchSpec
from servesim.kernels.expand import expand
from servesim.kernels.types import FusedMoE, Gemm, ScaledMM, TrtllmMoE
from servesim.models import get_model
from servesim.models.config import checkpoint_quant
from servesim.models.memory import weight_bytes_per_gpu
from servesim.models.parallel import Parallelism
from servesim.training.datasets import collector_routing


def _ops(engine: str, model: str, gpu: str = "B200", tp: int = 4, dtype: str = "nvfp4"):
    step = expand(engine, get_model(model), get_gpu(gpu), BatchSpec(decodes=(1024,) * 8), tp, dtype=dtype)
    return [op for run in step.runs for op in run.ops]


@pytest.mark.parametrize(("engine", "model"), [("vllm", "minimax-m2.5"), ("vllm", "kimi-k2.5"),
                                               ("vllm", "qwen3.5-397b-a17b"), ("sglang", "kimi-k2.5"),
                                               ("sglang", "qwen3.5-397b-a17b")])
def test_nvfp4_experts_run_w4a4_on_the_trtllm_moe_and_the_rest_stays_bf16(engine, model) -> None:
    ops = _ops(engine, model, tp=8)
    (experts,) = {op for op in ops if isinstance(op, FusedMoE)}
    assert isinstance(experts, TrtllmMoE)
    assert (experts.dtype, experts.weight_dtype) == ("fp4", "nvfp4")
    assert experts.weight_element_bytes == 4.5 / 8  # E2M1 values and one E4M3 scale per 16
    # NVIDIA's checkpoints keep attention, shared experts and dense layers out of NVFP4: no scaled MM anywhere
    assert not [op for op in ops if isinstance(op, ScaledMM)]
    assert all(op.dtype == "bf16" for op in ops if isinstance(op, Gemm))


@pytest.mark.parametrize(("engine", "model", "fp4", "bf16"), [
    # nvidia/DeepSeek-V3.1-NVFP4 excludes the MLA projections but not o_proj
    ("sglang", "deepseek-r1", {"o_proj", "gate_up_proj", "down_proj", "shared_experts.gate_up_proj",
                               "shared_experts.down_proj"}, {"fused_qkv_a_proj", "q_b_proj"}),
    ("sglang", "glm-5", {"gate_up_proj", "down_proj", "shared_experts.gate_up_proj", "shared_experts.down_proj"},
     {"o_proj", "fused_qkv_a_proj"}),  # nvidia/GLM-5-NVFP4 excludes o_proj too
    ("vllm", "qwen3-235b-a22b", {"qkv_proj", "o_proj"}, {"gate"}),  # the router alone excluded
    ("vllm", "llama3.1-70b", {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}, {"lm_head"}),
])
def test_nvfp4_linears_follow_what_each_familys_checkpoint_quantises(engine, model, fp4, bf16) -> None:
    from servesim.kernels.types import Fp4Linear

    step = expand(engine, get_model(model), get_gpu("B200"), BatchSpec(decodes=(1024,) * 8), 8, dtype="nvfp4")
    ops = [op for run in step.runs for op in run.ops]
    assert fp4 <= {op.name for op in ops if isinstance(op, Fp4Linear)}
    assert bf16 <= {op.name for op in ops if isinstance(op, Gemm) and op.dtype == "bf16"}
    assert not [op for op in ops if isinstance(op, ScaledMM)]


def test_nvfp4_linears_weigh_4_5_bits() -> None:
    model = get_model("llama3.1-70b")
    par = Parallelism(1, 1)
    bf16, nvfp4 = (weight_bytes_per_gpu(model, par, 0, dtype) for dtype in ("bf16", "nvfp4"))
    layer = model.hidden_size * (model.q_size + 2 * model.num_kv_heads * model.head_dim + model.q_size
                                 + 3 * model.intermediate_size)
    assert bf16 - nvfp4 == pytest.approx(model.num_layers * layer * (2 - 4.5 / 8), rel=1e-9)


def test_nvfp4_experts_weigh_4_5_bits_and_the_rest_16() -> None:
    model = get_model("minimax-m2.5")
    par = Parallelism(4, 1)
    bf16, nvfp4 = (weight_bytes_per_gpu(model, par, 0, dtype) for dtype in ("bf16", "nvfp4"))
    experts = model.num_layers * model.num_experts * 3 * model.hidden_size * model.moe_intermediate_size / 4
    assert bf16 - nvfp4 == pytest.approx(experts * (2 - 4.5 / 8), rel=1e-9)


def test_nvfp4_trtllm_moe_is_timed_near_its_measured_layer() -> None:
    # aiconfigurator's B200 table (SGLang 0.5.14, sglang_flashinfer_trtllm_moe, NVFP4, balanced routing):
    # MiniMax-M2.5's routed experts (256 x 3072 x 1536, top 8) at 4 tokens with MoE TP 4 take 26.0 us, at 1,024
    # tokens on one GPU 360.9 us.
    estimator, gpu = get_estimator("mlp"), get_gpu("B200")
    for tokens, moe_tp, measured_us in ((4, 4, 26.0), (1024, 1, 360.9)):
        routing = collector_routing(tokens, 256, 8, 256)
        layer = TrtllmMoE(tokens=tokens, num_experts=256, top_k=8, hidden=3072, intermediate=1536 // moe_tp,
                          expert_tokens=tuple(int(n) for n in routing), dtype="fp4", weight_dtype="nvfp4")
        predicted_us = estimator.predict_us([layer], gpu)[0]
        assert measured_us / 1.35 <= predicted_us <= measured_us * 1.35, (tokens, predicted_us)


def test_nvfp4_is_refused_off_blackwell_data_centre_gpus_and_for_other_families() -> None:
    with pytest.raises(ServesimError, match="compute capability 10.x"):
        _ops("vllm", "minimax-m2.5", gpu="H200")
    with pytest.raises(ServesimError, match="CUTLASS FP4 MoE"):  # SGLang keeps MiniMax-M2 off TRT-LLM
        _ops("sglang", "minimax-m2.5")
    with pytest.raises(ServesimError, match="no modelled NVFP4 checkpoint"):
        _ops("vllm", "mixtral-8x7b")
    with pytest.raises(ServesimError, match="not nvfp4 ones"):
        expand("vllm", get_model("minimax-m2.5"), get_gpu("B200"), BatchSpec(decodes=(1,)), 4, dtype="nvfp4",
               moe_backend="triton")


def test_the_cli_says_why_in_one_line_and_the_suggested_dtype_runs() -> None:
    args = ["latency", "--model", "mixtral-8x7b", "--gpu", "B200", "--tp", "8", "--batch-size", "1", "--input-len",
            "64", "--output-len", "2"]
    refused = CliRunner().invoke(main, [*args, "--dtype", "nvfp4"])
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    (line,) = refused.output.strip().splitlines()
    suggested = line.split("use --dtype ")[1].split()[0]
    assert CliRunner().invoke(main, [*args, "--dtype", suggested]).exit_code == 0


def test_a_plan_marks_gpus_without_native_nvfp4_unsupported_and_plans_the_others() -> None:
    result = CliRunner().invoke(main, ["plan", "--model", "minimax-m2.5", "--gpus", "H200,B200", "--tp", "4",
                                       "--dtype", "nvfp4", "--quick", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    unsupported = payload["unsupported"]
    assert unsupported and all(u["gpu"] == "H200" and "compute capability 10.x" in u["reason"] for u in unsupported)
    assert payload["options"] and {option["gpu"] for option in payload["options"]} == {"B200"}


def test_a_modelopt_nvfp4_config_declares_nvfp4() -> None:
    config = {"quant_method": "modelopt", "quant_algo": "NVFP4", "config_groups": {}}
    assert checkpoint_quant(config) == "nvfp4"
    assert checkpoint_quant({"quant_method": "modelopt", "quant_algo": "FP8"}) == "modelopt"


def test_measured_nvfp4_rows_replay_as_nvfp4_gpt_oss_ones_as_mxfp4() -> None:
    from servesim.validate.silicon import _weight_format

    assert _weight_format("MiniMaxAI/MiniMax-M2.5", "nvfp4") == "nvfp4"
    assert _weight_format("moonshotai/Kimi-K2.5", "nvfp4") == "nvfp4"
    assert _weight_format("openai/gpt-oss-120b", "nvfp4") == "mxfp4"


def test_the_launch_command_serves_nvidias_nvfp4_checkpoint() -> None:
    from servesim.serving.deployment import build_deployment

    def command(engine: str, model: str) -> str:
        return build_deployment(get_model(model), get_gpu("B200"), Parallelism(8, 1), engine,
                                dtype="nvfp4").launch_command()

    vllm = command("vllm", "minimax-m2.5")
    assert "nvidia/MiniMax-M2.5-NVFP4" in vllm and "--quantization" not in vllm  # vLLM reads the checkpoint's format
    sglang = command("sglang", "kimi-k2.5")
    assert "--model-path nvidia/Kimi-K2.5-NVFP4" in sglang
    assert "--quantization modelopt_fp4" in sglang and sglang.count("--moe-runner-backend flashinfer_trtllm") == 1
    # the FP8 MoE kernel's switches do not apply to NVFP4 experts, even when the default is asked for by name
    explicit = build_deployment(get_model("kimi-k2.5"), get_gpu("B200"), Parallelism(8, 1), "vllm", dtype="nvfp4",
                                moe_backend="flashinfer-trtllm").launch_command()
    assert "VLLM_USE_FLASHINFER_MOE_FP8" not in explicit


def test_nvfp4_linears_are_timed_near_their_measured_layers() -> None:
    from servesim.kernels.types import Fp4Linear

    # aiconfigurator's B200 table (SGLang 0.5.14, sglang_flashinfer_cutedsl_nvfp4): n = k = 8,192 takes 13.3 us at
    # m = 64 and 128.7 us at m = 4,096; the FP8 per-tensor layer of m = 4,096 takes 234.6 us.
    estimator, gpu = get_estimator("mlp"), get_gpu("B200")
    for m, measured_us in ((64, 13.3), (4096, 128.7)):
        predicted_us = estimator.predict_us([Fp4Linear(m=m, n=8192, k=8192)], gpu)[0]
        assert measured_us / 1.35 <= predicted_us <= measured_us * 1.35, (m, predicted_us)


def test_vllm_takes_the_nvfp4_checkpoints_fp8_kv_cache_by_default() -> None:
    from servesim.serving.deployment import build_deployment

    def deployment(engine: str, **overrides):
        return build_deployment(get_model("kimi-k2.5"), get_gpu("B200"), Parallelism(4, 1), engine, dtype="nvfp4",
                                **overrides)

    # vLLM's "auto" reads the checkpoint's static 8-bit float kv_cache_scheme: half the bytes, twice the tokens
    vllm, explicit_auto = deployment("vllm"), deployment("vllm", kv_cache_dtype="auto")
    assert vllm.kv_cache_dtype == explicit_auto.kv_cache_dtype == "fp8"
    assert deployment("sglang").kv_cache_dtype == "auto"
    int4 = build_deployment(get_model("kimi-k2.5"), get_gpu("B200"), Parallelism(4, 1), "vllm", dtype="int4")
    assert int4.kv_cache_dtype == "auto"


def test_a_simulated_plan_names_a_gpus_unsupported_layouts_in_one_note() -> None:
    result = CliRunner().invoke(main, ["plan", "--model", "minimax-m2.5", "--gpus", "B200,H200", "--tp", "4",
                                       "--dtype", "nvfp4", "-n", "100"])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if "(unsupported)" in line]
    assert len(notes) == 1 and notes[0].startswith("H200 TP4, TP4xPP2 (unsupported): NVFP4 weights")


def test_nvidias_nvfp4_config_files_load_as_nvfp4_checkpoints_named_after_the_file() -> None:
    from servesim.errors import ServesimError as Missing
    from servesim.data.aiconfigurator import package_dir

    try:
        path = package_dir() / "model_configs" / "nvidia--MiniMax-M2.5-NVFP4_config.json"
    except Missing:
        pytest.skip("aiconfigurator-core is not installed")
    model = get_model(str(path))
    assert (model.name, model.checkpoint_quant) == ("nvidia--MiniMax-M2.5-NVFP4", "nvfp4")
    result = CliRunner().invoke(main, ["latency", "--model", str(path), "--gpu", "B200", "--tp", "4", "--dtype",
                                       "nvfp4", "--batch-size", "2", "--input-len", "256", "--output-len", "4"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("nvidia--MiniMax-M2.5-NVFP4 on TP4 B200")
