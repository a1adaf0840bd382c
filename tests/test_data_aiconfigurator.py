"""The aiconfigurator-core tables read as tidy frames: every measured GPU, latencies in µs, sane shapes."""

from __future__ import annotations

import pandas as pd
import pytest

pytest.importorskip("aiconfigurator_core")

from servesim.data import aiconfigurator as aic  # noqa: E402
from servesim.errors import ServesimError  # noqa: E402

ID_COLUMNS = ["gpu", "system", "backend", "backend_version", "kernel_source"]


@pytest.fixture(scope="module")
def gemm() -> pd.DataFrame:
    return aic.load_gemm()


@pytest.fixture(scope="module")
def context() -> pd.DataFrame:
    return aic.load_context_attention()


@pytest.fixture(scope="module")
def generation() -> pd.DataFrame:
    return aic.load_generation_attention()


def test_all_nine_gpus_are_measured_and_mapped_to_catalogue_names() -> None:
    assert set(aic.available_systems()) == set(aic.MEASURED_GPUS)
    assert set(aic.MEASURED_GPUS.values()) == {
        "A100-SXM-80GB", "H100-SXM", "H200", "B200", "B300", "GB200", "GB300", "L40S", "RTX-PRO-6000",
    }


def test_gemm_covers_every_gpu_with_bf16_and_fp8_where_the_gpu_has_fp8(gemm: pd.DataFrame) -> None:
    dtypes = gemm.groupby("gpu", observed=True)["dtype"].agg(set)
    assert set(dtypes.index) == set(aic.MEASURED_GPUS.values())
    assert dtypes["A100-SXM-80GB"] == {"bf16"}  # Ampere has no FP8 tensor cores
    for gpu, seen in dtypes.drop("A100-SXM-80GB").items():
        assert seen == {"bf16", "fp8"}, gpu
    assert set(gemm["backend"]) == {"vllm", "sglang"}


def test_gemm_latency_is_in_microseconds(gemm: pd.DataFrame) -> None:
    big = gemm[(gemm.gpu == "H100-SXM") & (gemm.dtype == "bf16") & (gemm.m == 8192) & (gemm.n == 8192)
               & (gemm.k == 8192)]
    assert len(big) >= 2  # one per backend
    assert big["latency_us"].between(1000, 2000).all()  # 1.1 PFLOP at ~700 TFLOP/s
    assert (gemm["latency_us"] > 0).all()


def test_fp8_rows_say_how_they_are_scaled(gemm: pd.DataFrame) -> None:
    h100_fp8 = gemm[(gemm.gpu == "H100-SXM") & (gemm.dtype == "fp8")]
    assert set(h100_fp8["scaling"]) == {"tensor", "block"}
    assert set(gemm.loc[gemm.dtype == "bf16", "scaling"]) == {"none"}


def test_frames_are_tidy_with_ids_first_and_source_paths(gemm: pd.DataFrame, context: pd.DataFrame) -> None:
    for frame in (gemm, context):
        assert list(frame.columns[:5]) == ID_COLUMNS
        assert list(frame.columns[-2:]) == ["latency_us", "source"]
        assert frame["source"].astype(str).str.startswith("systems/data/").all()
    # One version per (system, backend): the package's "current" collection.
    assert (gemm.groupby(["system", "backend"], observed=True)["backend_version"].nunique() == 1).all()


def test_attention_rows_have_sane_heads(context: pd.DataFrame, generation: pd.DataFrame) -> None:
    for frame in (context, generation):
        assert (frame["num_heads"] >= frame["num_kv_heads"]).all()
        assert (frame["num_heads"] % frame["num_kv_heads"] == 0).all()
        assert set(frame["head_dim"]) <= {64, 128, 192, 256, 512}
        assert (frame["latency_us"] > 0).all()
        assert set(frame["dtype"]) <= {"bf16", "fp8"} and set(frame["kv_dtype"]) <= {"bf16", "fp8"}
    assert (context["seq_len"] >= 1).all() and (generation["kv_len"] >= 2).all()


def test_decode_attention_grows_with_the_kv_cache(generation: pd.DataFrame) -> None:
    one_shape = generation[(generation.gpu == "H100-SXM") & (generation.backend == "vllm")
                           & (generation.batch == 64) & (generation.num_heads == 32) & (generation.num_kv_heads == 8)
                           & (generation.head_dim == 128) & (generation.kv_dtype == "bf16")
                           & (generation.window_size == 0)].set_index("kv_len")["latency_us"]
    assert one_shape[8192] > 10 * one_shape[256]


def test_partial_collections_are_dropped(context: pd.DataFrame) -> None:
    # b300_sxm's SGLang context-attention table is marked partial by its collection_meta.yaml.
    b300 = context[context.system == "b300_sxm"]
    assert set(b300["backend"]) == {"vllm"}


def test_moe_rows_describe_the_layer_and_routing() -> None:
    moe = aic.load_moe(systems=("h100_sxm",))
    assert set(moe["distribution"]) == {"balanced", "power_law_1.01", "power_law_1.2"}
    assert (moe["topk"] <= moe["num_experts"]).all()
    assert (moe["latency_us"] > 0).all()
    # intermediate is the model's full width: sharding it over moe_tp makes the layer faster.
    layer = moe[(moe.backend == "vllm") & (moe.dtype == "bf16") & (moe.hidden == 4096) & (moe.intermediate == 14336)
                & (moe.num_experts == 8) & (moe.num_tokens == 4096) & (moe.distribution == "balanced")
                & (moe.moe_ep == 1)].set_index("moe_tp")["latency_us"]
    assert layer[8] < layer[1] / 4


def test_silicon_sample_has_vllm_and_sglang_runs_of_dense_models_on_hopper() -> None:
    runs = aic.load_silicon_sample()
    hopper = runs[runs.system.isin(["h100_sxm", "h200_sxm"]) & runs.backend.isin(["vllm", "sglang"])]
    assert set(hopper["backend"]) == {"vllm", "sglang"}
    for model in ("Llama-3.1-8B", "Llama-3.1-70B", "Qwen3-32B"):
        assert hopper["model"].str.contains(model, regex=False).any(), model
    assert set(runs["mode"]) == {"aggregated", "disaggregated"}
    assert set(runs["gpu"]) <= set(aic.MEASURED_GPUS.values())
    assert (runs["ttft_ms"] > 0).all() and (runs["tpot_ms"] > 0).all()
    aggregated = runs[runs["mode"] == "aggregated"]
    assert aggregated["tp"].notna().all() and aggregated["pp"].notna().all()


def test_bad_selections_fail_with_a_fix() -> None:
    with pytest.raises(ServesimError, match="h100_sxm"):
        aic.load_gemm(systems=("h100",))
    with pytest.raises(ServesimError, match="unknown backend"):
        aic.load_gemm(backends=("tensorrt",))
    with pytest.raises(ServesimError, match="unknown dtype"):
        aic.load_gemm(dtypes=("int3",))


def test_fp8_conversion_rows_are_in_microseconds_and_no_faster_than_dram_beyond_l2() -> None:
    """vLLM's FP8 conversion reads BF16 and writes FP8: when its input and output overfill L2 four times, no GPU can
    run it faster than its DRAM moves those bytes (a unit slip of 1000 would put it far either side)."""
    from servesim.hardware import get_gpu

    rows = aic.load_fp8_convert()
    assert set(rows["gpu"]) == {"H100-SXM", "H200", "B200", "B300", "GB200", "GB300", "L40S", "RTX-PRO-6000"}
    assert (rows["kernel_source"] == "static_scaled_fp8_quant").all()
    for gpu_name, part in rows.groupby("gpu", observed=True):
        gpu = get_gpu(str(gpu_name))
        bytes_moved = 3.0 * part["m"] * part["k"]
        big = bytes_moved > 4 * gpu.l2_cache_bytes
        dram_us = bytes_moved[big] / (gpu.dram_bandwidth_gbps * 1e3)
        ratio = part["latency_us"][big] / dram_us
        assert big.sum() > 10 and ratio.min() >= 1.0 and ratio.median() < 2.0, (gpu_name, ratio.describe())
