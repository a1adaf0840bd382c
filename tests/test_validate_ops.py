"""Vidur's per-operator measurements map onto servesim kernels of the same shapes and get scored."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim.kernels.types import Embedding, Gemm, Rope, SiluMul
from servesim.validate.ops import NOT_COMPARED, compare_ops, ops_summary, vidur_kernel

VIDUR_ROOT = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "vidur"

# Llama-2-70B: 64 heads, 8 KV heads, hidden 8192, intermediate 28672, vocabulary 32000, gated MLP.
LLAMA2_70B = dict(n_head=64, n_kv_head=8, n_embd=8192, n_expanded_embd=28672, vocab_size=32000, use_gated_mlp=True)


def test_projections_are_the_tp_shard_of_each_gemm() -> None:
    qkv = vidur_kernel("qkv_proj", 512, 4, **LLAMA2_70B)
    assert qkv == Gemm(m=512, n=(16 + 2 * 2) * 128, k=8192)
    assert vidur_kernel("o_proj", 512, 4, **LLAMA2_70B) == Gemm(m=512, n=8192, k=16 * 128)
    assert vidur_kernel("mlp_up_proj", 512, 4, **LLAMA2_70B) == Gemm(m=512, n=2 * 7168, k=8192)
    assert vidur_kernel("mlp_down_proj", 512, 4, **LLAMA2_70B) == Gemm(m=512, n=8192, k=7168)


def test_elementwise_ops_use_the_sharded_widths() -> None:
    assert vidur_kernel("silu_mul", 64, 8, **LLAMA2_70B) == SiluMul(tokens=64, dim=3584)
    # KV heads never drop below one per GPU.
    assert vidur_kernel("rope", 64, 16, **LLAMA2_70B) == Rope(tokens=64, num_heads=4, num_kv_heads=1, head_dim=128)
    assert vidur_kernel("embedding", 64, 8, **LLAMA2_70B) == Embedding(tokens=64, hidden=8192, vocab_rows=4000)


def test_comparison_scores_every_kernel_op_and_explains_the_rest() -> None:
    if not (VIDUR_ROOT / "compute").is_dir():
        pytest.skip(f"Vidur data not present at {VIDUR_ROOT}")
    frame = compare_ops(("roofline",), VIDUR_ROOT, gpus=("H100-SXM",))
    compared = ~frame["op"].isin(list(NOT_COMPARED))
    assert frame.loc[compared, "predicted_roofline_us"].gt(0).all()
    assert frame.loc[~compared, "predicted_roofline_us"].isna().all()
    summary = {row["op"]: row for row in ops_summary(frame, ("roofline",))}
    assert summary["add"]["note"] and not summary["mlp_up_proj"]["note"]
    # The roofline is a lower bound for big GEMMs: it never predicts them slower than measured on median.
    assert summary["mlp_up_proj"]["roofline_median_error_pct"] < 0
