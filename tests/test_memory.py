"""Memory accounting checked against hand calculations."""

import pytest

from servesim.errors import ServesimError
from servesim.hardware import get_gpu
from servesim.models import get_model
from servesim.models.memory import (
    GIB,
    MemoryReserve,
    kv_bytes_per_token_per_gpu,
    plan_memory,
    weight_bytes_per_gpu,
)
from servesim.models.parallel import Parallelism, stage_layer_counts, validate_parallelism
from servesim.serving.deployment import build_deployment

NO_RESERVE = MemoryReserve(0.0, 0.0, 0.0)


def test_llama3_70b_kv_is_320_kib_per_token_across_the_model():
    model = get_model("llama3-70b")
    assert model.kv_bytes_per_token(2) == 320 * 1024
    # TP4 splits the 8 KV heads two per GPU: a quarter of it on each GPU.
    assert kv_bytes_per_token_per_gpu(model, Parallelism(tp=4), 0) == 80 * 1024


def test_llama3_70b_weights_per_gpu_at_tp4_match_hand_count():
    model = get_model("llama3-70b")
    # Per layer and GPU: attention 8192*(2048+2*256) + 2048*8192, MLP 3*8192*28672/4, two norms of 8192.
    per_layer = 8192 * (2048 + 512) + 2048 * 8192 + 3 * 8192 * 28672 // 4 + 2 * 8192
    vocab_rows = 128256 // 4  # 128256 is already a multiple of 64
    expected = (80 * per_layer + 2 * vocab_rows * 8192 + 8192) * 2
    assert weight_bytes_per_gpu(model, Parallelism(tp=4), 0) == expected
    assert expected / GIB == pytest.approx(32.856, abs=1e-3)


def test_whole_model_weights_equal_parameter_count_at_tp1():
    for name in ("llama3-8b", "qwen2.5-7b", "qwen3-30b-a3b", "mixtral-8x7b"):
        model = get_model(name)
        assert weight_bytes_per_gpu(model, Parallelism(), 0) == pytest.approx(2 * model.total_params(), rel=1e-4)


def test_fp8_halves_linear_weights_but_not_embeddings():
    model = get_model("llama3-8b")
    bf16 = weight_bytes_per_gpu(model, Parallelism(), 0, "bf16")
    fp8 = weight_bytes_per_gpu(model, Parallelism(), 0, "fp8")
    embeddings = 2 * model.vocab_size * model.hidden_size * 2
    assert fp8 == pytest.approx((bf16 - embeddings) / 2 + embeddings, rel=1e-3)


def test_kv_heads_are_replicated_beyond_their_count():
    model = get_model("llama3-8b")  # 8 KV heads
    assert kv_bytes_per_token_per_gpu(model, Parallelism(tp=8), 0) == 2 * 32 * 1 * 128 * 2
    assert kv_bytes_per_token_per_gpu(model, Parallelism(tp=16), 0) == 2 * 32 * 1 * 128 * 2


def test_pipeline_stages_follow_vllm_split_and_hold_embedding_and_head():
    assert stage_layer_counts(80, 3) == (27, 27, 26)
    assert stage_layer_counts(32, 4) == (8, 8, 8, 8)
    assert sum(stage_layer_counts(94, 8)) == 94
    model = get_model("llama3-70b")
    par = Parallelism(tp=1, pp=2)
    first, last = (weight_bytes_per_gpu(model, par, s) for s in (0, 1))
    total = weight_bytes_per_gpu(model, Parallelism(), 0)
    assert first + last == pytest.approx(total)


def test_kv_capacity_is_what_the_fraction_leaves_after_weights_and_reserve():
    model = get_model("llama3-8b")
    plan = plan_memory(model, Parallelism(), 80 * GIB, 0.9, MemoryReserve(1 * GIB, 0.5 * GIB, 0.5 * GIB), 16)
    weights = weight_bytes_per_gpu(model, Parallelism(), 0)
    assert plan.kv_cache_bytes == pytest.approx(72 * GIB - 2 * GIB - weights)
    per_token = 128 * 1024
    assert plan.kv_tokens == int(plan.kv_cache_bytes // (per_token * 16)) * 16
    assert plan.max_sequences(1000) == plan.kv_tokens // 1008  # 1000 tokens take 63 blocks of 16


def test_llama3_70b_does_not_fit_one_h100_but_fits_four():
    model, gpu = get_model("llama3-70b"), get_gpu("H100")
    one = build_deployment(model, gpu, Parallelism(1)).memory
    assert not one.fits and one.kv_tokens == 0
    assert one.needed_bytes > gpu.memory_bytes
    four = build_deployment(model, gpu, Parallelism(4)).memory
    assert four.fits and four.kv_tokens > 100_000


@pytest.mark.parametrize(
    "name,tp,pp,message",
    [
        ("llama3-70b", 3, 1, "does not divide the 64 attention heads"),
        ("qwen2.5-7b", 8, 1, "does not divide the 28 attention heads"),
        ("qwen3-30b-a3b", 4, 1, None),
        ("llama3-8b", 1, 40, "exceeds the 32 layers"),
    ],
)
def test_layouts_the_engines_refuse_are_errors(name, tp, pp, message):
    model = get_model(name)
    if message is None:
        validate_parallelism(model, Parallelism(tp, pp))
        return
    with pytest.raises(ServesimError, match=message):
        validate_parallelism(model, Parallelism(tp, pp))


def test_fp8_kv_cache_doubles_the_tokens_the_pool_holds():
    model, gpu, par = get_model("llama3-70b"), get_gpu("H200"), Parallelism(1)
    auto = build_deployment(model, gpu, par, dtype="fp8")
    bf16, fp8 = auto.memory, build_deployment(model, gpu, par, dtype="fp8", kv_cache_dtype="fp8").memory
    assert fp8.kv_bytes_per_token == bf16.kv_bytes_per_token / 2
    assert fp8.kv_cache_bytes == bf16.kv_cache_bytes
    assert abs(fp8.kv_tokens - 2 * bf16.kv_tokens) <= auto.settings.block_size
