"""Qwen3.5 / Qwen3-Next: Gated DeltaNet linear attention beside gated full attention, sparse MoE with a gated
shared expert.

Published figures: the Qwen3.5-397B-A17B model card (397B total, 17B activated; 60 layers in 15 blocks of three
Gated DeltaNet layers and one gated attention layer; 512 experts, 10 routed and 1 shared).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from servesim.errors import ServesimError
from servesim.hardware import get_gpu
from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.kernels.expand import expand, step_part
from servesim.kernels.types import (
    AttentionDecode,
    AttentionPrefill,
    CausalConv1d,
    GatedDeltaRuleChunk,
    GatedDeltaRuleDecode,
    KvWrite,
)
from servesim.models import get_model
from servesim.models.config import config_from_hf_dict
from servesim.models.memory import (
    MemoryReserve,
    kv_bytes_per_token_per_gpu,
    linear_state_bytes_per_request_per_gpu,
    plan_memory,
)
from servesim.models.parallel import Parallelism, validate_parallelism

B200 = get_gpu("B200")
QWEN35 = get_model("qwen3.5-397b-a17b")
AIC_CONFIG = (Path(__file__).resolve().parents[1] / ".venv/lib/python3.11/site-packages/aiconfigurator_core"
              / "model_configs/Qwen--Qwen3.5-397B-A17B_config.json")
GIB = 1024**3


def test_preset_matches_the_published_config_file():
    if not AIC_CONFIG.exists():
        pytest.skip("aiconfigurator-core's model_configs are not installed")
    text = json.loads(AIC_CONFIG.read_text())["text_config"]
    m = QWEN35
    assert m.num_layers == text["num_hidden_layers"] == 60
    assert m.linear_layer_indices == tuple(i for i, k in enumerate(text["layer_types"]) if k == "linear_attention")
    assert len(m.linear_layer_indices) == 45 and m.attention_cycle_layers == text["full_attention_interval"]
    assert (m.num_experts, m.num_experts_per_tok) == (text["num_experts"], text["num_experts_per_tok"])
    assert m.shared_expert_intermediate_size == text["shared_expert_intermediate_size"]
    assert (m.linear_num_key_heads, m.linear_num_value_heads) == (16, 64)
    assert m.rotary_dim == text["head_dim"] * text["rope_parameters"]["partial_rotary_factor"]
    assert m.linear_state_dtype == "fp32" and m.attn_output_gate and m.shared_expert_gate
    # The model card's 397B total and 17B activated parameters (vision tower and MTP layer left out).
    assert 390e9 < m.total_params() < 400e9 and 16.5e9 < m.active_params() < 18e9


def _all_full(model):
    return dataclasses.replace(model, linear_layer_indices=())


def test_kv_is_kept_only_in_the_full_attention_layers():
    par = Parallelism(tp=8)
    assert kv_bytes_per_token_per_gpu(QWEN35, par, 0) * 4 == kv_bytes_per_token_per_gpu(_all_full(QWEN35), par, 0)
    assert QWEN35.kv_bytes_per_token() * 4 == _all_full(QWEN35).kv_bytes_per_token()


def test_recurrent_state_is_per_request_and_does_not_grow_with_context():
    par = Parallelism(tp=8)
    state = linear_state_bytes_per_request_per_gpu(QWEN35, par, 0)
    # 45 layers x (3 conv inputs x 12,288 channels in BF16 + 64 heads x 128 x 128 in FP32) / 8 GPUs.
    assert state == pytest.approx(45 * (3 * 12288 * 2 + 64 * 128 * 128 * 4) / 8)
    plan = plan_memory(QWEN35, par, 180 * GIB, 0.9, MemoryReserve(GIB, GIB, GIB), 64, "fp8")
    assert plan.state_bytes_per_request == state
    per_block = plan.block_size
    short, long = plan.request_kv_tokens(per_block), plan.request_kv_tokens(100 * per_block)
    assert long - short == 99 * per_block  # context adds full-attention KV only; the state is the same
    assert short == per_block + state / plan.kv_bytes_per_token
    without = dataclasses.replace(plan, state_bytes_per_request=0.0)
    assert plan.max_sequences(1024) < without.max_sequences(1024)


def _layer_ops(step, layer):
    return step.layer_ops(layer)


def test_decode_grows_with_context_only_through_the_full_attention_layers():
    short = expand("vllm", QWEN35, B200, BatchSpec(decodes=(100,) * 8), tp=8, dtype="fp8-block")
    long = expand("vllm", QWEN35, B200, BatchSpec(decodes=(100_000,) * 8), tp=8, dtype="fp8-block")
    for layer in range(QWEN35.num_layers):
        a, b = _layer_ops(short, layer), _layer_ops(long, layer)
        if QWEN35.is_linear_layer(layer):
            assert a == b
            assert not [op for op in a if isinstance(op, (AttentionDecode, KvWrite))]
            assert [type(op) for op in a if isinstance(op, (CausalConv1d, GatedDeltaRuleDecode))] == [
                CausalConv1d, GatedDeltaRuleDecode]
        else:
            differ = [x for x, y in zip(a, b) if x != y]
            assert len(a) == len(b) and differ and all(isinstance(op, AttentionDecode) for op in differ)


def test_attention_part_is_the_full_layer_of_each_cycle():
    batch = BatchSpec(decodes=(4096,) * 4)
    part = step_part("attention", "sglang", QWEN35, B200, batch, tp=8, dtype="fp8-block")
    assert [type(op) for op in part] == [AttentionDecode]


def test_mixed_batch_runs_recurrent_decodes_and_chunked_prompts_apart():
    batch = BatchSpec(prefills=(PrefillChunk(100), PrefillChunk(130, 500)), decodes=(7, 9, 11))
    step = expand("sglang", QWEN35, B200, batch, tp=8, dtype="fp8-block")
    ops = step.layer_ops(QWEN35.linear_layer_indices[1])
    decode = next(op for op in ops if isinstance(op, GatedDeltaRuleDecode))
    chunk = next(op for op in ops if isinstance(op, GatedDeltaRuleChunk))
    assert (decode.tokens, decode.requests) == (3, 3)
    assert (chunk.tokens, chunk.requests, chunk.chunks) == (230, 2, 2 + 3)  # 64-token chunks per request
    assert (chunk.value_heads, chunk.key_heads) == (8, 2)
    full = step.layer_ops(3)
    assert any(isinstance(op, AttentionPrefill) for op in full)


def test_chunked_rule_work_follows_its_chunks():
    few = GatedDeltaRuleChunk(tokens=64, requests=1, chunks=1, key_heads=2, value_heads=8, key_head_dim=128,
                              value_head_dim=128)
    more = dataclasses.replace(few, tokens=128, chunks=2)
    assert more.flops() == 2 * few.flops() and more.bytes_moved() > few.bytes_moved()


def test_tp_must_divide_the_linear_attention_heads():
    with pytest.raises(ServesimError, match="linear-attention key heads"):
        validate_parallelism(QWEN35, Parallelism(tp=32))
    validate_parallelism(QWEN35, Parallelism(tp=16))


def test_a_config_of_only_linear_layers_is_refused():
    text = json.loads(AIC_CONFIG.read_text())["text_config"] if AIC_CONFIG.exists() else None
    if text is None:
        pytest.skip("aiconfigurator-core's model_configs are not installed")
    bad = dict(text, layer_types=["linear_attention"] * text["num_hidden_layers"])
    with pytest.raises(ServesimError, match="every layer is linear_attention"):
        config_from_hf_dict(bad, "bad", "bad")


def test_qwen3_next_config_without_layer_types_takes_the_full_attention_interval():
    if not AIC_CONFIG.exists():
        pytest.skip("aiconfigurator-core's model_configs are not installed")
    text = json.loads(AIC_CONFIG.read_text())["text_config"]
    cfg = {k: v for k, v in text.items() if k != "layer_types"}
    cfg.update(model_type="qwen3_next", intermediate_size=5120)
    m = config_from_hf_dict(cfg, "next", "next")
    assert m.linear_layer_indices == QWEN35.linear_layer_indices
    assert m.moe_layer_indices == tuple(range(m.num_layers)) and m.moe_intermediate_size == 1024


@pytest.mark.parametrize("estimator_name", ["mlp", "roofline"])
@pytest.mark.parametrize("gpu_name", ["H100-SXM", "B200", "L40S"])
def test_no_estimator_times_a_linear_attention_kernel_below_its_peak_bound(estimator_name, gpu_name):
    from servesim.estimator import get_estimator
    from servesim.estimator.bounds import lower_bound_us

    gpu = get_gpu(gpu_name)
    heads = dict(key_heads=2, value_heads=8, key_head_dim=128, value_head_dim=128)
    kernels = [kernel for n in (1, 7, 64, 4096) for kernel in (
        GatedDeltaRuleChunk(tokens=n * 64, requests=n, chunks=n, **heads),
        GatedDeltaRuleDecode(tokens=n, requests=n, **heads),
        CausalConv1d(tokens=n * 64, requests=n, channels=1536, kernel_width=4))]
    times = get_estimator(estimator_name).predict_us(kernels, gpu)
    assert (times >= lower_bound_us(kernels, gpu)).all() and (times > 0).all()


@pytest.mark.parametrize("gpu_name", ["H200", "B200", "H20"])
def test_one_long_prompt_runs_the_chunked_rule_longer_than_as_many_tokens_in_short_prompts(gpu_name):
    """fla's state pass walks a request's chunks one after another (a CTA per request and value head), so the
    tokens of one long prompt take longer than the same tokens split over requests that run side by side
    (aiconfigurator's B200 tables: 434 µs for one 8,192-token prompt, 252 µs for eight of 1,024, Qwen3.5 at TP 4)."""
    from servesim.estimator import get_estimator

    heads = dict(key_heads=4, value_heads=16, key_head_dim=128, value_head_dim=128, state_dtype="fp32")
    long, short = (GatedDeltaRuleChunk(tokens=8192, requests=n, chunks=128, **heads) for n in (1, 8))
    long_us, short_us = get_estimator("mlp").predict_us([long, short], get_gpu(gpu_name))
    assert long_us > 1.2 * short_us


def test_the_linear_attention_kernels_are_learned():
    from servesim.estimator import get_estimator

    label = get_estimator("mlp").label
    assert all(category in label.split("roofline")[0] for category in ("gdn_prefill", "gdn_decode", "conv1d"))


def test_piecewise_steps_pay_a_graph_launch_per_full_attention_layer():
    """In a piecewise CUDA graph every attention kernel runs between captured pieces, so a step replays one piece
    per full-attention layer: 15 for Qwen3.5's 60 layers, not none because one layer in four attends."""
    import servesim
    from servesim.serving.step_time import StepTimeModel

    model = StepTimeModel(servesim.deployment(QWEN35, "B200", tp=8, engine="vllm", dtype="fp8-block"))
    batch = BatchSpec(prefills=(PrefillChunk(512),))
    assert model.graph_plan(batch.num_tokens, batch.is_decode_only).mode == "piecewise"
    attention = step_part("attention", "vllm", QWEN35, B200, batch, tp=8, dtype="fp8-block")
    full_layers = sum(not QWEN35.is_linear_layer(layer) for layer in range(QWEN35.num_layers))
    launches = full_layers * len(attention) + 1
    assert model.step_time_us(batch).overhead_us == pytest.approx(model.overhead.step_overhead_us(1, launches))
