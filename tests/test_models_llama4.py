"""Llama 4 (Scout, Maverick): the configs parse to the published architecture, the layers expand to what vLLM's
``models/llama4.py`` launches (NoPE layers without RoPE or Q/K norms, chunked local attention in the others, a
top-1 expert beside a shared one), chunked layers stop costing more past their chunk, and vLLM runs the model's
decodes piecewise (its chunked-local-attention metadata takes no CUDA graph).

Published figures: the Llama 4 model cards (Scout: 17B active and 109B total parameters, 16 experts; Maverick: 17B
active, 400B total, 128 experts), the totals with the vision encoder, which servesim does not time.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.errors import ServesimError
from servesim.estimator import get_estimator
from servesim.hardware import get_gpu
from servesim.kernels.batch import BatchSpec, PrefillChunk, parse_batch
from servesim.kernels.engines import get_engine_kernels
from servesim.kernels.expand import expand, local_attention_batches
from servesim.kernels.types import AttentionDecode, AttentionPrefill, FusedMoE, Gemm, RMSNorm, Rope, RouterTopK
from servesim.models import get_model
from servesim.models.config import config_from_hf_dict
from servesim.models.parallel import Parallelism
from servesim.serving.deployment import build_deployment
from servesim.serving.step_time import StepTimeModel

H100 = get_gpu("H100")
SCOUT = get_model("llama4-scout")
MAVERICK = get_model("llama4-maverick")
#: Scout with every layer attending to the whole context: the same size, no chunking.
SCOUT_UNCHUNKED = dataclasses.replace(SCOUT, name="llama4-scout-unchunked", attention_chunk_size=0)
BATCH = parse_batch("prefill:10000, prefill:700+300, decode:40x9000")


def _attention(step, layer: int):
    (attn,) = [op for op in step.layer_ops(layer) if isinstance(op, (AttentionPrefill, AttentionDecode))]
    return attn


# --- configs --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "experts", "moe_layers", "total"), [
    (SCOUT, 16, tuple(range(48)), 109e9),
    (MAVERICK, 128, tuple(range(1, 48, 2)), 400e9),
])
def test_llama4_configs_map_to_their_architecture(model, experts, moe_layers, total):
    assert (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_kv_heads,
            model.head_dim) == (48, 5120, 40, 8, 128)
    assert (model.num_experts, model.num_experts_per_tok, model.moe_intermediate_size) == (experts, 1, 8192)
    assert model.moe_layer_indices == moe_layers  # interleave_moe_layer_step 1 (Scout) and 2 (Maverick)
    assert model.intermediate_size == 16384  # intermediate_size_mlp: the dense layers' MLP
    assert model.shared_expert_intermediate_size == 8192 and not model.norm_topk_prob
    assert model.nope_layer_indices == tuple(range(3, 48, 4))  # every fourth layer, as transformers fills it in
    assert model.attention_chunk_size == 8192 and model.attention_cycle_layers == 4
    assert model.total_params() == pytest.approx(total, rel=0.015)
    assert model.active_params() == pytest.approx(17e9, rel=0.03)  # the model cards count the embedding


def test_llama4_norms_q_and_k_where_its_config_says_in_rope_layers_only():
    assert SCOUT.qk_norm == "head" and not MAVERICK.qk_norm  # use_qk_norm: true in Scout's config, false in Maverick's
    assert [SCOUT.has_qk_norm(layer) for layer in range(4)] == [True, True, True, False]


def test_a_llama4_config_file_parses_like_the_preset():
    core = pytest.importorskip("aiconfigurator_core")
    from pathlib import Path

    file = Path(core.__file__).parent / "model_configs" / "meta-llama--Llama-4-Scout-17B-16E-Instruct_config.json"
    parsed = config_from_hf_dict(json.loads(file.read_text()), name="llama4-scout", source=SCOUT.source)
    assert parsed == SCOUT


def _text_config(**keys) -> dict:
    text = {"model_type": "llama4_text", "hidden_size": 64, "intermediate_size": 64, "intermediate_size_mlp": 128,
            "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
            "vocab_size": 256, "num_local_experts": 4, "num_experts_per_tok": 1, **keys}
    return {"model_type": "llama4", "text_config": text}


def test_llama4_layer_lists_come_from_the_config_keys_that_give_them():
    model = config_from_hf_dict(_text_config(no_rope_layers=[0, 1, 1, 0], moe_layers=[2], interleave_moe_layer_step=1),
                                "x", "x")
    assert model.nope_layer_indices == (0, 3) and model.moe_layer_indices == (2,)
    assert model.attention_chunk_size == 0 and model.attention_chunk(1) == 0  # no attention_chunk_size: full
    dense = config_from_hf_dict(_text_config(interleave_moe_layer_step=0), "x", "x")
    assert dense.moe_layer_indices == () and dense.n_shared_experts == 0


@pytest.mark.parametrize(("keys", "message"), [
    ({"no_rope_layers": [1, 1, 2, 1]}, "no_rope_layers must give 0 .NoPE. or 1 .RoPE. for each of the 4 layers"),
    ({"no_rope_layers": [1, 1]}, "for each of the 4 layers"),
    ({"interleave_moe_layer_step": -1}, "interleave_moe_layer_step is -1"),
    ({"attention_chunk_size": 0}, "attention_chunk_size is 0"),
    ({"intermediate_size_mlp": None}, "intermediate_size_mlp is None"),
])
def test_bad_llama4_keys_are_refused_with_a_reason(keys, message):
    with pytest.raises(ServesimError, match=message):
        config_from_hf_dict(_text_config(**keys), "x", "x")


# --- chunked local attention ----------------------------------------------------------------------------------


def test_local_attention_splits_new_tokens_at_chunk_boundaries():
    # A decode at position 9000 (kv 9001) sees its chunk's 809 keys; a 10,000-token prompt is two requests.
    assert local_attention_batches((1, 10000), (9001, 10000), 8192) == ((1, 8192, 1808), (809, 8192, 1808))
    # A chunk of 700 new tokens after 7,900 cached crosses 8,192: 292 queries end chunk 0, 408 start chunk 1.
    assert local_attention_batches((700,), (8600,), 8192) == ((292, 408), (8192, 408))
    assert local_attention_batches((5, 1), (300, 9), 0) == ((5, 1), (300, 9))


@pytest.mark.parametrize("chunk", [16, 100, 8192])
def test_local_attention_keeps_every_query_and_no_key_past_its_chunk(chunk):
    queries = (1, 1, 37, 4096, 900, 1)
    keys = (1, 5000, 37, 20000, 1000, 16385)
    q, kv = local_attention_batches(queries, keys, chunk)
    assert sum(q) == sum(queries)
    assert all(0 < new <= seen <= chunk for new, seen in zip(q, kv))
    if chunk >= max(keys):
        assert (q, kv) == (queries, keys)


def test_llama4_layers_expand_as_vllm_launches_them():
    step = expand("vllm", SCOUT, H100, BATCH, tp=4)
    rope_layer, nope_layer = step.layer_ops(1), step.layer_ops(3)
    assert [op.name for op in rope_layer if isinstance(op, (Rope, RMSNorm))][:3] == ["q_norm", "k_norm", "rotary_emb"]
    assert not [op for op in nope_layer if isinstance(op, Rope) or op.name in ("q_norm", "k_norm")]
    assert _attention(step, 3).kv_lens == BATCH.kv_lens  # NoPE: the whole context
    # RoPE layers: decodes first, each its chunk's keys, then the two prompt chunks split at 8,192.
    chunked = _attention(step, 1)
    assert chunked.kv_lens == (809,) * 40 + (8192, 1808, 1000)
    (router,) = [op for op in rope_layer if isinstance(op, RouterTopK)]
    (experts,) = [op for op in rope_layer if isinstance(op, FusedMoE)]
    assert (router.top_k, router.renormalize, experts.intermediate) == (1, False, 8192 // 4)
    shared = [op for op in rope_layer if isinstance(op, Gemm) and op.name.startswith("shared_experts")]
    assert [op.n for op in shared] == [2 * 8192 // 4, 5120]
    maverick = expand("vllm", MAVERICK, H100, BATCH, tp=8)
    dense = [op for op in maverick.layer_ops(0) if isinstance(op, Gemm) and op.name == "gate_up_proj"]
    assert [op.n for op in dense] == [2 * 16384 // 8] and not maverick.layer_ops(0)[-1].name.startswith("moe")


def test_chunked_layers_stop_costing_more_past_their_chunk():
    def decode_attention(model, context: int, layer: int) -> float:
        return _attention(expand("vllm", model, H100, BatchSpec(decodes=(context,) * 8), tp=4), layer).bytes_moved()

    # Within one chunk the chunked layer reads what a full layer reads; past it, only its chunk.
    assert decode_attention(SCOUT, 4000, 1) == decode_attention(SCOUT_UNCHUNKED, 4000, 1)
    assert decode_attention(SCOUT, 8192 * 5 + 100, 1) == decode_attention(SCOUT, 8192 * 2 + 100, 1)
    assert decode_attention(SCOUT, 8192 * 5 + 100, 1) < decode_attention(SCOUT_UNCHUNKED, 8192 * 5 + 100, 1)
    assert decode_attention(SCOUT, 8192 * 5 + 100, 3) == decode_attention(SCOUT_UNCHUNKED, 8192 * 5 + 100, 3)


def test_vllm_runs_llama4_decodes_piecewise_and_sglang_graphs_them():
    decodes = BatchSpec(decodes=(2000,) * 16)
    assert expand("vllm", SCOUT, H100, decodes, tp=4).graph_mode == "piecewise"
    assert expand("vllm", get_model("llama3-70b"), H100, decodes, tp=4).graph_mode == "full"
    assert expand("sglang", SCOUT, H100, decodes, tp=4).graph_mode == "full"
    assert get_engine_kernels("vllm").graph_plan(600, True, None, 4, local_attention=True).mode == "none"


@pytest.mark.parametrize("batch", [BatchSpec(decodes=(100, 9000, 30000)),
                                   BatchSpec((PrefillChunk(300, 8000), PrefillChunk(2000, 0)), (900,) * 40)])
def test_step_time_adds_up_every_kernel_of_a_llama4_step(batch):
    from test_step_time import kernel_by_kernel_us

    model = StepTimeModel(build_deployment(SCOUT, H100, Parallelism(4)), get_estimator("mlp"))
    stages_us, _ = kernel_by_kernel_us(model, batch)
    assert model.step_time_us(batch).stage_us == pytest.approx(stages_us, rel=1e-6)


def test_latency_runs_llama4_from_its_preset_and_its_config_file(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama4", "text_config": SCOUT_CONFIG}))
    runner = CliRunner()
    outputs = []
    for model in ("llama4-scout", str(config)):
        result = runner.invoke(main, ["latency", "--model", model, "--gpu", "H100", "--tp", "4", "--batch-size", "4",
                                      "--input-len", "512", "--output-len", "8", "--json"])
        assert result.exit_code == 0, result.output
        outputs.append(json.loads(result.output))
    assert outputs[0]["ttft_ms"] == outputs[1]["ttft_ms"] > 0
    assert outputs[0]["tpot_ms"] == outputs[1]["tpot_ms"] > 0


SCOUT_CONFIG = {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
                "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048, "num_local_experts": 16,
                "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "attention_chunk_size": 8192,
                "use_qk_norm": True, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                "max_position_embeddings": 10485760}
