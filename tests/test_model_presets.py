"""The built-in model presets: each loads, and its figures match the published model.

Published sizes come from the model cards (Meta Llama 3 / 3.1, Qwen2.5, Qwen3, Mixtral); the KV figures are worked
by hand from each config.json: bytes/token = 2 (K and V) * layers * kv_heads * head_dim * 2 bytes (BF16).
"""

from __future__ import annotations

import json
from importlib import resources

import pytest

from servesim.errors import ServesimError
from servesim.models.registry import get_model, preset_names, preset_record

KIB = 1024

# name: (hf_id, published total parameters in billions, layers, kv_heads, head_dim, hand-worked KV KiB/token in BF16)
PRESETS = {
    "llama3-8b": ("meta-llama/Meta-Llama-3-8B", 8.03, 32, 8, 128, 128),  # 2*32*8*128*2 = 131072 B
    "llama3-70b": ("meta-llama/Meta-Llama-3-70B", 70.6, 80, 8, 128, 320),  # 2*80*8*128*2 = 327680 B
    "llama3.1-8b": ("meta-llama/Llama-3.1-8B", 8.03, 32, 8, 128, 128),
    "llama3.1-70b": ("meta-llama/Llama-3.1-70B", 70.6, 80, 8, 128, 320),
    "llama3.1-405b": ("meta-llama/Llama-3.1-405B", 405.0, 126, 8, 128, 504),  # 2*126*8*128*2 = 516096 B
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", 7.6, 28, 4, 128, 56),  # 2*28*4*128*2 = 57344 B
    "qwen2.5-14b": ("Qwen/Qwen2.5-14B-Instruct", 14.7, 48, 8, 128, 192),
    "qwen2.5-32b": ("Qwen/Qwen2.5-32B-Instruct", 32.8, 64, 8, 128, 256),
    "qwen2.5-72b": ("Qwen/Qwen2.5-72B-Instruct", 72.7, 80, 8, 128, 320),
    "qwen3-8b": ("Qwen/Qwen3-8B", 8.2, 36, 8, 128, 144),
    "qwen3-14b": ("Qwen/Qwen3-14B", 14.8, 40, 8, 128, 160),
    "qwen3-32b": ("Qwen/Qwen3-32B", 32.8, 64, 8, 128, 256),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", 30.5, 48, 4, 128, 96),
    "qwen3-235b-a22b": ("Qwen/Qwen3-235B-A22B", 235.0, 94, 4, 128, 188),
    "mixtral-8x7b": ("mistralai/Mixtral-8x7B-v0.1", 46.7, 32, 8, 128, 128),
    "llama2-7b": ("meta-llama/Llama-2-7b-hf", 6.74, 32, 32, 128, 512),  # multi-head: 2*32*32*128*2 = 524288 B
    "llama2-70b": ("meta-llama/Llama-2-70b-hf", 68.98, 80, 8, 128, 320),
    "codellama-34b": ("codellama/CodeLlama-34b-Instruct-hf", 33.74, 48, 8, 128, 192),  # 2*48*8*128*2 = 196608 B
}

# Published activated parameters of the MoE presets (billions).
ACTIVE = {"qwen3-30b-a3b": 3.3, "qwen3-235b-a22b": 22.0, "mixtral-8x7b": 12.9}


def test_every_expected_preset_ships():
    assert set(PRESETS) <= set(preset_names())


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_loads_with_its_hub_id(name):
    hf_id = PRESETS[name][0]
    model = get_model(name)
    assert model.name == name
    assert model.source == hf_id
    assert preset_record(name)["hf_id"] == hf_id
    assert get_model(name.upper()) is model  # names are case-insensitive and cached


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_total_params_match_published_size(name):
    published = PRESETS[name][1] * 1e9
    assert get_model(name).total_params() == pytest.approx(published, rel=0.02)


@pytest.mark.parametrize("name", sorted(ACTIVE))
def test_moe_active_params(name):
    model = get_model(name)
    assert model.is_moe
    assert model.active_params() == pytest.approx(ACTIVE[name] * 1e9, rel=0.03)
    assert model.moe_layer_indices == tuple(range(model.num_layers))


@pytest.mark.parametrize("name", sorted(set(PRESETS) - set(ACTIVE)))
def test_dense_presets_have_no_experts(name):
    model = get_model(name)
    assert not model.is_moe
    assert model.active_params() == model.total_params()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_kv_bytes_per_token_bf16(name):
    _, _, layers, kv_heads, head_dim, kib = PRESETS[name]
    model = get_model(name)
    assert (model.num_layers, model.num_kv_heads, model.head_dim) == (layers, kv_heads, head_dim)
    assert model.kv_bytes_per_token(2) == 2 * layers * kv_heads * head_dim * 2 == kib * KIB
    assert model.kv_bytes_per_token(1) == kib * KIB / 2  # FP8 KV cache halves it


def test_hand_worked_kv_figures():
    assert get_model("llama3-8b").kv_bytes_per_token() == 128 * KIB
    assert get_model("llama3-70b").kv_bytes_per_token() == 320 * KIB


def test_architecture_specific_flags():
    qwen25 = get_model("qwen2.5-7b")
    assert qwen25.attention_bias and not qwen25.qk_norm  # Qwen2 has QKV bias, no QK norm
    assert (qwen25.hidden_size, qwen25.intermediate_size, qwen25.vocab_size) == (3584, 18944, 152064)
    assert not qwen25.tie_word_embeddings
    qwen3 = get_model("qwen3-14b")
    assert qwen3.qk_norm and not qwen3.attention_bias
    assert (qwen3.num_attention_heads, qwen3.num_kv_heads, qwen3.head_dim, qwen3.hidden_size) == (40, 8, 128, 5120)
    qwen3_32b = get_model("qwen3-32b")
    assert qwen3_32b.q_size == 64 * 128 != qwen3_32b.hidden_size  # explicit head_dim, not hidden / heads
    moe = get_model("qwen3-30b-a3b")
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (128, 8, 768)
    assert moe.norm_topk_prob
    mixtral = get_model("mixtral-8x7b")
    assert (mixtral.num_experts, mixtral.num_experts_per_tok, mixtral.moe_intermediate_size) == (8, 2, 14336)
    llama = get_model("llama3.1-405b")
    assert llama.max_position_embeddings == 131072 and get_model("llama3-8b").max_position_embeddings == 8192


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_files_hold_only_config_json_keys(name):
    text = resources.files("servesim.models").joinpath("presets", f"{name}.json").read_text(encoding="utf-8")
    record = json.loads(text)
    assert set(record) == {"hf_id", "config"}
    cfg = record["config"]
    for key in ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings",
                "rms_norm_eps", "rope_theta", "tie_word_embeddings", "torch_dtype"):
        assert key in cfg, f"{name} lacks {key}"
    assert cfg["torch_dtype"] == "bfloat16"


def test_a_presets_own_hub_id_loads_the_preset_without_a_download():
    assert get_model("meta-llama/Meta-Llama-3-8B") is get_model("llama3-8b")


@pytest.mark.parametrize(("change", "message"), [
    ({"num_attention_heads": 0}, "num_attention_heads is 0; it must be a whole number"),
    ({"num_hidden_layers": 32.5}, "num_hidden_layers is 32.5"),
    ({"num_key_value_heads": 3}, "do not share 3 KV heads evenly"),
    ({"hidden_size": 4100}, "hidden_size 4100 is not a multiple of its 32 attention heads"),
])
def test_malformed_config_is_refused_with_the_key_named(tmp_path, change, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**preset_record("llama3-8b")["config"], **change}))
    with pytest.raises(ServesimError, match=message):
        get_model(str(path))


def test_config_path_that_is_missing_or_not_an_object_is_named(tmp_path):
    with pytest.raises(ServesimError, match="does not exist"):
        get_model(str(tmp_path / "config.json"))
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ServesimError, match="holds a JSON list, not a model config"):
        get_model(str(tmp_path / "list.json"))


def test_hub_reachability_check_is_quick_and_honours_offline_settings(monkeypatch):
    from servesim.errors import ServesimError

    import socket
    import time

    from servesim.models import registry

    with socket.socket() as closed:  # a local port nothing listens on: refused at once, whatever the network
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    start = time.monotonic()
    assert registry._hub_reachable(timeout_s=2.0) is False
    assert time.monotonic() - start < 3
    assert registry._hub_host() == "127.0.0.1"
    assert registry._offline_reason() == "127.0.0.1 cannot be reached"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert registry._offline_reason() == "HF_HUB_OFFLINE is set"
    with pytest.raises(ServesimError, match="HF_HUB_OFFLINE is set and the config is not in the local"):
        get_model("nonexistent-org/nonexistent-model")
