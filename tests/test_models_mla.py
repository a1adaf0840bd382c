"""DeepSeek-V3/R1, DeepSeek-V2-Lite and Kimi-K2.5: multi-head latent attention and DeepSeekMoE.

Published figures: DeepSeek-V3 technical report (arXiv 2412.19437: 671B total, 37B activated parameters; 61 layers,
the first 3 dense; 256 routed experts top-8 plus 1 shared; MLA with a 512-wide KV latent and 64-wide rotary key);
DeepSeek-V2 report (arXiv 2405.04434, V2-Lite: 15.7B total, 2.4B activated; 27 layers, the first dense; 64 routed
experts top-6 plus 2 shared; no query compression); Kimi-K2 model card (1T total, 32B activated; 384 experts, 64
heads, 1 dense layer).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.errors import ServesimError
from servesim.hardware import get_gpu
from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.kernels.expand import expand, step_part
from servesim.kernels.types import AttentionDecode, AttentionPrefill, FusedMoE, KvWrite, MarlinMoE
from servesim.models import get_model
from servesim.models.config import config_from_hf_dict
from servesim.models.memory import kv_bytes_per_token_per_gpu, weight_bytes_per_gpu
from servesim.models.parallel import Parallelism

H200, B200 = get_gpu("H200"), get_gpu("B200")
R1 = get_model("deepseek-r1")
KIMI = get_model("kimi-k2.5")
AIC_CONFIGS = (Path(__file__).resolve().parents[1]
               / ".venv/lib/python3.11/site-packages/aiconfigurator_core/model_configs")


def _ops(step, kind):
    return [s.op for s in step.kernels if isinstance(s.op, kind)]


def test_deepseek_r1_config_loads_to_its_dense_and_moe_layers():
    m = R1
    assert m.is_mla and m.model_type == "deepseek_v3" and m.checkpoint_quant == "fp8-block"
    assert (m.num_layers, len(m.moe_layer_indices), m.moe_layer_indices[0]) == (61, 58, 3)
    assert (m.num_experts, m.num_experts_per_tok, m.n_shared_experts, m.n_group, m.topk_group) == (256, 8, 1, 8, 4)
    assert (m.kv_lora_rank, m.qk_rope_head_dim, m.head_dim, m.v_head_dim, m.q_lora_rank) == (512, 64, 192, 128, 1536)
    assert m.total_params() == pytest.approx(671e9, rel=0.01)
    assert m.active_params() == pytest.approx(37e9, rel=0.03)


def test_deepseek_v2_lite_projects_queries_straight_and_routes_ungrouped():
    m = get_model("deepseek-v2-lite")
    assert m.is_mla and m.model_type == "deepseek_v2" and m.q_lora_rank == 0
    assert (m.num_layers, len(m.moe_layer_indices), m.moe_layer_indices[0]) == (27, 26, 1)
    assert (m.num_experts, m.num_experts_per_tok, m.n_shared_experts, m.n_group) == (64, 6, 2, 1)
    assert not m.norm_topk_prob and m.intermediate_size == 10944  # the dense first layer's width
    assert m.total_params() == pytest.approx(15.7e9, rel=0.01)
    assert m.active_params() - m.embedding_params() == pytest.approx(2.4e9, rel=0.03)
    names = {op.name for op in expand("vllm", m, get_gpu("A100"), BatchSpec((PrefillChunk(512),))).layer_ops(1)}
    assert "q_proj" in names and not names & {"q_a_proj", "q_b_proj", "fused_qkv_a_proj"}


@pytest.mark.skipif(not AIC_CONFIGS.is_dir(), reason="aiconfigurator-core's model configs are not installed")
def test_kimi_k25_config_json_reads_its_text_config():
    raw = json.loads((AIC_CONFIGS / "moonshotai--Kimi-K2.5_config.json").read_text())
    m = config_from_hf_dict(raw, "kimi", "kimi")
    assert m == dataclasses.replace(KIMI, name="kimi", source="kimi")
    assert (m.num_attention_heads, m.num_experts, len(m.moe_layer_indices), m.checkpoint_quant) == (
        64, 384, 60, "compressed-tensors")
    assert m.total_params() == pytest.approx(1.03e12, rel=0.02)


def test_a_wrapper_without_text_config_is_one_line_error():
    with pytest.raises(ServesimError, match="text_config"):
        config_from_hf_dict({"model_type": "kimi_k25"}, "x", "x.json")


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_kv_bytes_per_token_are_the_whole_latent_on_every_gpu(tp):
    per_gpu = kv_bytes_per_token_per_gpu(R1, Parallelism(tp, 1), 0, "bf16")
    assert per_gpu == (512 + 64) * 61 * 2  # not divided by TP: each rank caches every token's latent
    assert kv_bytes_per_token_per_gpu(R1, Parallelism(tp, 1), 0, "fp8") == (512 + 64) * 61
    assert R1.kv_bytes_per_token(2) == per_gpu


def test_weights_split_by_tp_but_the_latent_projection_is_replicated():
    w1 = weight_bytes_per_gpu(R1, Parallelism(1, 1), 0, "fp8")
    w8 = weight_bytes_per_gpu(R1, Parallelism(8, 1), 0, "fp8")
    assert w1 / 8 < w8 < w1 / 7
    assert 75 * 2**30 < w8 < 85 * 2**30  # ~671 GB of FP8 over 8 GPUs


def test_decode_attention_reads_the_latent_cache():
    step = expand("vllm", R1, H200, BatchSpec(decodes=(4096,) * 16), tp=8, dtype="fp8-block")
    (attn,) = {op for op in _ops(step, AttentionDecode)}
    assert (attn.num_kv_heads, attn.head_dim, attn.v_head_dim, attn.kv_shared, attn.num_heads) == (
        1, 576, 512, True, 16)
    # one latent per cached token, read once: K and V are the same bytes
    assert attn.bytes_moved() == pytest.approx(sum(attn.kv_lens) * 576 * 2 + 16 * 16 * (576 + 512) * 2)
    (write,) = {op for op in _ops(step, KvWrite)}
    assert write.kv_shared and write.head_dim == 576
    assert not _ops(step, AttentionPrefill)


def test_prefill_runs_the_mha_form_and_cached_context_costs_more():
    fresh = expand("vllm", R1, H200, BatchSpec((PrefillChunk(2048),)), tp=8, dtype="fp8-block")
    (attn,) = {op for op in _ops(fresh, AttentionPrefill)}
    assert (attn.head_dim, attn.v_head_dim, attn.num_kv_heads, attn.num_heads) == (192, 128, 16, 16)
    cached = expand("vllm", R1, H200, BatchSpec((PrefillChunk(2048, 8192),)), tp=8, dtype="fp8-block")
    assert cached.flops > fresh.flops
    assert len(step_part("attention", "vllm", R1, H200, BatchSpec((PrefillChunk(2048, 8192),)), tp=8,
                         dtype="fp8-block")) > len(step_part("attention", "vllm", R1, H200,
                                                             BatchSpec((PrefillChunk(2048),)), tp=8,
                                                             dtype="fp8-block"))


def test_shared_experts_add_flops_and_moe_layers_route_grouped():
    batch = BatchSpec((PrefillChunk(512),))
    with_shared = expand("sglang", R1, H200, batch, tp=8, dtype="fp8-block")
    without = expand("sglang", dataclasses.replace(R1, n_shared_experts=0), H200, batch, tp=8, dtype="fp8-block")
    extra = with_shared.flops - without.flops
    assert extra == pytest.approx(58 * 2 * 512 * 3 * 7168 * 2048 / 8, rel=0.01)
    moe = with_shared.layer_ops(3)
    assert any(type(op).__name__ == "RouterTopK" and op.num_groups == 8 and op.topk_groups == 4 for op in moe)
    assert any(isinstance(op, FusedMoE) for op in moe) and not any(isinstance(op, FusedMoE)
                                                                   for op in with_shared.layer_ops(2))


def test_sglang_runs_deepseeks_shared_expert_inside_the_fused_moe():
    """SGLang's shared-experts fusion: DeepSeek-V3/R1's shared expert is a 257th expert every token picks, in the
    Triton fused MoE; not under expert parallelism, FlashInfer's TRT-LLM MoE (B200) or for Kimi-K2's 384 experts;
    vLLM keeps it a dense MLP beside the experts. The work is the same either way."""
    batch = BatchSpec(decodes=(1500,) * 4)

    def layer(engine, model=R1, gpu=H200, ep=1):
        return expand(engine, model, gpu, batch, tp=8, ep=ep, dtype="fp8-block").layer_ops(3)

    (fused,) = [op for op in layer("sglang") if isinstance(op, FusedMoE)]
    assert fused.top_k == 9 and max(fused.expert_tokens) == 4 == fused.expert_tokens[-1]
    assert not [op for op in layer("sglang") if op.name.startswith("shared_experts")]
    (apart,) = [op for op in layer("vllm") if isinstance(op, FusedMoE)]
    assert apart.top_k == 8 and fused.flops() - apart.flops() == pytest.approx(6.0 * 4 * 7168 * 2048 / 8)
    for engine, model, gpu, ep in (("vllm", R1, H200, 1), ("sglang", R1, H200, 8), ("sglang", R1, B200, 1),
                                   ("sglang", dataclasses.replace(KIMI, checkpoint_quant="fp8-block"), H200, 1)):
        assert [op for op in layer(engine, model, gpu, ep) if op.name == "shared_experts.gate_up_proj"], (engine, gpu)


def test_int4_experts_run_on_marlin_and_only_for_int4_checkpoints():
    step = expand("vllm", KIMI, B200, BatchSpec(decodes=(1024,) * 8), tp=8, dtype="int4")
    (moe,) = {op for op in _ops(step, MarlinMoE)}
    assert (moe.weight_dtype, moe.weight_group) == ("int4", 32)
    assert moe.weight_element_bytes == 4.5 / 8  # 4-bit values and one BF16 scale per 32
    # Kimi-K2.5's ~1T parameters, experts at 4.5 bits and the rest BF16, over 8 GPUs
    assert 65 * 2**30 < weight_bytes_per_gpu(KIMI, Parallelism(8, 1), 0, "int4") < 75 * 2**30
    with pytest.raises(ServesimError, match="INT4 experts"):
        expand("vllm", R1, H200, BatchSpec(decodes=(1,)), tp=8, dtype="int4")


@pytest.mark.parametrize("args", [
    ["--model", "deepseek-r1", "--gpu", "H200", "--dtype", "fp8-block"],
    ["--model", "kimi-k2.5", "--gpu", "B200", "--dtype", "int4"],
])
def test_latency_runs_and_twice_the_prompt_costs_more(args):
    ttft = []
    for input_len in (1024, 2048):
        result = CliRunner().invoke(main, ["latency", *args, "--tp", "8", "--batch-size", "4", "--input-len",
                                           str(input_len), "--output-len", "4"])
        assert result.exit_code == 0, result.output
        row = next(line for line in result.output.splitlines() if line.strip() and line.strip()[0].isdigit())
        ttft.append(float(row.split()[1]))
    assert ttft[1] > ttft[0]


@pytest.mark.parametrize("gpu", ["A100", "L40S", "H200", "B200"])
def test_latent_decode_times_on_every_architecture_and_grows_with_context(gpu):
    from servesim.estimator import get_estimator

    def decode(context, heads=16):
        return AttentionDecode(kv_lens=(context,) * 16, num_heads=heads, num_kv_heads=1, head_dim=576,
                               v_head_dim=512, kv_shared=True, page_size=64,
                               backend="fa2" if gpu in ("A100", "L40S") else "fa3" if gpu == "H200" else "flashinfer")

    short, long, wide = get_estimator("mlp").predict_us([decode(8192), decode(32768), decode(8192, 128)], get_gpu(gpu))
    assert 0 < short < long and wide > 0


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.pop("kv_lora_rank"), "kv_lora_rank"),
    (lambda c: c.update(n_group=3), "n_group"),
    (lambda c: c.update(qk_rope_head_dim="64"), "qk_rope_head_dim"),
])
def test_a_bad_deepseek_config_is_one_line(tmp_path, edit, message):
    from servesim.models.registry import preset_record

    config = dict(preset_record("deepseek-r1")["config"])
    edit(config)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = CliRunner().invoke(main, ["latency", "--model", str(path), "--gpu", "H200", "--tp", "8"])
    assert result.exit_code != 0 and message in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


@pytest.mark.parametrize("engine, gpu, cached, latent", [
    ("sglang", H200, 0, False), ("sglang", H200, 2048, True), ("sglang", H200, 8192, False),
    ("vllm", H200, 2048, False), ("sglang", B200, 2048, False),  # TRT-LLM MLA: always the MHA form
])
def test_sglang_absorbs_prefill_after_a_short_cached_prefix(engine, gpu, cached, latent):
    step = expand(engine, R1, gpu, BatchSpec((PrefillChunk(1024, cached),)), tp=8, dtype="fp8-block")
    attn = {op for op in _ops(step, AttentionPrefill)}
    assert {op.kv_shared for op in attn} == {latent}
    if latent:
        (op,) = attn
        assert (op.num_kv_heads, op.head_dim, op.kv_lens) == (1, 576, (1024 + cached,))


def test_step_part_attention_holds_no_op_the_rest_of_the_step_times_again():
    """The step-time model times step_part("attention") per layer and the other non-attention kernels from a proxy
    batch of the same counts: an op of a fresh chunk or a decode must not be in both."""
    for batch in (BatchSpec((PrefillChunk(1024),)), BatchSpec(decodes=(2048,) * 8)):
        part = step_part("attention", "vllm", R1, H200, batch, tp=8, dtype="fp8-block")
        assert all(isinstance(op, (AttentionPrefill, AttentionDecode)) for op in part)
    cached = step_part("attention", "vllm", R1, H200, BatchSpec((PrefillChunk(1024, 4096),)), tp=8,
                       dtype="fp8-block")
    assert any(not isinstance(op, (AttentionPrefill, AttentionDecode)) for op in cached)  # the context's expansion
