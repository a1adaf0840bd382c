"""DeepSeek Sparse Attention (GLM-5, DeepSeek-V3.2): MLA whose queries attend only to the ``index_topk`` cached
tokens a lightning indexer picks, the indexer scoring every cached token with its own FP8 key cache.

Published figures: the GLM-5 model card (744B parameters, 40B active) and config.json (78 layers, the first 3 dense;
256 experts, 8 routed and 1 shared; indexer of 32 heads x 128, top 2048).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from servesim.errors import ServesimError
from servesim.hardware import get_gpu
from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.kernels.expand import expand, step_part
from servesim.kernels.types import (
    AttentionDecode,
    AttentionPrefill,
    IndexLogitsDecode,
    IndexLogitsPrefill,
    IndexTopK,
    KvWrite,
)
from servesim.models import get_model
from servesim.models.config import config_from_hf_dict
from servesim.models.memory import kv_bytes_per_token_per_gpu
from servesim.models.parallel import Parallelism
from servesim.validate.replay import preset_for

H200 = get_gpu("H200")
GLM5 = get_model("glm-5")
AIC_CONFIGS = Path(__file__).resolve().parents[1] / ".venv/lib/python3.11/site-packages/aiconfigurator_core/model_configs"


def _aic_config(name: str) -> dict:
    path = AIC_CONFIGS / name
    if not path.exists():
        pytest.skip("aiconfigurator-core's model_configs are not installed")
    return json.loads(path.read_text())


@pytest.mark.parametrize("file, preset", [("zai-org--GLM-5-FP8_config.json", "glm-5"),
                                          ("deepseek-ai--DeepSeek-V3.2_config.json", "deepseek-v3.2")])
def test_presets_parse_as_the_published_configs(file, preset):
    published = config_from_hf_dict(_aic_config(file), name=preset, source=get_model(preset).source)
    assert published.is_dsa and published.is_mla
    assert published.checkpoint_quant == "fp8-block"
    assert get_model(preset) == published


def test_glm5_figures_match_its_model_card():
    m = GLM5
    assert (m.num_layers, m.num_attention_heads, m.qk_nope_head_dim, m.v_head_dim) == (78, 64, 192, 256)
    assert (m.index_n_heads, m.index_head_dim, m.index_topk) == (32, 128, 2048)
    assert len(m.moe_layer_indices) == 75 and m.moe_layer_indices[0] == 3
    assert (m.num_experts, m.num_experts_per_tok, m.n_shared_experts) == (256, 8, 1)
    assert 735e9 < m.total_params() < 755e9  # 744B
    assert 38e9 < m.active_params() < 42e9  # 40B active


def test_silicon_model_id_maps_to_the_glm5_preset():
    assert preset_for("zhipuai/GLM-5") == "glm-5"


def test_kv_bytes_per_token_include_the_indexer_keys():
    """Each layer caches the 576-value latent and the indexer's 128 FP8 values with one FP32 scale (132 bytes)."""
    latent_only = 78 * 576 * 2
    assert GLM5.kv_bytes_per_token(2) == latent_only + 78 * 132
    per_gpu = kv_bytes_per_token_per_gpu(GLM5, Parallelism(8, 1), 0, "bf16")
    assert per_gpu == latent_only + 78 * 132  # the latent and the indexer keys are whole on every TP rank
    assert kv_bytes_per_token_per_gpu(GLM5, Parallelism(8, 1), 0, "fp8") == 78 * (576 + 132)
    deepseek = get_model("deepseek-r1")
    assert deepseek.kv_bytes_per_token(2) == 61 * 576 * 2  # no indexer


def _decode_attention(context: int) -> tuple[IndexLogitsDecode, AttentionDecode, IndexTopK | None]:
    ops = step_part("attention", "sglang", GLM5, H200, BatchSpec(decodes=(context,) * 8), tp=8, dtype="fp8-block")
    logits = next(op for op in ops if isinstance(op, IndexLogitsDecode))
    mla = next(op for op in ops if type(op) is AttentionDecode)
    topk = next((op for op in ops if isinstance(op, IndexTopK)), None)
    return logits, mla, topk


def test_decode_attention_stops_growing_past_topk_while_the_indexer_grows():
    short, at_topk, long, longer = (_decode_attention(c) for c in (1000, 2047, 20_000, 100_000))
    assert short[2] is None and at_topk[2] is None  # every key kept: no top-k
    assert short[1].kv_lens == (1001,) * 8
    assert at_topk[1].kv_lens == long[1].kv_lens == longer[1].kv_lens == (2048,) * 8
    assert long[1].flops() == longer[1].flops()
    assert long[0].kv_lens == (20_001,) * 8 and longer[0].kv_lens == (100_001,) * 8
    assert longer[0].bytes_moved() > 4.5 * long[0].bytes_moved()
    assert longer[2].keys == 8 * 100_001 and longer[2].top_k == 2048


def test_indexer_reads_fp8_keys_with_its_own_heads():
    logits, mla, _ = _decode_attention(5000)
    assert (logits.num_heads, logits.num_kv_heads, logits.head_dim) == (32, 1, 128)  # replicated, not split by TP
    assert logits.kv_dtype == logits.dtype == "fp8"
    assert mla.num_heads == 64 // 8 and mla.head_dim == 576


def test_indexer_kernels_and_its_cache_write_are_in_every_layer():
    step = expand("sglang", GLM5, H200, BatchSpec(decodes=(4096,) * 4), tp=8, dtype="fp8-block")
    for layer in (0, 3, 77):
        ops = step.layer_ops(layer)
        names = [op.name for op in ops]
        for name in ("indexer.wq_b", "indexer.wk", "indexer.weights_proj", "indexer.k_norm (LayerNorm)",
                     "indexer.rotary_emb", "indexer.k_cache_write", "indexer.logits (paged FP8 MQA)",
                     "indexer.topk", "attn.decode (sparse latent MQA)"):
            assert name in names, (layer, name)
        write = next(op for op in ops if op.name == "indexer.k_cache_write")
        assert isinstance(write, KvWrite) and write.kv_dtype == "fp8" and write.head_dim == 128


def test_long_prefill_scores_every_key_and_attends_to_topk():
    batch = BatchSpec(prefills=(PrefillChunk(4096, 8192),))
    ops = step_part("attention", "sglang", GLM5, H200, batch, tp=8, dtype="fp8-block")
    logits = next(op for op in ops if isinstance(op, IndexLogitsPrefill))
    mla = next(op for op in ops if type(op) is AttentionPrefill)
    topk = next(op for op in ops if isinstance(op, IndexTopK))
    assert logits.kv_lens == (12288,) and logits.num_heads == 32
    assert topk.rows == 4096 and topk.keys == 4096 * 8192 + 4096 * 4097 // 2
    assert mla.window == 2048 and mla.kv_shared
    # FlashMLA's sparse kernel runs the GPU's 8 heads padded to 64 on Hopper (128 on Blackwell).
    assert mla.num_heads == 64
    assert mla.flops() == pytest.approx(2 * 64 * (576 + 512) * 4096 * 2048)
    b200 = step_part("attention", "sglang", GLM5, get_gpu("B200"), batch, tp=8, dtype="fp8-block")
    assert next(op for op in b200 if type(op) is AttentionPrefill).num_heads == 128
    assert logits.flops() == pytest.approx(2 * 32 * 128 * (4096 * 8192 + 4096 * 4097 // 2))  # QK only


def test_sglang_decodes_unpadded_vllm_on_flashmla_sparse():
    batch = BatchSpec(decodes=(4096,) * 4)
    sglang = step_part("attention", "sglang", GLM5, H200, batch, tp=8, dtype="fp8-block")
    vllm = step_part("attention", "vllm", GLM5, H200, batch, tp=8, dtype="fp8-block")
    assert next(op for op in sglang if type(op) is AttentionDecode).num_heads == 8
    assert next(op for op in vllm if type(op) is AttentionDecode).num_heads == 64


@pytest.mark.parametrize("category", ["index_logits", "index_topk"])
def test_indexer_kernels_are_timed_by_their_learned_networks(category):
    """Trained on aiconfigurator-core's GLM-5 DSA tables (H100 to GB300), which bracket the H200 and B200."""
    from servesim.estimator.base import get_estimator

    estimator = get_estimator("mlp")
    assert {"H200", "B200"} <= set(estimator.trained_gpus(category))
    assert not estimator.falls_back(category, H200)
    logits, _, topk = _decode_attention(20_000)
    short, _, long_topk = _decode_attention(100_000)
    times = estimator.predict_us([logits, short, topk, long_topk], H200)
    assert times[1] > times[0] > 0 and times[3] > times[2] > 0


def test_short_sglang_prefill_runs_mha_with_a_keys_only_indexer():
    """SGLang keeps every key of a prompt of at most index_topk tokens: MHA form, indexer keys only."""
    step = expand("sglang", GLM5, H200, BatchSpec(prefills=(PrefillChunk(1024),) * 2), tp=8, dtype="fp8-block")
    names = [op.name for op in step.layer_ops(5)]
    assert "indexer.wk" in names and "indexer.k_cache_write" in names
    assert "indexer.wq_b" not in names and "indexer.topk" not in names
    assert "attn.prefill (MHA form)" in names
    vllm = [op.name for op in expand("vllm", GLM5, H200, BatchSpec(prefills=(PrefillChunk(1024),)), tp=8,
                                     dtype="fp8-block").layer_ops(5)]
    assert "indexer.logits (FP8 MQA)" in vllm and "attn.prefill (latent MQA)" in vllm  # vLLM's always scores
    assert "indexer.topk" not in vllm  # no query has more than index_topk keys


def test_config_without_indexer_keys_is_refused():
    cfg = _aic_config("zai-org--GLM-5-FP8_config.json")
    del cfg["index_topk"]
    with pytest.raises(ServesimError, match="index_topk"):
        config_from_hf_dict(cfg, name="broken", source="broken.json")


def test_latency_cli_runs_glm5():
    from servesim.cli.serving import latency_command

    args = ["--model", "glm-5", "--gpu", "H200", "--tp", "8", "--dtype", "fp8-block", "--engine", "sglang",
            "--batch-size", "8", "--input-len", "1024", "--output-len", "128", "--json"]
    out = CliRunner().invoke(latency_command, args)
    assert out.exit_code == 0, out.output
    result = json.loads(out.output)
    assert result["config"]["model"] == "glm-5"
    ttft_ms, tpot_ms = result["ttft_ms"], result["tpot_ms"]
    assert 0 < tpot_ms < ttft_ms
