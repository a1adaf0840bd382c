"""Engine expansion: the kernel sequence of a step matches the model code, the parameter count and the engines."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim.errors import ServesimError
from servesim.hardware import get_gpu
from servesim.kernels.batch import parse_batch
from servesim.kernels.expand import expand, padded_vocab, stage_layers, step_part
from servesim.kernels.types import AttentionDecode, AttentionPrefill, Collective, FusedMoE, Gemm, Kernel, ScaledMM
from servesim.models import get_model

H100 = get_gpu("H100")
AMPERE = get_gpu("A100")
LLAMA70 = get_model("llama3-70b")
QWEN_MOE = get_model("qwen3-30b-a3b")
BIG_PREFILL = parse_batch("prefill:1500, prefill:700+300, decode:40x2000")  # 2240 tokens: eager in both engines


def _matmul_flops(step) -> float:
    return sum(s.op.flops() for s in step.kernels if isinstance(s.op, (Gemm, ScaledMM, FusedMoE)))


def _attention_flops(step) -> float:
    return sum(s.op.flops() for s in step.kernels if isinstance(s.op, (AttentionPrefill, AttentionDecode)))


def _dense_weights_per_gpu(model, tp: int) -> int:
    """Linear-layer weights of one layer on one GPU (norms and biases excluded), from the model's own counts."""
    weights = model.attention_params_per_layer() + model.dense_mlp_params()
    weights -= 2 * model.head_dim if model.qk_norm else 0
    weights -= model.q_size + 2 * model.kv_size if model.attention_bias else 0
    return weights // tp


def _lm_head_flops(model, rows: int, tp: int) -> float:
    return 2.0 * rows * model.hidden_size * padded_vocab(model.vocab_size) / tp


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("tp", [1, 4, 8])
def test_dense_gemm_flops_are_two_flops_per_weight_per_token(engine, tp):
    step = expand(engine, LLAMA70, H100, BIG_PREFILL, tp=tp)
    tokens = BIG_PREFILL.num_tokens
    expected = 2.0 * _dense_weights_per_gpu(LLAMA70, tp) * LLAMA70.num_layers * tokens
    expected += _lm_head_flops(LLAMA70, BIG_PREFILL.num_requests, tp)
    assert _matmul_flops(step) == pytest.approx(expected, rel=1e-12)


def test_graph_padding_adds_the_padded_tokens_work():
    batch = parse_batch("decode:13x500")  # vLLM pads 13 tokens to its 16-token graph
    step = expand("vllm", LLAMA70, H100, batch, tp=4)
    assert step.graph_mode == "full" and step.padded_tokens == 16
    expected = 2.0 * _dense_weights_per_gpu(LLAMA70, 4) * LLAMA70.num_layers * 16 + _lm_head_flops(LLAMA70, 13, 4)
    assert _matmul_flops(step) == pytest.approx(expected, rel=1e-12)


def test_moe_flops_count_routed_experts_and_the_replicated_router():
    m, tp = QWEN_MOE, 4
    step = expand("vllm", m, H100, BIG_PREFILL, tp=tp)
    t = BIG_PREFILL.num_tokens
    attn_weights = m.hidden_size * (m.q_size + 2 * m.kv_size) + m.q_size * m.hidden_size
    per_layer = (2.0 * t * attn_weights / tp
                 + 2.0 * t * m.hidden_size * m.num_experts  # router, on every GPU
                 + 2.0 * t * m.num_experts_per_tok * 3 * m.hidden_size * m.moe_intermediate_size / tp)
    expected = per_layer * m.num_layers + _lm_head_flops(m, BIG_PREFILL.num_requests, tp)
    assert _matmul_flops(step) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("engine,gpu", [("vllm", H100), ("sglang", H100), ("vllm", AMPERE), ("sglang", AMPERE)])
def test_attention_flops_equal_the_causal_closed_form_on_every_backend(engine, gpu):
    step = expand(engine, LLAMA70, gpu, BIG_PREFILL, tp=4)
    pairs = sum(q * (kv - q) + q * (q + 1) // 2 for q, kv in zip(BIG_PREFILL.query_lens, BIG_PREFILL.kv_lens))
    heads = LLAMA70.num_attention_heads // 4
    assert _attention_flops(step) == 4.0 * heads * LLAMA70.head_dim * pairs * LLAMA70.num_layers


LLAMA_LAYER = ["add_rmsnorm", "gemm", "rope", "kv_write", "attn_prefill", "gemm", "all_reduce",
               "add_rmsnorm", "gemm", "silu_mul", "gemm", "all_reduce"]


def _kinds(ops) -> list[str]:
    return [op.op if isinstance(op, Collective) else op.category for op in ops]


def _by_name(ops) -> dict[str, object]:
    return {op.name: op for op in ops}


def test_llama3_70b_tp4_layer_matches_the_model_code():
    step = expand("vllm", LLAMA70, H100, BIG_PREFILL, tp=4)
    assert (step.first_layer, step.end_layer) == (0, 80)
    assert _kinds(step.layer_ops(0)) == ["rmsnorm", *LLAMA_LAYER[1:]]  # layer 0 starts the residual
    runs = step.layer_runs()
    assert [(first, last) for first, last, _ in runs] == [(0, 0), (1, 79)]
    assert _kinds(runs[1][2]) == LLAMA_LAYER
    ops = _by_name(runs[1][2])
    t = BIG_PREFILL.num_tokens
    assert (ops["qkv_proj"].m, ops["qkv_proj"].n, ops["qkv_proj"].k) == (t, (64 + 2 * 8) * 128 // 4, 8192)
    assert (ops["o_proj"].n, ops["o_proj"].k) == (8192, 64 * 128 // 4)
    assert (ops["gate_up_proj"].n, ops["gate_up_proj"].k) == (2 * 28672 // 4, 8192)
    assert (ops["down_proj"].n, ops["down_proj"].k) == (8192, 28672 // 4)
    assert ops["attn"].num_heads == 16 and ops["attn"].num_kv_heads == 2 and ops["attn"].backend == "fa3"
    outside = _by_name(s.op for s in step.ops if s.layer is None)
    assert outside["embed_tokens"].vocab_rows == 128256 // 4
    assert (outside["lm_head"].m, outside["lm_head"].n) == (BIG_PREFILL.num_requests, 128256 // 4)
    assert outside["logits.all_gather"].group_size == 4
    assert outside["sampler"].rows == BIG_PREFILL.num_requests
    assert len(step.collectives) == 2 * 80 + 2  # two all-reduces per layer, embedding all-reduce, logits gather


def test_qwen3_30b_a3b_tp4_layer_matches_the_model_code():
    step = expand("sglang", QWEN_MOE, H100, BIG_PREFILL, tp=4)
    ops = step.layer_ops(5)
    assert _kinds(ops) == ["add_rmsnorm", "gemm", "rmsnorm", "rmsnorm", "rope", "kv_write", "attn_prefill", "gemm",
                           "all_reduce", "add_rmsnorm", "gemm", "router_topk", "moe", "all_reduce"]
    ops = _by_name(ops)
    t = BIG_PREFILL.num_tokens
    assert ops["qkv_proj"].n == (32 + 2 * 4) * 128 // 4 and ops["qkv_proj"].k == 2048
    assert ops["q_norm"].rows == t * 8 and ops["k_norm"].rows == t * 1 and ops["q_norm"].dim == 128
    assert (ops["gate"].n, ops["gate"].k) == (128, 2048)
    moe = ops["experts"]
    assert (moe.num_experts, moe.top_k, moe.hidden, moe.intermediate) == (128, 8, 2048, 768 // 4)
    assert sum(moe.expert_tokens) == t * 8
    assert ops["topk"].renormalize is True


def test_kv_heads_are_replicated_when_tp_exceeds_them():
    step = expand("vllm", LLAMA70, H100, BIG_PREFILL, tp=16)
    ops = _by_name(step.layer_ops(3))
    assert ops["attn"].num_kv_heads == 1
    assert ops["qkv_proj"].n == (64 // 16 + 2) * 128


@pytest.mark.parametrize("model,tp,pp,what", [
    ("llama3-70b", 3, 1, "attention heads"),
    ("qwen2.5-14b", 5, 1, "KV heads"),
    ("llama3-70b", 1, 81, "layers"),
])
def test_impossible_layouts_are_refused_with_the_reason(model, tp, pp, what):
    with pytest.raises(ServesimError, match=what):
        expand("vllm", get_model(model), H100, BIG_PREFILL, tp=tp, pp=pp)


def test_pipeline_stages_follow_get_pp_indices():
    assert [len(stage_layers(80, 3, s)) for s in range(3)] == [27, 27, 26]
    assert [len(stage_layers(61, 4, s)) for s in range(4)] == [15, 15, 16, 15]
    batch = parse_batch("prefill:1000")
    first, middle, last = (expand("vllm", LLAMA70, H100, batch, tp=2, pp=3, stage=s) for s in range(3))
    assert (first.first_layer, middle.first_layer, last.first_layer, last.end_layer) == (0, 27, 54, 80)
    names = [[s.op.name for s in st.ops if s.layer is None] for st in (first, middle, last)]
    assert names[0][:1] == ["embed_tokens"] and names[0][-2:] == ["send hidden_states", "send residual"]
    assert "recv hidden_states" in names[1] and "send residual" in names[1] and "lm_head" not in names[1]
    assert "lm_head" in names[2] and "embed_tokens" not in names[2]
    send = _by_name(s.op for s in first.ops)["send hidden_states"]
    assert send.bytes == 1000 * 8192 * 2 // 2  # each TP rank sends its half; the receivers all-gather
    assert _kinds(middle.layer_ops(27))[0] == "add_rmsnorm"  # the residual arrives with the activations


def test_engines_differ_where_the_engines_differ():
    mixed = parse_batch("prefill:200+100, decode:30x900")
    v, s = (expand(e, LLAMA70, H100, mixed, tp=4) for e in ("vllm", "sglang"))
    assert (v.graph_mode, v.padded_tokens) == ("piecewise", 232)  # vLLM graphs mixed steps up to 512 tokens
    assert (s.graph_mode, s.padded_tokens) == ("none", 230)  # SGLang graphs decode batches only

    decode = parse_batch("decode:10x900")
    v, s = (expand(e, LLAMA70, H100, decode, tp=4) for e in ("vllm", "sglang"))
    assert v.padded_tokens == 16 and s.padded_tokens == 12
    assert _by_name(s.op for s in v.ops)["lm_head"].m == 10  # vLLM computes logits outside the graph
    assert _by_name(s.op for s in s.ops)["lm_head"].m == 12  # SGLang captures them with the padded batch

    cached = parse_batch("prefill:500+1500, decode:4x900")
    v, s = (expand(e, LLAMA70, AMPERE, cached, tp=4) for e in ("vllm", "sglang"))
    assert [(k.name, k.backend) for k in v.layer_ops(1) if isinstance(k, (AttentionPrefill, AttentionDecode))] == [
        ("attn", "fa2")]
    s_attn = [k for k in s.layer_ops(1) if isinstance(k, AttentionPrefill)]
    assert [(k.name, k.kv_layout, k.causal, k.backend) for k in s_attn] == [
        ("attn.ragged", "ragged", True, "flashinfer"), ("attn.prefix", "paged", False, "flashinfer")]


def test_vllm_flashinfer_runs_decodes_and_prefills_as_two_kernels():
    blackwell = get_gpu("B200")
    step = expand("vllm", LLAMA70, blackwell, parse_batch("prefill:600, decode:8x100"), tp=4)
    attn = [k for k in step.layer_ops(1) if isinstance(k, (AttentionPrefill, AttentionDecode))]
    assert [type(k) for k in attn] == [AttentionDecode, AttentionPrefill]
    assert attn[0].kv_lens == (101,) * 8 and attn[1].query_lens == (600,)


def test_all_reduce_uses_custom_ar_for_small_messages_on_nvswitch():
    decode = expand("vllm", LLAMA70, H100, parse_batch("decode:64x1000"), tp=4)
    assert {c.op.implementation for c in decode.collectives if c.op.op == "all_reduce"} == {"custom_ar"}
    prefill = expand("vllm", LLAMA70, H100, parse_batch("prefill:4096"), tp=4)  # 64 MiB per all-reduce
    assert {c.op.implementation for c in prefill.collectives if c.op.op == "all_reduce"} == {"nccl"}
    # PCIe-only parts never take the custom kernel (P2P is not on the spec sheet); NVLink-bridged pairs do.
    for gpu, tp, impl in ((get_gpu("L40S"), 2, "nccl"), (get_gpu("L40S"), 4, "nccl"), (get_gpu("A40"), 2, "custom_ar")):
        step = expand("sglang", LLAMA70, gpu, parse_batch("decode:64x1000"), tp=tp)
        assert {c.op.implementation for c in step.collectives if c.op.op == "all_reduce"} == {impl}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("gpu_name,tp", [("H100", 8), ("H100", 2), ("B200", 4), ("A100", 8), ("L40S", 2)])
def test_expanded_all_reduce_choice_agrees_with_the_communication_model(engine, gpu_name, tp):
    from servesim.comm import allreduce_implementation

    gpu = get_gpu(gpu_name)
    for batch in ("decode:1x100", "decode:64x1000", "prefill:512", "prefill:4096"):
        step = expand(engine, LLAMA70, gpu, parse_batch(batch), tp=tp)
        for s in step.collectives:
            if s.op.op == "all_reduce":
                expected = allreduce_implementation(engine, gpu, tp, s.op.bytes)
                assert (s.op.implementation == "custom_ar") == expected.startswith("custom"), (batch, s.op.bytes)


@pytest.mark.parametrize("dtype,scale", [("fp8", "tensor"), ("fp8-block", "block")])
def test_fp8_quantises_every_linear_but_router_and_lm_head(dtype, scale):
    bf16 = expand("vllm", QWEN_MOE, H100, BIG_PREFILL, tp=2)
    fp8 = expand("vllm", QWEN_MOE, H100, BIG_PREFILL, tp=2, dtype=dtype)
    layer = fp8.layer_ops(2)
    mms = [k for k in layer if isinstance(k, ScaledMM)]
    assert [k.name for k in mms] == ["qkv_proj", "o_proj"] and {k.scale for k in mms} == {scale}
    assert [k.name for k in layer if k.category == "quant"] == ["qkv_proj.quant", "o_proj.quant"]
    assert {k.engine for k in expand("sglang", QWEN_MOE, H100, BIG_PREFILL, tp=2, dtype=dtype).layer_ops(2)
            if k.category == "quant"} == {"sglang"}
    assert [k.name for k in layer if isinstance(k, Gemm)] == ["gate"]
    assert _by_name(layer)["experts"].dtype == "fp8"
    assert _matmul_flops(fp8) == pytest.approx(_matmul_flops(bf16), rel=1e-12)
    assert fp8.bytes_moved < bf16.bytes_moved


@pytest.mark.parametrize("engine,dtype,library", [
    ("vllm", "fp8", "cutlass"), ("sglang", "fp8", "sgl_kernel"), ("vllm", "fp8-block", "deepgemm"),
    ("sglang", "fp8-block", "deepgemm"),
])
def test_fp8_linears_name_the_library_the_engine_runs(engine, dtype, library):
    step = expand(engine, LLAMA70, H100, BIG_PREFILL, tp=4, dtype=dtype)
    assert {s.op.library for s in step.kernels if isinstance(s.op, ScaledMM)} == {library}


def test_scaled_mm_library_must_run_its_scale():
    assert ScaledMM(m=8, n=64, k=64, scale="block").library == "deepgemm"
    assert ScaledMM(m=8, n=64, k=64) != ScaledMM(m=8, n=64, k=64, library="sgl_kernel")
    with pytest.raises(ValueError, match="no block-scaled MM in library 'cutlass'"):
        ScaledMM(m=8, n=64, k=64, scale="block", library="cutlass")


def test_fp8_needs_fp8_tensor_cores():
    with pytest.raises(ServesimError, match="FP8"):
        expand("vllm", LLAMA70, AMPERE, BIG_PREFILL, tp=4, dtype="fp8")


def test_unknown_engine_is_named():
    with pytest.raises(ServesimError, match="sglang"):
        expand("sglnag", LLAMA70, H100, BIG_PREFILL)


def test_repeated_steps_are_memoised():
    assert expand("vllm", LLAMA70, H100, BIG_PREFILL, tp=4) is expand("vllm", LLAMA70, H100, BIG_PREFILL, tp=4)


def test_totals_are_the_sums_of_the_sequence():
    step = expand("sglang", QWEN_MOE, H100, BIG_PREFILL, tp=4)
    assert step.flops == pytest.approx(sum(s.op.flops() for s in step.kernels))
    assert step.bytes_moved == pytest.approx(sum(s.op.bytes_moved() for s in step.kernels))
    assert all(isinstance(s.op, Kernel) for s in step.kernels)


VIDUR = Path(__file__).parents[2] / "shared" / "data" / "vidur" / "compute"


@pytest.mark.parametrize("preset,folder", [("llama3-70b", "Meta-Llama-3-70B"), ("llama3-8b", "Meta-Llama-3-8B")])
def test_gemm_shapes_match_vidurs_measured_ops(preset, folder):
    import pandas as pd
    path = VIDUR / "a100" / "meta-llama" / folder / "mlp.csv"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    frame = pd.read_csv(path, usecols=["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size",
                                       "num_tokens", "num_tensor_parallel_workers"])
    model = get_model(preset)
    row = frame.iloc[0]
    assert (model.num_attention_heads, model.num_kv_heads, model.hidden_size, model.intermediate_size,
            model.vocab_size) == (row.n_head, row.n_kv_head, row.n_embd, row.n_expanded_embd, row.vocab_size)
    head_dim = row.n_embd // row.n_head
    token_counts = sorted(frame.num_tokens.unique())[::20]  # a spread of Vidur's sizes, graphed and eager
    for tp in sorted(frame.num_tensor_parallel_workers.unique()):
        for tokens in token_counts:
            step = expand("vllm", model, H100, parse_batch(f"prefill:{tokens}"), tp=int(tp))
            ops = _by_name(step.layer_ops(1))
            assert ops["qkv_proj"].m == tokens  # Vidur's sizes are vLLM capture sizes: no padding
            assert (ops["qkv_proj"].n, ops["qkv_proj"].k) == (
                (row.n_head + 2 * row.n_kv_head) * head_dim // tp, row.n_embd)
            assert (ops["o_proj"].n, ops["o_proj"].k) == (row.n_embd, row.n_embd // tp)
            assert (ops["gate_up_proj"].n, ops["gate_up_proj"].k) == (2 * row.n_expanded_embd // tp, row.n_embd)
            assert (ops["down_proj"].n, ops["down_proj"].k) == (row.n_embd, row.n_expanded_embd // tp)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_fp8_kv_cache_halves_the_attention_kv_traffic(engine):
    batch = parse_batch("decode:32x4000")
    bf16, fp8 = (expand(engine, LLAMA70, H100, batch, tp=4, dtype="fp8", kv_cache_dtype=kv) for kv in ("auto", "fp8"))
    attn16, attn8 = (next(s.op for s in step.kernels if isinstance(s.op, AttentionDecode)) for step in (bf16, fp8))
    assert (attn16.kv_dtype, attn8.kv_dtype) == ("bf16", "fp8")
    kv_bytes = 32 * 4000 * 2 * attn16.num_kv_heads * attn16.head_dim  # K and V, one byte less per element
    assert attn16.bytes_moved() - attn8.bytes_moved() == pytest.approx(kv_bytes, rel=1e-3)
    writes = {s.op.kv_dtype for s in fp8.kernels if s.op.name == "kv_cache_write"}
    assert writes == {"fp8"}


def test_unknown_kv_cache_dtype_is_one_line_error():
    with pytest.raises(ServesimError, match="unknown KV-cache dtype 'int4'"):
        expand("vllm", LLAMA70, H100, BIG_PREFILL, tp=4, kv_cache_dtype="int4")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("model_name, tp", [("llama3-70b", 4), ("qwen3-30b-a3b", 2)])
def test_only_the_sampled_row_ops_change_with_the_request_count(engine, model_name, tp):
    # Step times split a mixed step's ops outside attention into those that follow its tokens and those on its
    # sampled rows: at equal tokens, a batch of more requests differs outside attention in exactly those.
    model, gpu = get_model(model_name), get_gpu("H100")
    one, many = parse_batch("prefill:2000"), parse_batch("prefill:1500, decode:500x800")

    def outside_attention(batch):
        step = expand(engine, model, gpu, batch, tp, 2, 1)
        return {op for op, _ in step.op_counts if not isinstance(op, (AttentionDecode, AttentionPrefill))}

    sampled_one = set(step_part("sampled_rows", engine, model, gpu, one, tp))
    sampled_many = set(step_part("sampled_rows", engine, model, gpu, many, tp))
    assert {op.name for op in sampled_many} >= {"lm_head", "sampler"}
    assert outside_attention(one) - sampled_one == outside_attention(many) - sampled_many
    assert sampled_one <= outside_attention(one) and sampled_many <= outside_attention(many)
    assert not sampled_one & sampled_many
    with pytest.raises(ServesimError, match="unknown step part"):
        step_part("rest", engine, model, gpu, one, tp)
