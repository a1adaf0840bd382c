"""Kernel types: identity, FLOP and byte counts a predictor relies on."""

from __future__ import annotations

import pytest

from servesim.errors import ServesimError
from servesim.kernels.batch import BatchSpec, PrefillChunk, parse_batch
from servesim.kernels.types import (
    KERNEL_TYPES,
    AttentionDecode,
    AttentionPrefill,
    FusedMoE,
    Gemm,
    ScaledMM,
)


def test_equal_shapes_are_one_kernel_whatever_the_module_name():
    a = Gemm(m=16, n=2560, k=8192, name="qkv_proj")
    b = Gemm(m=16, n=2560, k=8192, name="other")
    assert a == b and hash(a) == hash(b)
    assert len({a, b, Gemm(m=16, n=2560, k=8192, bias=True)}) == 2


def test_gemm_counts():
    g = Gemm(m=4, n=3, k=5)
    assert g.flops() == 2 * 4 * 3 * 5
    assert g.bytes_moved() == (4 * 5 + 5 * 3 + 4 * 3) * 2


def test_block_scaled_mm_reads_its_scales():
    tensor = ScaledMM(m=256, n=512, k=1024, scale="tensor")
    block = ScaledMM(m=256, n=512, k=1024, scale="block")
    assert tensor.flops() == block.flops() == 2 * 256 * 512 * 1024
    # 256 tokens x 8 k-groups of activation scales + 4 x 8 weight blocks, fp32 each
    assert block.bytes_moved() - tensor.bytes_moved() == 4 * (256 * 8 + 4 * 8) - 4 * 2


def _brute_force_pairs(q: int, kv: int) -> int:
    return sum(kv - q + i + 1 for i in range(q))


@pytest.mark.parametrize("q,kv", [(1, 1), (7, 7), (5, 12), (128, 1000), (1, 4096)])
def test_causal_attention_counts_each_visible_key_exactly(q, kv):
    heads, head_dim = 8, 128
    attn = AttentionPrefill(query_lens=(q,), kv_lens=(kv,), num_heads=heads, num_kv_heads=1, head_dim=head_dim)
    assert attn.flops() == 4 * heads * head_dim * _brute_force_pairs(q, kv)
    full = AttentionPrefill(query_lens=(q,), kv_lens=(kv,), num_heads=heads, num_kv_heads=1, head_dim=head_dim, causal=False)
    assert full.flops() == 4 * heads * head_dim * q * kv


def test_decode_equals_a_one_token_prefill():
    dec = AttentionDecode(kv_lens=(100, 300), num_heads=8, num_kv_heads=2, head_dim=128)
    pre = AttentionPrefill(query_lens=(1, 1), kv_lens=(100, 300), num_heads=8, num_kv_heads=2, head_dim=128)
    assert dec.flops() == pre.flops()
    assert dec.bytes_moved() == pre.bytes_moved()


def test_moe_reads_only_experts_that_receive_tokens():
    kw = dict(tokens=2, num_experts=8, top_k=2, hidden=64, intermediate=32)
    sparse = FusedMoE(expert_tokens=(1, 1, 1, 1, 0, 0, 0, 0), **kw)
    dense = FusedMoE(expert_tokens=(1, 1, 1, 0, 0, 0, 0, 1), **kw)
    assert sparse.flops() == 6 * 4 * 64 * 32
    assert sparse.active_experts() == 4
    assert sparse.bytes_moved() == dense.bytes_moved()
    assert FusedMoE(expert_tokens=(4, 0, 0, 0, 0, 0, 0, 0), **kw).bytes_moved() < sparse.bytes_moved()


def test_every_category_is_distinct():
    assert len(KERNEL_TYPES) == len({cls.category for cls in KERNEL_TYPES.values()})


def test_parse_batch_syntax():
    batch = parse_batch("prefill:2048, prefill:512+1024, decode:16x1024")
    assert batch.prefills == (PrefillChunk(2048, 0), PrefillChunk(512, 1024))
    assert batch.decodes == (1024,) * 16
    assert batch.num_tokens == 2048 + 512 + 16
    assert batch.num_requests == 18
    assert batch.kv_lens[:1] == (1025,) and batch.kv_lens[-1] == 1536
    assert parse_batch(batch.describe()) == batch
    assert parse_batch("prefill:2x100") == BatchSpec(prefills=(PrefillChunk(100),) * 2)


@pytest.mark.parametrize("text", ["", "prefill", "decode:1024+5", "prefil:10", "decode:0x5", "prefill:0", "decode:0",
                                  "decode:5000000x10", "prefill:3000000000"])
def test_parse_batch_rejects_bad_input_with_the_syntax(text):
    with pytest.raises(ServesimError):
        parse_batch(text)
