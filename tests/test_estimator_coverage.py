"""Which GPUs' predictions stand on measured kernels, and what output says about the others."""

import json

from click.testing import CliRunner

from servesim.cli import main
from servesim.estimator import get_estimator
from servesim.estimator.coverage import coverage, estimator_coverage, launched_by
from servesim.hardware import get_gpu
from servesim.models import get_model

MEASURED = tuple(get_gpu(name) for name in ("A100", "H100", "H200", "L40S", "B200"))


def test_a_measured_gpu_gets_no_note():
    (h100,) = estimator_coverage(get_estimator("mlp"), [get_gpu("H100")], "bf16")
    assert h100.measured and h100.note() is None


def test_a_gpu_like_a_measured_one_is_extrapolated_within_the_range():
    h800 = coverage(get_gpu("H800"), MEASURED, "bf16")
    assert not h800.measured and h800.out_of_range == ()
    assert "not measured" in h800.note() and "within their range" in h800.note()


def test_the_h20_lies_below_every_measured_gpu_in_sms_and_tensor_rate_per_sm():
    bf16 = coverage(get_gpu("H20"), MEASURED, "bf16")
    assert {o.quantity for o in bf16.out_of_range} == {"SMs", "BF16 Tensor FLOPs/SM/clock"}
    sms = next(o for o in bf16.out_of_range if o.quantity == "SMs")
    assert (sms.value, sms.trained_min, sms.trained_max) == (78, 108, 148)
    assert "SMs 78 (measured 108–148)" in bf16.note() and "uncertain" in bf16.note()
    # FP8's range comes from the GPUs with an FP8 Tensor rate: the A100's absence does not widen it downwards.
    fp8 = coverage(get_gpu("H20"), MEASURED, "fp8-block")
    tensor = next(o for o in fp8.out_of_range if o.quantity == "FP8 Tensor FLOPs/SM/clock")
    assert tensor.trained_min == get_gpu("L40S").tensor_flops_per_sm_per_cycle["fp8"]


def test_an_analytical_estimator_stands_on_no_measurement():
    assert estimator_coverage(get_estimator("roofline"), [get_gpu("H20")], "bf16") == ()


def test_plans_flag_the_unmeasured_gpu_in_the_table_and_in_json():
    args = ["plan", "--model", "llama3-70b", "--tp", "4", "--pp", "1", "--gpus", "H100,H20", "--quick"]
    table = CliRunner().invoke(main, args)
    assert table.exit_code == 0, table.output
    notes = [line for line in table.output.splitlines() if "not measured" in line]
    assert len(notes) == 1 and notes[0].startswith("H20: ")
    payload = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    assert {c["gpu"]: c["measured"] for c in payload["estimator_coverage"]} == {"H100-SXM": True, "H20": False}


def test_a_category_trained_on_fewer_gpus_is_judged_on_its_own():
    """The element-wise networks learned from the A100 and H100 alone: an H200 RMSNorm is extrapolated though the
    H200's GEMMs were measured, and outside those two GPUs' range it is in DRAM bytes per SM per clock, not in any
    Tensor rate (RMSNorm does no Tensor work)."""
    mlp = get_estimator("mlp")
    assert mlp.trained_gpus("rmsnorm") == ("A100-SXM-80GB", "H100-SXM")
    assert "H200" in mlp.trained_gpus("gemm") and "H200" in mlp.trained_gpus()
    result = CliRunner().invoke(main, ["kernel", "rmsnorm", "--gpu", "H200", "--rows", "4096", "--dim", "8192",
                                       "--json"])
    payload = json.loads(result.output)
    assert payload["estimator_coverage"]["measured"] is False
    assert [o["quantity"] for o in payload["estimator_coverage"]["out_of_range"]] == ["DRAM bytes/SM/clock"]
    gemm = CliRunner().invoke(main, ["kernel", "gemm", "--gpu", "H200", "--m", "64", "--n", "4096", "--k", "4096"])
    assert gemm.exit_code == 0 and "not measured" not in gemm.output


def test_a_measured_gpu_names_the_categories_it_launches_that_were_measured_elsewhere():
    """An H200 plan's GEMMs and attention were measured on it, its RMSNorm, RoPE and SiLU-and-mul on the A100 and
    H100 only; an MoE model launches no SiLU-and-mul kernel of its own (the fused MoE holds it), so none is named."""
    h200, h100 = get_gpu("H200"), get_gpu("H100")
    mlp = get_estimator("mlp")
    dense = estimator_coverage(mlp, [h200, h100], "bf16", launched_by("vllm", get_model("llama3-8b"), "bf16"))
    assert dense[0].measured and dense[0].extrapolated_categories == ("rmsnorm", "rope", "silu_mul")
    assert dense[0].extrapolated_from == ("A100-SXM-80GB", "H100-SXM")
    assert "H200: rmsnorm, rope, silu_mul kernels not measured on it" in dense[0].note()
    assert dense[1].note() is None
    moe = estimator_coverage(mlp, [h200], "bf16", launched_by("vllm", get_model("qwen3-30b-a3b"), "bf16"))
    assert moe[0].extrapolated_categories == ("rmsnorm", "rope")
