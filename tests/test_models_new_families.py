"""MiniMax-M2.5: its config parses to the published architecture and its layers expand to the kernels the engines
launch.

Published figures: MiniMax-M2 model card (230B total, 10B activated).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.errors import ServesimError
from servesim.hardware import get_gpu
from servesim.kernels.batch import parse_batch
from servesim.kernels.expand import expand, padded_vocab
from servesim.kernels.types import Collective, FusedMoE, Gemm, RMSNorm, Rope, ScaledMM
from servesim.models import get_model
from servesim.models.config import config_from_hf_dict

H100, H200 = get_gpu("H100"), get_gpu("H200")
MINIMAX = get_model("minimax-m2.5")


def _kernels(step, kind):
    return [s for s in step.kernels if isinstance(s.op, kind)]


# --- configs --------------------------------------------------------------------------------------------------


def test_minimax_config_maps_to_its_architecture():
    m = MINIMAX
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.head_dim) == (62, 3072, 48, 8, 128)
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (256, 8, 1536)
    assert m.moe_layer_indices == tuple(range(62))  # every layer MoE, no dense or shared-expert MLP
    assert m.qk_norm == "layer" and m.rope_dim == 64
    assert m.checkpoint_quant == "fp8-block" and m.router_dtype == "fp32"
    assert m.total_params() == pytest.approx(230e9, rel=0.01)
    assert m.active_params() - m.embedding_params() == pytest.approx(10e9, rel=0.05)


@pytest.mark.parametrize(("preset", "file"), [("minimax-m2.5", "MiniMaxAI--MiniMax-M2.5_config.json")])
def test_aiconfigurator_config_files_parse_like_the_presets(preset, file):
    core = pytest.importorskip("aiconfigurator_core")
    from pathlib import Path

    cfg = json.loads((Path(core.__file__).parent / "model_configs" / file).read_text())
    parsed = config_from_hf_dict(cfg, name=preset, source=get_model(preset).source)
    assert parsed == get_model(preset)


# --- kernels --------------------------------------------------------------------------------------------------

BATCH = parse_batch("prefill:1500, prefill:700+300, decode:40x2000")


@pytest.mark.parametrize(("model", "dtype"), [(MINIMAX, "fp8")])
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


# --- formats a GPU cannot run ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "gpu", "dtype", "message"), [
    ("minimax-m2.5", "A100", "fp8", "no FP8 Tensor cores"),
])
def test_formats_that_cannot_run_are_one_line_errors(model, gpu, dtype, message):
    with pytest.raises(ServesimError, match=message):
        expand("vllm", get_model(model), get_gpu(gpu), BATCH, tp=8, dtype=dtype)
    result = CliRunner().invoke(main, ["latency", "--model", model, "--gpu", gpu, "--tp", "8", "--dtype", dtype,
                                       "--output-len", "4"])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_latency_runs_for_the_new_families():
    for args in (["--model", "minimax-m2.5", "--gpu", "H200", "--tp", "4", "--dtype", "fp8"],):
        result = CliRunner().invoke(main, ["latency", *args, "--output-len", "8", "--json"])
        assert result.exit_code == 0, result.output
        payload = json.loads(result.output)
        assert 0 < payload["ttft_ms"] and 0 < payload["tpot_ms"] < payload["ttft_ms"] * 10
