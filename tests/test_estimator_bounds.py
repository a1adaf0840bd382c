"""No estimator predicts a kernel faster than its compulsory traffic at peak bandwidth or its FLOPs at peak rate."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.cli import main
from servesim.estimator import base
from servesim.estimator.base import ESTIMATORS, get_estimator
from servesim.estimator.bounds import lower_bound_us
from servesim.hardware import load_catalogue
from servesim.kernels.types import (
    KERNEL_TYPES,
    AddRMSNorm,
    AttentionDecode,
    AttentionPrefill,
    Embedding,
    FusedMoE,
    Gemm,
    KvWrite,
    Quantize,
    RMSNorm,
    Rope,
    RouterTopK,
    Sampling,
    ScaledMM,
    SiluMul,
)

CATALOGUE = load_catalogue()
GPUS = sorted(CATALOGUE)
size = st.integers(1, 16384)
small = st.integers(1, 256)
resident = st.sampled_from([0.0, 0.0, 0.5, 1.0])


@st.composite
def kernels(draw, gpu):
    """One kernel of every category the expanders emit, of random shape, as ``gpu`` can run them (FP8 where it has
    an FP8 Tensor rate, FlashAttention-3 on Hopper)."""
    fp8 = gpu.tensor_flops_per_sm_per_cycle.get("fp8", 0) > 0
    backends = ["fa2", "flashinfer"] + (["fa3"] if gpu.compute_capability.startswith("9") else [])
    heads = draw(st.sampled_from([(8, 8), (32, 8), (64, 8), (16, 2), (128, 128)]))
    head_dim = draw(st.sampled_from([64, 128, 256]))
    kv_lens = tuple(draw(st.lists(st.integers(1, 32768), min_size=1, max_size=16)))
    query_lens = tuple(draw(st.integers(1, kv)) for kv in kv_lens)
    experts = draw(st.sampled_from([8, 64, 128]))
    top_k = draw(st.sampled_from([1, 2, 8]))
    tokens = draw(st.integers(1, 4096))
    pairs = tokens * top_k
    expert_tokens = tuple(pairs // experts + (1 if e < pairs % experts else 0) for e in range(experts))
    result = [
        Gemm(m=draw(size), n=draw(size), k=draw(size), bias=draw(st.booleans()), l2_resident_fraction=draw(resident)),
        AttentionPrefill(query_lens=query_lens, kv_lens=kv_lens, num_heads=heads[0], num_kv_heads=heads[1],
                         head_dim=head_dim, backend=draw(st.sampled_from(backends)),
                         l2_resident_fraction=draw(resident)),
        AttentionDecode(kv_lens=kv_lens, num_heads=heads[0], num_kv_heads=heads[1], head_dim=head_dim,
                        backend=draw(st.sampled_from(backends)),
                        l2_resident_fraction=draw(resident)),
        RMSNorm(rows=draw(size), dim=draw(st.integers(64, 16384))),
        AddRMSNorm(rows=draw(size), dim=draw(st.integers(64, 16384))),
        SiluMul(tokens=draw(size), dim=draw(st.integers(64, 32768))),
        Rope(tokens=draw(size), num_heads=heads[0], num_kv_heads=heads[1], head_dim=head_dim),
        KvWrite(tokens=draw(size), num_kv_heads=heads[1], head_dim=head_dim),
        Embedding(tokens=draw(size), hidden=draw(st.integers(64, 16384)), vocab_rows=draw(st.integers(1000, 160000))),
        RouterTopK(tokens=tokens, num_experts=experts, top_k=top_k, renormalize=draw(st.booleans())),
        FusedMoE(tokens=tokens, num_experts=experts, top_k=top_k, hidden=draw(st.integers(256, 8192)),
                 intermediate=draw(st.integers(64, 16384)), expert_tokens=expert_tokens),
        Sampling(rows=draw(small), vocab=draw(st.integers(1000, 260000))),
        Quantize(rows=draw(size), cols=draw(st.integers(64, 16384)), engine=draw(st.sampled_from(["vllm", "sglang"])),
                 l2_resident_fraction=draw(resident)),
    ]
    if fp8:
        scale = draw(st.sampled_from(["tensor", "block"]))
        result.append(ScaledMM(m=draw(size), n=draw(size), k=draw(size), scale=scale,
                               library=draw(st.sampled_from(["cutlass", "sgl_kernel", "cublaslt"]))
                               if scale == "tensor" else "deepgemm", l2_resident_fraction=draw(resident)))
    return result


def test_the_strategy_covers_every_kernel_category():
    assert set(KERNEL_TYPES) == {"gemm", "scaled_mm", "quant", "attn_prefill", "attn_decode", "rmsnorm",
                                 "add_rmsnorm", "silu_mul", "rope", "kv_write", "embedding", "router_topk", "moe",
                                 "sampling"}


@pytest.mark.parametrize("estimator_name", sorted(ESTIMATORS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), gpu_name=st.sampled_from(GPUS))
def test_no_estimator_predicts_a_kernel_faster_than_its_peak_bound(estimator_name, data, gpu_name):
    gpu = CATALOGUE[gpu_name]
    batch = data.draw(kernels(gpu))
    times = get_estimator(estimator_name).predict_us(batch, gpu)
    bound = lower_bound_us(batch, gpu)
    assert np.all(np.isfinite(times))
    assert np.all(times >= bound), [(k.category, k.shape(), t, b) for k, t, b in zip(batch, times, bound) if t < b]


def test_the_bound_counts_only_the_traffic_that_crosses_dram():
    """A measured kernel whose data L2 held moves it at the L2's bandwidth; a serving kernel at the DRAM's."""
    gpu = CATALOGUE["L40S"]
    cold = Gemm(m=16, n=4096, k=4096)
    warm = Gemm(m=16, n=4096, k=4096, l2_resident_fraction=1.0)
    cold_us, warm_us = lower_bound_us([cold, warm], gpu)
    assert cold_us == pytest.approx(cold.bytes_moved() / (gpu.dram_bandwidth_gbps * 1e3))
    assert warm_us == pytest.approx(warm.bytes_moved() / (gpu.l2_bandwidth_gbps * 1e3))
    assert warm_us < cold_us


def test_a_registered_estimator_that_ignores_the_bound_is_held_to_it(monkeypatch):
    class Instant:
        name, label = "instant", "instant (test)"

        def trained_gpus(self, category=None):
            return ()

        def predict_us(self, kernels, gpu):
            return np.zeros(len(kernels))

    monkeypatch.setitem(ESTIMATORS, "instant", Instant)
    gpu, batch = CATALOGUE["H100-SXM"], [Gemm(m=4096, n=4096, k=4096), RMSNorm(rows=8, dim=8192)]
    estimator = base.get_estimator("instant")
    np.testing.assert_array_equal(estimator.predict_us(batch, gpu), lower_bound_us(batch, gpu))
    assert estimator.name == "instant" and not estimator.falls_back("rmsnorm", gpu)


def test_mixtral_decode_is_no_faster_than_reading_its_weights():
    """Mixtral-8x7B, TP2 on A100-80GB, 8 sequences: 16 routed (token, expert) pairs over 8 experts reach all of
    them, so every decode step reads every weight: 46.7 B BF16 parameters, 46.7 GB per GPU of two, at 2,039 GB/s
    is 22.9 ms (before the bound, the MLP made it 21.9 ms)."""
    result = CliRunner().invoke(main, ["latency", "--model", "mixtral-8x7b", "--gpu", "A100", "--tp", "2",
                                       "--batch-size", "8", "--input-len", "128", "--output-len", "128", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    tpot_ms = payload["tpot_ms"]
    assert tpot_ms >= 22.9
