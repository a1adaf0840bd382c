"""Feature vectors: totals equal closed forms, the vectorised GEMM path equals decomposition + scheduling, the
explain CLI shows what a user needs."""

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from servesim.cli.kernel_explain import SUBCOMMANDS, attention, gemm, moe, rmsnorm, scaled_mm, silu_mul
from servesim.errors import ServesimError
from servesim.features import FEATURE_NAMES, features_of, kernel_features, roofline_time_us
from servesim.hardware import get_gpu
from servesim.kernels.types import AttentionDecode, AttentionPrefill, Gemm, RMSNorm, ScaledMM

H100, H20, A100 = get_gpu("H100-SXM"), get_gpu("H20"), get_gpu("A100-SXM-80GB")

SHAPES = [(4096, 8192, 8192), (1, 4096, 4096), (77, 129, 65), (1000, 3000, 1000), (8192, 28672, 4096), (16, 128256, 4096)]


@pytest.mark.parametrize("gpu", [H100, A100, H20])
def test_vectorised_gemm_features_equal_decompose_and_schedule(gpu):
    kernels = [Gemm(m=m, n=n, k=k) for m, n, k in SHAPES] + [ScaledMM(m=m, n=n, k=k) for m, n, k in SHAPES[:3]]
    gemms = kernel_features(kernels[: len(SHAPES)], gpu)
    for i, kernel in enumerate(kernels[: len(SHAPES)]):
        slow = features_of(kernel, gpu)
        np.testing.assert_allclose(gemms.values[i], [slow[n] for n in FEATURE_NAMES], rtol=1e-9)
    if "fp8" in gpu.tensor_flops_per_sm_per_cycle:
        fp8 = kernel_features(kernels[len(SHAPES):], gpu)
        for i, kernel in enumerate(kernels[len(SHAPES):]):
            np.testing.assert_allclose(fp8.values[i], [features_of(kernel, gpu)[n] for n in FEATURE_NAMES], rtol=1e-9)


@pytest.mark.parametrize("gpu_name", ["H100-SXM", "B200", "L40S", "RTX-PRO-6000"])
@pytest.mark.parametrize("library,scale", [("cutlass", "tensor"), ("sgl_kernel", "tensor"), ("deepgemm", "block")])
def test_vectorised_scaled_mm_features_equal_decompose_and_schedule_for_every_library(gpu_name, library, scale):
    gpu = get_gpu(gpu_name)
    kernels = [ScaledMM(m=m, n=n, k=k, library=library, scale=scale) for m, n, k in SHAPES]
    fast = kernel_features(kernels, gpu)
    for i, kernel in enumerate(kernels):
        np.testing.assert_allclose(fast.values[i], [features_of(kernel, gpu)[n] for n in FEATURE_NAMES], rtol=1e-9)


@pytest.mark.parametrize("kernel", [Gemm(m=8, n=4096, k=4096), ScaledMM(m=8, n=4096, k=4096),
                                    AttentionDecode(kv_lens=(4096,) * 16, num_heads=32, num_kv_heads=8, head_dim=128,
                                                    backend="flashinfer")])
def test_what_l2_already_holds_leaves_dram_and_only_dram(kernel):
    gpu = get_gpu("L40S")
    cold = features_of(kernel, gpu)
    warm_kernel = replace(kernel, l2_resident_fraction=0.75)
    warm = features_of(warm_kernel, gpu)
    assert warm["gpu_dram_bytes"] == pytest.approx(0.25 * cold["gpu_dram_bytes"])
    assert warm["sm_dram_cycles"] == pytest.approx(0.25 * cold["sm_dram_cycles"])
    # Decode GEMMs read their weights and decode attention its KV cache: DRAM-bound, so their tiles and roofline
    # time shorten as well.
    timed = ("theoretical_time_us", "sm_busy_cycles_max", "sm_busy_cycles_mean")
    assert all(warm[n] < cold[n] for n in timed)
    assert all(warm[n] == cold[n] for n in FEATURE_NAMES if "dram" not in n and n not in timed)
    fast = kernel_features([kernel, warm_kernel], gpu).values  # the vectorised path agrees
    np.testing.assert_allclose(fast[1], [warm[n] for n in FEATURE_NAMES], rtol=1e-9)


def test_gpu_tensor_ops_equal_flops_and_roofline_is_the_slowest_pipe():
    kernel = Gemm(m=4096, n=8192, k=8192)
    f = features_of(kernel, H20)
    assert f["gpu_tensor_ops"] == kernel.flops()
    assert f["theoretical_time_us"] == pytest.approx(f["sm_tensor_cycles"] / H20.sustained_clock_mhz)
    # compute-bound: within 10% of FLOPs over the datasheet peak (wave quantisation adds the rest)
    peak_us = kernel.flops() / (H20.tensor_tflops("bf16") * 1e6)
    assert peak_us <= roofline_time_us(kernel, H20) <= 1.1 * peak_us


def test_decode_is_memory_bound_and_causal_attention_counts_masked_ops():
    decode = AttentionDecode(kv_lens=(4096,) * 64, num_heads=32, num_kv_heads=8, head_dim=128)
    f = features_of(decode, H100)
    pipes = {p: f[f"sm_{p}_cycles"] for p in ("tensor", "fma", "xu", "dram", "l2", "smem")}
    assert max(pipes, key=pipes.get) in ("dram", "l2")
    causal = AttentionPrefill(query_lens=(2048,), kv_lens=(2048,), num_heads=32, num_kv_heads=8, head_dim=128)
    full = replace(causal, causal=False)
    assert features_of(causal, H100)["gpu_tensor_ops"] == causal.flops() < features_of(full, H100)["gpu_tensor_ops"]


def test_kernel_features_takes_one_category_and_keeps_order():
    with pytest.raises(ServesimError):
        kernel_features([Gemm(m=1, n=2, k=3), RMSNorm(rows=1, dim=8)], H100)
    norms = [RMSNorm(rows=r, dim=4096) for r in (1, 1000, 1)]
    values = kernel_features(norms, H100)
    assert values.values.shape == (3, len(FEATURE_NAMES))
    np.testing.assert_array_equal(values.values[0], values.values[2])
    assert values.column("num_tasks").tolist() == [1, 1000, 1]


def test_explain_gemm_prints_tasks_occupancy_distribution_features_and_bottleneck():
    result = CliRunner().invoke(gemm, ["--gpu", "H20", "--m", "4096", "--n", "8192", "--k", "8192", "--explain"])
    assert result.exit_code == 0, result.output
    for text in ("tasks 1,024", "CTA/SM", "per SM: tasks min/mean/max", "sm_tensor_cycles", "<- bottleneck",
                 "tensor-bound"):
        assert text in result.output


@pytest.mark.parametrize(("command", "args"), [
    (attention, ["--q", "512,2048", "--kv", "512,4096", "--backend", "flashinfer"]),
    (attention, ["--kv", "1000,3000", "--backend", "fa2"]),
    (rmsnorm, ["--rows", "64", "--dim", "4096", "--fused-add"]),
    (silu_mul, ["--tokens", "64", "--dim", "14336"]),
    (moe, ["--tokens", "64", "--experts", "8", "--top-k", "2", "--hidden", "4096", "--intermediate", "7168"]),
    (scaled_mm, ["--m", "64", "--n", "4096", "--k", "4096", "--scale", "block"]),
    (scaled_mm, ["--m", "64", "--n", "4096", "--k", "4096", "--library", "sgl_kernel"]),
])
def test_every_subcommand_gives_json_with_features(command, args):
    result = CliRunner().invoke(command, ["--gpu", "H100-SXM", *args, "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["theoretical_time_us"] > 0 and payload["bottleneck"] in payload["pipe_time_us"]
    assert set(FEATURE_NAMES) <= set(payload["features"])
    assert payload["estimator"] == "mlp" and payload["predicted_time_us"] > 0


@pytest.mark.parametrize("estimator", ["mlp", "roofline"])
def test_kernel_command_prints_the_time_the_estimator_predicts(estimator):
    from servesim.estimator import get_estimator
    from servesim.hardware import get_gpu
    from servesim.kernels.types import Gemm

    args = ["--gpu", "H20", "--m", "2048", "--n", "2560", "--k", "8192", "--estimator", estimator]
    payload = json.loads(CliRunner().invoke(gemm, [*args, "--json"]).output)
    expected_us = get_estimator(estimator).predict_us([Gemm(m=2048, n=2560, k=8192)], get_gpu("H20"))[0]
    assert payload["predicted_time_us"] == pytest.approx(expected_us, rel=1e-12)
    table = CliRunner().invoke(gemm, args).output
    assert f"{estimator} (ms)" in table and f"{expected_us / 1e3:.4f}" in table


def test_bad_input_is_a_one_line_error():
    result = CliRunner().invoke(attention, ["--gpu", "H100-SXM", "--q", "5,6", "--kv", "4"])
    assert result.exit_code != 0 and isinstance(result.exception, ServesimError)
    result = CliRunner().invoke(scaled_mm, ["--gpu", "A100-SXM-80GB", "--m", "1", "--n", "8", "--k", "8"])
    assert isinstance(result.exception, ServesimError) and "fp8" in str(result.exception)
    result = CliRunner().invoke(scaled_mm, ["--gpu", "H100-SXM", "--m", "1", "--n", "8", "--k", "8", "--scale",
                                            "block", "--library", "cutlass"])
    assert isinstance(result.exception, ServesimError) and "no block-scaled MM in library 'cutlass'" in str(
        result.exception)
    assert {c.name for c in SUBCOMMANDS} == {"gemm", "scaled-mm", "attention", "rmsnorm", "silu-mul", "moe"}


@pytest.mark.parametrize("command,args,message", [
    (moe, ["--tokens", "4", "--experts", "8", "--top-k", "9"], "--top-k of at most 8"),
    (moe, ["--tokens", "4", "--experts", "2", "--top-k", "1", "--expert-tokens", "5,-1"], "from 0 to the 4 tokens"),
    (moe, ["--tokens", "4", "--experts", "2", "--top-k", "1", "--expert-tokens", "a,b"], "comma-separated integers"),
    (attention, ["--q", "1", "--kv", "4096,3000000000"], "from 1 to 2,147,483,647"),
    (gemm, ["--m", "2147483647", "--n", "8192", "--k", "8192"], "536,870,912 tasks"),
])
def test_impossible_kernels_are_refused_before_any_arrays(command, args, message):
    """A kernel no engine launches (top-k above the experts, a count beyond int32, billions of tiles) is a one-line
    error, not a traceback or an allocation of tens of gigabytes."""
    if command is moe:
        args = [*args, "--hidden", "64", "--intermediate", "64"]
    result = CliRunner().invoke(command, ["--gpu", "H100", *args])
    assert isinstance(result.exception, ServesimError), result.output
    assert message in str(result.exception) and "\n" not in str(result.exception)


def test_kernel_dimensions_beyond_int32_are_refused_as_they_are_parsed():
    result = CliRunner().invoke(gemm, ["--gpu", "H100", "--m", str(2**63), "--n", "8", "--k", "8"])
    assert result.exit_code == 2 and "1<=x<=2147483647" in result.output
