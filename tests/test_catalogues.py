"""Looking up GPUs and models by the names users type."""

import json

import pytest

from servesim.errors import ServesimError
from servesim.hardware import get_gpu, parse_gpu_list
from servesim.hardware.catalogue import load_prices
from servesim.models import get_model


def test_gpu_names_are_case_and_separator_insensitive():
    assert get_gpu("h100").name == get_gpu("H100-SXM").name == get_gpu("h100_sxm").name


def test_unknown_gpu_suggests_near_names():
    with pytest.raises(ServesimError, match=r"unknown GPU 'H1000'.*Did you mean.*H100"):
        get_gpu("H1000")


def test_gpu_list_deduplicates_aliases_and_keeps_order():
    specs = parse_gpu_list("H100, h100_sxm")
    assert [s.name for s in specs] == ["H100-SXM"]
    with pytest.raises(ServesimError, match="no GPU given"):
        parse_gpu_list(" , ")
    with pytest.raises(ServesimError, match="'all' already names every GPU"):
        parse_gpu_list("all,H100")


def test_price_file_overrides_and_rejects_bad_numbers(tmp_path):
    good = tmp_path / "prices.csv"
    good.write_text("gpu,usd_per_gpu_hour,date\nH100,1.85,2026-10-01\n")
    assert load_prices(good) == {"H100-SXM": (1.85, "2026-10-01")}
    bad = tmp_path / "bad.csv"
    bad.write_text("gpu,usd_per_gpu_hour\nH100,cheap\n")
    with pytest.raises(ServesimError, match="line 2"):
        load_prices(bad)


@pytest.mark.parametrize("text,message", [
    ("", "needs the columns"),
    ("gpu,usd_per_gpu_hour\n", "has no prices"),
    ("name,price\nH100,2\n", "needs the columns"),
])
def test_price_file_without_prices_is_refused_not_ignored(tmp_path, text, message):
    empty = tmp_path / "prices.csv"
    empty.write_text(text)
    with pytest.raises(ServesimError, match=message):
        load_prices(empty)


def test_unknown_model_suggests_presets():
    with pytest.raises(ServesimError, match=r"unknown model 'llama3-7b'.*Did you mean.*llama3-70b"):
        get_model("llama3-7b")


def test_local_config_json_loads(tmp_path):
    config = {
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model = get_model(str(path))
    assert model.head_dim == 64 and model.num_layers == 16
    assert model.lm_head_params() == 0


def test_unsupported_architecture_is_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba", "hidden_size": 1}))
    with pytest.raises(ServesimError, match="model_type 'mamba'"):
        get_model(str(path))


def test_hub_id_without_network_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ServesimError, match="cannot load model config from hub id"):
        get_model("nonexistent-org/nonexistent-model")
