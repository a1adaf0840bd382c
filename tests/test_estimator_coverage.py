"""Which GPUs' predictions stand on measured kernels, and what output says about the others."""

import json

import numpy as np
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


def test_element_wise_networks_give_way_to_the_roofline_on_architectures_they_never_saw():
    """The RMSNorm, SiLU-and-mul and RoPE networks learned from an Ampere and a Hopper GPU: on Ada and Blackwell GPUs
    the roofline times those kernels; on Ampere and Hopper GPUs (measured or not) the networks do, and the GEMM
    network, trained on every architecture, times GEMMs everywhere."""
    from servesim.estimator.roofline import RooflineEstimator
    from servesim.kernels.types import Gemm, RMSNorm, Rope, SiluMul

    mlp = get_estimator("mlp")
    element_wise = [RMSNorm(rows=4096, dim=8192), SiluMul(tokens=512, dim=14336),
                    Rope(tokens=2048, num_heads=32, num_kv_heads=8, head_dim=128)]
    for name in ("L40S", "L4", "RTX-4090", "B200", "GB300", "RTX-PRO-6000"):
        gpu = get_gpu(name)
        assert all(mlp.falls_back(k.category, gpu) for k in element_wise) and not mlp.falls_back("gemm", gpu)
        np.testing.assert_array_equal(mlp.predict_us(element_wise, gpu),
                                      RooflineEstimator().predict_us(element_wise, gpu))
    for name in ("A100", "H100", "H200", "H20", "A40", "A10G"):
        assert not any(mlp.falls_back(k.category, get_gpu(name)) for k in element_wise)
    assert not mlp.falls_back("gemm", get_gpu("L4")) and not mlp.falls_back("kv_write", get_gpu("L4"))
    assert not any(get_estimator("roofline").falls_back(k.category, get_gpu("L4")) for k in element_wise)
    h100 = get_gpu("H100")
    assert not np.array_equal(mlp.predict_us([Gemm(m=64, n=4096, k=4096)], h100),
                              RooflineEstimator().predict_us([Gemm(m=64, n=4096, k=4096)], h100))


def test_every_category_the_roofline_takes_over_is_named_in_notes_and_json():
    mlp = get_estimator("mlp")
    launched = launched_by("vllm", get_model("llama3-8b"), "bf16")
    l40s, l40, h20 = estimator_coverage(mlp, [get_gpu("L40S"), get_gpu("L40"), get_gpu("H20")], "bf16", launched)
    # Measured GEMMs and attention, element-wise kernels on the roofline.
    assert l40s.measured and l40s.roofline_categories == ("rmsnorm", "rope", "silu_mul")
    assert l40s.extrapolated_categories == ("rmsnorm", "rope", "silu_mul") and l40s.extrapolated_from == ()
    assert l40s.note().startswith("L40S: rmsnorm, rope, silu_mul timed by the roofline")
    assert l40s.to_json()["roofline_categories"] == ["rmsnorm", "rope", "silu_mul"]
    assert l40s.to_json()["roofline_trained_gpus"] == ["A100-SXM-80GB", "H100-SXM"]
    # Unmeasured: the networks' categories are named as extrapolated, the roofline's as the roofline's.
    assert not l40.measured and "gemm" in l40.extrapolated_categories and "rmsnorm" in l40.extrapolated_categories
    assert "rmsnorm" not in l40.note().split(" kernel times extrapolated")[0]
    assert "rmsnorm, rope, silu_mul timed by the roofline" in l40.note()
    assert h20.roofline_categories == () and "rmsnorm" in h20.note() and "roofline" not in h20.note()


def test_latency_output_says_which_categories_the_roofline_timed():
    args = ["latency", "--model", "llama3-8b", "--gpu", "B200", "--batch-size", "4", "--input-len", "128",
            "--output-len", "8"]
    table = CliRunner().invoke(main, args)
    assert table.exit_code == 0, table.output
    assert "B200: rmsnorm, rope, silu_mul timed by the roofline" in table.output
    payload = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    (b200,) = payload["estimator_coverage"]
    assert b200["roofline_categories"] == ["rmsnorm", "rope", "silu_mul"]
