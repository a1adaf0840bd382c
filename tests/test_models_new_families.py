"""MiniMax-M2.5 and gpt-oss: their configs parse to the published architecture, their layers expand to the kernels
the engines launch, sliding-window layers stop costing more past their window, and MXFP4 experts take their
4.25 bits a weight.

Published figures: MiniMax-M2 model card (230B total, 10B activated); gpt-oss model card (arXiv 2508.10925,
Table 1: 116.83B total and 5.13B active parameters for gpt-oss-120b, 20.91B and 3.61B for gpt-oss-20b, active
counts without the embedding table).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.decompose import decompose
from servesim.errors import ServesimError
from servesim.estimator import get_estimator
from servesim.hardware import get_gpu
from servesim.kernels.batch import BatchSpec, PrefillChunk, parse_batch
from servesim.kernels.expand import expand, padded_vocab, step_part
from servesim.kernels.types import (
    MXFP4_BITS_PER_WEIGHT, AttentionDecode, AttentionPrefill, Collective, FusedMoE, Gemm, RMSNorm, Rope, ScaledMM,
)
from servesim.models import get_model
from servesim.models.config import config_from_hf_dict
from servesim.models.memory import MemoryReserve, plan_memory, weight_bytes_per_gpu
from servesim.models.parallel import Parallelism
from servesim.serving.deployment import build_deployment
from servesim.serving.step_time import StepTimeModel

H100, H200, B200, A100 = (get_gpu(name) for name in ("H100", "H200", "B200", "A100"))
MINIMAX = get_model("minimax-m2.5")
GPT_OSS = get_model("gpt-oss-120b")
GPT_OSS_20B = get_model("gpt-oss-20b")
#: gpt-oss-120b with every layer attending to the whole context: the same size, no sliding window.
GPT_OSS_FULL = dataclasses.replace(GPT_OSS, name="gpt-oss-120b-full", sliding_window=0, sliding_layer_indices=())
NO_RESERVE = MemoryReserve(0.0, 0.0, 0.0)


def _kernels(step, kind):
    return [s for s in step.kernels if isinstance(s.op, kind)]


# --- configs --------------------------------------------------------------------------------------------------


def test_minimax_config_maps_to_its_architecture():
    m = MINIMAX
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.head_dim) == (62, 3072, 48, 8, 128)
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (256, 8, 1536)
    assert m.moe_layer_indices == tuple(range(62))  # every layer MoE, no dense or shared-expert MLP
    assert m.qk_norm == "layer" and m.rope_dim == 64 and not m.sliding_layer_indices
    assert m.checkpoint_quant == "fp8-block" and m.router_dtype == "fp32"
    assert m.total_params() == pytest.approx(230e9, rel=0.01)
    assert m.active_params() - m.embedding_params() == pytest.approx(10e9, rel=0.05)


@pytest.mark.parametrize(("model", "layers", "experts", "total", "active"), [
    (GPT_OSS, 36, 128, 116.83e9, 5.13e9),
    (GPT_OSS_20B, 24, 32, 20.91e9, 3.61e9),
])
def test_gpt_oss_config_maps_to_its_architecture(model, layers, experts, total, active):
    assert (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_kv_heads,
            model.head_dim) == (layers, 2880, 64, 8, 64)
    assert (model.num_experts, model.num_experts_per_tok, model.moe_intermediate_size) == (experts, 4, 2880)
    assert model.moe_layer_indices == tuple(range(layers))
    # layer_types alternates sliding (128 tokens) and full attention, starting with a sliding layer.
    assert model.sliding_window == 128 and model.sliding_layer_indices == tuple(range(0, layers, 2))
    assert model.attention_cycle_layers == 2
    assert model.attention_sinks and model.attention_bias and model.o_proj_bias and model.moe_bias
    assert model.checkpoint_quant == "mxfp4" and model.qk_norm == "" and model.rope_dim == 64
    assert model.total_params() == pytest.approx(total, rel=0.005)
    assert model.active_params() - model.embedding_params() == pytest.approx(active, rel=0.01)


@pytest.mark.parametrize(("preset", "file"), [
    ("minimax-m2.5", "MiniMaxAI--MiniMax-M2.5_config.json"),
    ("gpt-oss-120b", "openai--gpt-oss-120b_config.json"),
])
def test_aiconfigurator_config_files_parse_like_the_presets(preset, file):
    core = pytest.importorskip("aiconfigurator_core")
    from pathlib import Path

    cfg = json.loads((Path(core.__file__).parent / "model_configs" / file).read_text())
    parsed = config_from_hf_dict(cfg, name=preset, source=get_model(preset).source)
    assert parsed == get_model(preset)


def test_every_layer_sliding_is_refused_with_a_reason():
    cfg = {"model_type": "gpt_oss", "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 2, "vocab_size": 128, "layer_types": ["sliding_attention"] * 2,
           "sliding_window": 128}
    with pytest.raises(ServesimError, match="at least one full_attention layer"):
        config_from_hf_dict(cfg, "x", "x")


# --- kernels --------------------------------------------------------------------------------------------------

BATCH = parse_batch("prefill:1500, prefill:700+300, decode:40x2000")


@pytest.mark.parametrize(("model", "dtype"), [(MINIMAX, "fp8"), (GPT_OSS, "mxfp4")])
@pytest.mark.parametrize("tp", [1, 4, 8])
def test_matmul_flops_are_two_per_active_weight_per_token(model, dtype, tp):
    step = expand("vllm", model, H100, BATCH, tp=tp, dtype=dtype)
    t = BATCH.num_tokens
    attention = model.hidden_size * (model.q_size + 2 * model.kv_size) + model.q_size * model.hidden_size
    per_layer = (2.0 * t * attention / tp + 2.0 * t * model.hidden_size * model.num_experts  # router: every GPU
                 + 2.0 * t * model.num_experts_per_tok * model.expert_params() / tp)
    lm_head = 2.0 * BATCH.num_requests * model.hidden_size * padded_vocab(model.vocab_size) / tp
    matmuls = sum(s.op.flops() for s in step.kernels if isinstance(s.op, (Gemm, ScaledMM, FusedMoE)))
    assert matmuls == pytest.approx(per_layer * model.num_layers + lm_head, rel=1e-12)


def test_minimax_norms_all_of_q_and_k_across_tp_and_turns_64_dims():
    step = expand("vllm", MINIMAX, H200, BATCH, tp=4, dtype="fp8")
    layer = step.layer_ops(1)
    norms = {op.name: op for op in layer if isinstance(op, RMSNorm)}
    assert (norms["q_norm"].rows, norms["q_norm"].dim) == (BATCH.num_tokens, 12 * 128)
    assert (norms["k_norm"].rows, norms["k_norm"].dim) == (BATCH.num_tokens, 2 * 128)
    (variance,) = [op for op in layer if isinstance(op, Collective) and op.name == "qk_norm.all_reduce"]
    assert variance.bytes == BATCH.num_tokens * 2 * 4  # one FP32 mean square each for Q and K, per token
    assert [op.head_dim for op in layer if isinstance(op, Rope)] == [64]
    single = expand("vllm", MINIMAX, H200, BATCH, tp=1, dtype="fp8")
    assert not [s for s in single.collectives if s.op.name == "qk_norm.all_reduce"]


def test_fp8_of_a_block_scaled_checkpoint_runs_block_scaled():
    """MiniMax-M2.5 ships 128x128 block-scaled FP8: the engines take the checkpoint's scales."""
    minimax = expand("vllm", MINIMAX, H200, BATCH, tp=4, dtype="fp8")
    assert {s.op.scale for s in _kernels(minimax, ScaledMM)} == {"block"}
    assert {s.op.scale for s in _kernels(minimax, FusedMoE)} == {"block"}
    llama = expand("vllm", get_model("llama3-8b"), H200, BATCH, dtype="fp8")
    assert {s.op.scale for s in _kernels(llama, ScaledMM)} == {"tensor"}


def test_gpt_oss_layers_alternate_sliding_and_full_attention():
    step = expand("vllm", GPT_OSS, H100, BATCH, tp=1, dtype="mxfp4")
    for layer in range(GPT_OSS.num_layers):
        (attn,) = [op for op in step.layer_ops(layer) if isinstance(op, AttentionPrefill)]
        if layer % 2 == 0:  # sliding: each request reads its last q + 127 keys at most
            assert attn.kv_lens == tuple(min(kv, q + 127) for q, kv in zip(BATCH.query_lens, BATCH.kv_lens))
            assert attn.window == 128
        else:
            assert attn.kv_lens == BATCH.kv_lens and attn.window == 0
    biased = {op.name for op in step.layer_ops(1) if isinstance(op, Gemm) and op.bias}
    assert biased == {"qkv_proj", "o_proj", "gate"}
    (experts,) = [op for op in step.layer_ops(1) if isinstance(op, FusedMoE)]
    assert (experts.dtype, experts.weight_dtype) == ("bf16", "mxfp4")


@pytest.mark.parametrize("backend", ["fa2", "fa3", "flashinfer"])
def test_windowed_prefill_tensor_ops_equal_its_flops(backend):
    kernel = AttentionPrefill(query_lens=(300, 1000, 17, 200), kv_lens=(427, 1127, 17, 327), num_heads=64,
                              num_kv_heads=8, head_dim=64, backend=backend, window=128)
    (launch,) = decompose(kernel, H100 if backend == "fa3" else A100)
    assert launch.tasks.demand["tensor"].sum() == pytest.approx(kernel.flops(), rel=1e-12)
    # No query sees more than 128 keys: 128 per query once a request's queries are 128 deep.
    assert kernel.flops() < 4.0 * 64 * 64 * 128 * sum(kernel.query_lens)


def test_sliding_attention_stops_growing_past_the_window():
    def layer_attention(context: int, layer: int, prefill: bool):
        batch = BatchSpec((PrefillChunk(512, context),)) if prefill else BatchSpec(decodes=(context,) * 8)
        step = expand("vllm", GPT_OSS, H100, batch, dtype="mxfp4")
        (attn,) = [op for op in step.layer_ops(layer) if isinstance(op, (AttentionPrefill, AttentionDecode))]
        return attn.flops(), attn.bytes_moved()

    for prefill in (False, True):
        sliding = [layer_attention(c, 0, prefill) for c in (1000, 4000, 16000)]
        full = [layer_attention(c, 1, prefill) for c in (1000, 4000, 16000)]
        assert sliding[0] == sliding[1] == sliding[2]
        assert full[0] < full[1] < full[2]
    assert layer_attention(100, 0, False) == layer_attention(100, 1, False)  # within the window, alike


def test_step_part_attention_is_one_cycle_of_layers_and_step_time_takes_its_mean():
    batch = BatchSpec(decodes=(3000,) * 8)
    cycle = step_part("attention", "vllm", GPT_OSS, H100, batch, dtype="mxfp4")
    assert [op.kv_lens[0] for op in cycle] == [128, 3001]  # a sliding layer, then a full one
    model = StepTimeModel(build_deployment(GPT_OSS, H100, Parallelism(1), dtype="mxfp4"), get_estimator("roofline"))
    mean_us, kernels = model.layer_attention_us(batch)
    assert kernels == 1
    assert mean_us == pytest.approx(get_estimator("roofline").predict_us(list(cycle), H100).sum() / 2, rel=1e-12)


@pytest.mark.parametrize("batch", [BatchSpec(decodes=(100, 900, 3000)), BatchSpec((PrefillChunk(300, 0),), (500,) * 7),
                                   BatchSpec((PrefillChunk(300, 1200), PrefillChunk(2000, 0)), (900,) * 40)])
def test_step_time_adds_up_every_kernel_of_a_gpt_oss_step(batch):
    from test_step_time import kernel_by_kernel_us

    model = StepTimeModel(build_deployment(GPT_OSS, H100, Parallelism(2, 2), dtype="mxfp4"), get_estimator("mlp"))
    stages_us, overhead_us = kernel_by_kernel_us(model, batch)
    step = model.step_time_us(batch)
    assert step.stage_us == pytest.approx(stages_us, rel=1e-6)
    assert step.overhead_us == pytest.approx(overhead_us, rel=1e-12)


# --- memory ---------------------------------------------------------------------------------------------------


def test_gpt_oss_kv_grows_more_slowly_with_context_than_full_attention():
    def plan(model):
        return plan_memory(model, Parallelism(1), 141e9, 0.9, NO_RESERVE, 16, "mxfp4")

    windowed, full = plan(GPT_OSS), plan(GPT_OSS_FULL)

    def request_bytes(p, context):
        return p.request_kv_tokens(context) * p.kv_bytes_per_token

    assert request_bytes(windowed, 100) == request_bytes(full, 100)  # within the window every layer keeps all
    growth = [request_bytes(p, 32_000) - request_bytes(p, 8_000) for p in (windowed, full)]
    assert growth[0] == pytest.approx(growth[1] / 2)  # half the layers stop at their window
    assert windowed.max_sequences(32_000) > 1.9 * full.max_sequences(32_000)
    # A request holds at most 9 blocks of 16 in a sliding layer: ceil(127 / 16) + 1.
    assert windowed.window_blocks == 9


def test_mxfp4_experts_take_4_25_of_16_bits_of_bf16():
    par = Parallelism(1)
    bf16, mxfp4 = (weight_bytes_per_gpu(GPT_OSS, par, 0, dtype) for dtype in ("bf16", "mxfp4"))
    experts = GPT_OSS.num_layers * GPT_OSS.num_experts * GPT_OSS.expert_params()
    assert bf16 - mxfp4 == pytest.approx(experts * 2 * (1 - MXFP4_BITS_PER_WEIGHT / 16), rel=1e-12)
    assert MXFP4_BITS_PER_WEIGHT / 16 == 4.25 / 16
    kernel = FusedMoE(tokens=1, num_experts=4, top_k=4, hidden=2880, intermediate=2880, expert_tokens=(1, 1, 1, 1))
    weights_bf16 = 4 * 3 * 2880 * 2880 * 2
    assert (kernel.bytes_moved() - dataclasses.replace(kernel, weight_dtype="mxfp4").bytes_moved()
            == pytest.approx(weights_bf16 * (1 - 4.25 / 16)))


def test_gpt_oss_120b_fits_one_80_gb_gpu_in_mxfp4_not_in_bf16():
    assert build_deployment(GPT_OSS, H100, Parallelism(1), dtype="mxfp4").memory.fits
    assert not build_deployment(GPT_OSS, H100, Parallelism(1), dtype="bf16").memory.fits


# --- formats a GPU or checkpoint cannot run -------------------------------------------------------------------


def test_mxfp4_is_emulated_without_fp4_tensor_cores():
    kernel = FusedMoE(tokens=64, num_experts=128, top_k=4, hidden=2880, intermediate=2880,
                      expert_tokens=tuple(2 for _ in range(128)), weight_dtype="mxfp4")
    hopper = {note for launch in decompose(kernel, H100) for note in launch.notes}
    blackwell = {note for launch in decompose(kernel, B200) for note in launch.notes}
    assert any("emulated" in note for note in hopper)
    assert not any("emulated" in note for note in blackwell) and any("weight-only" in n for n in blackwell)


@pytest.mark.parametrize(("model", "gpu", "dtype", "message"), [
    ("llama3-8b", "H100", "mxfp4", "llama3-8b is not an MXFP4 checkpoint"),
    ("minimax-m2.5", "H200", "mxfp4", "not INT4 of other kinds"),
    ("minimax-m2.5", "A100", "fp8", "no FP8 Tensor cores"),
])
def test_formats_that_cannot_run_are_one_line_errors(model, gpu, dtype, message):
    with pytest.raises(ServesimError, match=message):
        expand("vllm", get_model(model), get_gpu(gpu), BATCH, tp=8, dtype=dtype)
    result = CliRunner().invoke(main, ["latency", "--model", model, "--gpu", gpu, "--tp", "8", "--dtype", dtype,
                                       "--output-len", "4"])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_latency_runs_for_the_new_families():
    for args in (["--model", "gpt-oss-120b", "--gpu", "H100", "--tp", "1", "--dtype", "mxfp4"],
                 ["--model", "minimax-m2.5", "--gpu", "H200", "--tp", "4", "--dtype", "fp8"]):
        result = CliRunner().invoke(main, ["latency", *args, "--output-len", "8", "--json"])
        assert result.exit_code == 0, result.output
        payload = json.loads(result.output)
        assert 0 < payload["ttft_ms"] and 0 < payload["tpot_ms"] < payload["ttft_ms"] * 10
    assert np.isfinite(payload["latency_s"])
