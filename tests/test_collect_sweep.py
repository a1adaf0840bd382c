"""Which shapes ``servesim collect`` measures: grids, sweep files, the model sweep, dedupe and bounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim.collect.schema import CATEGORIES, make_shape, parse_shape, shape_kernel
from servesim.collect.sweep import (
    MAX_DECODE_KV_TOKENS,
    MAX_PREFILL_TOKENS,
    grid_sweep,
    kernel_shapes,
    model_sweep,
    plan_shapes,
    sweeps_from_file,
    sweeps_from_options,
)
from servesim.errors import ServesimError
from servesim.kernels.types import (
    AddRMSNorm,
    AttentionDecode,
    AttentionPrefill,
    Gemm,
    RMSNorm,
    Rope,
    ScaledMM,
    SiluMul,
)


def _gemm(m: int, n: int, k: int) -> tuple:
    return (m, n, k, "bf16", "none")


def test_a_grid_is_the_cartesian_product_deduped_and_sorted() -> None:
    sweep = grid_sweep("gemm", {"m": ["16", "1", "16"], "n": [64], "k": [64, 32]})
    shapes = plan_shapes([sweep])
    assert [s.values for s in shapes] == [_gemm(1, 64, 32), _gemm(1, 64, 64), _gemm(16, 64, 32), _gemm(16, 64, 64)]
    overlapping = grid_sweep("gemm", {"m": [1, 2], "n": [64], "k": [64]})
    assert len(plan_shapes([sweep, overlapping])) == 5  # (1, 64, 64) counted once


def test_attention_grids_fill_the_fixed_columns() -> None:
    [prefill] = plan_shapes([grid_sweep("context_attention",
                                        {"batch": [2], "seq_len": [512], "heads": ["32/8"], "head_dim": [128]})])
    assert prefill.as_dict() == {"batch": 2, "seq_len": 512, "prefix_len": 0, "num_heads": 32, "num_kv_heads": 8,
                                 "head_dim": 128, "window_size": 0, "dtype": "bf16", "kv_dtype": "bf16"}
    [rope] = plan_shapes([grid_sweep("rope", {"tokens": [7], "heads": ["8/1"], "head_dim": [64]})])
    assert rope.as_dict() == {"num_tokens": 7, "num_heads": 8, "num_kv_heads": 1, "head_dim": 64, "dtype": "bf16"}


def test_max_shapes_keeps_an_evenly_spaced_subset_spanning_the_sweep() -> None:
    sweep = grid_sweep("gemm", {"m": list(range(1, 101)), "n": [64], "k": [64]})
    shapes = plan_shapes([sweep], max_shapes=5)
    assert [s.values[0] for s in shapes] == [1, 26, 51, 75, 100]
    assert len(plan_shapes([sweep], max_shapes=500)) == 100
    with pytest.raises(ServesimError, match="--max-shapes"):
        plan_shapes([sweep], max_shapes=0)


@pytest.mark.parametrize("category,axes,message", [
    ("gemm", {"m": ["16", "x"], "n": [64], "k": [64]}, "takes integers; got 'x'"),
    ("gemm", {"m": [0], "n": [64], "k": [64]}, "1 or more; got 0"),
    ("gemm", {"m": [16], "n": [64]}, "needs k too"),
    ("gemm", {"m": [16], "n": [64], "k": [64], "heads": ["32/8"]}, "has no axis heads"),
    ("scaled_mm", {"m": [16], "n": [100], "k": [64]}, "divisible by 16"),
    ("context_attention", {"batch": [1], "seq_len": [8], "heads": ["3/2"], "head_dim": [64]},
     "multiple of the KV"),
    ("generation_attention", {"batch": [1], "kv_len": [8], "heads": ["32"], "head_dim": [64]}, "H/KV"),
    ("rmsnorm", {"tokens": [], "hidden": [64]}, "non-empty list"),
    ("gemms", {"m": [1]}, "Did you mean gemm"),
])
def test_bad_grid_input_is_a_one_line_error(category: str, axes: dict, message: str) -> None:
    with pytest.raises(ServesimError) as caught:
        grid_sweep(category, axes)
    assert message in str(caught.value) and "\n" not in str(caught.value)


SWEEP_TOML = """
[[sweep]]
category = "gemm"
m = [1, 16]
n = [64]
k = [64]

[[sweep]]
category = "generation_attention"
batch = [4]
kv_len = [1024]
heads = ["32/8"]
head_dim = [128]
"""


def test_toml_and_json_sweep_files_give_the_same_shapes(tmp_path: Path) -> None:
    toml_path, json_path = tmp_path / "sweep.toml", tmp_path / "sweep.json"
    toml_path.write_text(SWEEP_TOML)
    json_path.write_text(json.dumps({"sweep": [
        {"category": "gemm", "m": [1, 16], "n": [64], "k": [64]},
        {"category": "generation_attention", "batch": [4], "kv_len": [1024], "heads": ["32/8"], "head_dim": [128]},
    ]}))
    from_toml, from_json = plan_shapes(sweeps_from_file(toml_path)), plan_shapes(sweeps_from_file(json_path))
    assert from_toml == from_json and len(from_toml) == 3
    assert {s.category for s in from_toml} == {"gemm", "generation_attention"}


@pytest.mark.parametrize("text,message", [
    ("[[sweep]]\ncategory = 'gemm'\nm = [1]\nn = [64]\nkk = [64]\n",
     "entry 1: gemm has no axis kk; its axes are m, n, k. Did you mean k?"),
    ("[[sweep]]\nm = [1]\n", "needs 'category'"),
    ("sweep = 3\n", "non-empty list 'sweep'"),
    ("[[sweep\n", "not valid TOML"),
    ("[[sweep]]\nmodels = ['llama3-8x']\n", "Did you mean llama3-8b"),
])
def test_bad_sweep_files_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    with pytest.raises(ServesimError) as caught:
        sweeps_from_file(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_command_line_options_pick_grid_file_or_model_sweep(tmp_path: Path) -> None:
    [grid] = sweeps_from_options(("gemm",), {"m": "1,16", "n": "64", "k": "64"})
    assert len(grid.shapes()) == 2
    with pytest.raises(ServesimError, match="exactly one --category"):
        sweeps_from_options(("gemm", "rmsnorm"), {"m": "1", "n": "64", "k": "64"})
    with pytest.raises(ServesimError, match="--sweep takes every shape"):
        sweeps_from_options(("gemm",), {}, tmp_path / "sweep.toml")
    [models] = sweeps_from_options(("rmsnorm",), {"tokens": "1,16"}, models=("llama3-8b",), tps="1")
    assert models.describe()["tokens"] == [1, 16] and models.describe()["models"] == ["llama3-8b"]


@pytest.fixture(scope="module")
def llama_8b_shapes():
    return plan_shapes([model_sweep(list(CATEGORIES), ["llama3-8b"], [1, 2], [1, 16])])


def test_the_model_sweep_measures_the_gemms_the_engine_launches(llama_8b_shapes) -> None:
    gemms = {s.values for s in llama_8b_shapes if s.category == "gemm"}
    # Llama-3-8B at TP 2: fused QKV (16 + 2*4 heads x 128), O, fused gate/up (2 x 7168), down.
    for n, k in ((3072, 4096), (4096, 2048), (14336, 4096), (4096, 7168)):
        assert _gemm(16, n, k) in gemms
    scaled = {s.values[:3] for s in llama_8b_shapes if s.category == "scaled_mm"}
    assert (16, 3072, 4096) in scaled and all(n % 16 == 0 and k % 16 == 0 for _, n, k in scaled)
    assert {s.values[:2] for s in llama_8b_shapes if s.category == "residual_add"} >= {(1, 4096), (16, 4096)}


def test_the_model_sweep_grids_attention_over_each_head_layout(llama_8b_shapes) -> None:
    prefill = [s.as_dict() for s in llama_8b_shapes if s.category == "context_attention"]
    decode = [s.as_dict() for s in llama_8b_shapes if s.category == "generation_attention"]
    assert {(s["num_heads"], s["num_kv_heads"]) for s in prefill} == {(32, 8), (16, 4)}
    assert all(s["batch"] * s["seq_len"] <= MAX_PREFILL_TOKENS for s in prefill)
    assert all(s["batch"] * s["kv_len"] <= MAX_DECODE_KV_TOKENS for s in decode)
    assert len(llama_8b_shapes) == len(set(llama_8b_shapes))


@pytest.mark.parametrize("kernel", [
    Gemm(m=16, n=3072, k=4096),
    ScaledMM(m=16, n=3072, k=4096, library="cublaslt"),  # the collector times torch._scaled_mm
    RMSNorm(rows=64, dim=128),
    SiluMul(tokens=16, dim=7168),
    Rope(tokens=16, num_heads=16, num_kv_heads=4, head_dim=128),
])
def test_collected_columns_map_one_to_one_onto_kernel_fields(kernel) -> None:
    [shape] = kernel_shapes(kernel, set())
    assert shape_kernel(shape) == kernel
    assert parse_shape(shape.category, shape.describe()) == shape


def test_attention_rows_are_batches_of_equal_requests() -> None:
    prefill = make_shape("context_attention", batch=2, seq_len=128, prefix_len=64, num_heads=32, num_kv_heads=8,
                         head_dim=128, window_size=0)
    kernel = shape_kernel(prefill, "fa2")
    assert isinstance(kernel, AttentionPrefill)
    assert (kernel.query_lens, kernel.kv_lens, kernel.backend) == ((128, 128), (192, 192), "fa2")
    decode = shape_kernel(make_shape("generation_attention", batch=3, kv_len=1024, num_heads=32, num_kv_heads=8,
                                     head_dim=128, window_size=0), "flashinfer")
    assert isinstance(decode, AttentionDecode) and decode.kv_lens == (1024,) * 3
    heads: set = set()
    assert kernel_shapes(decode, heads) == [] and heads == {(32, 8, 128)}
    # The engines' fused add + RMSNorm stands for both halves; a residual add alone has no kernel type.
    both = kernel_shapes(AddRMSNorm(rows=16, dim=4096), set())
    assert {s.category for s in both} == {"rmsnorm", "residual_add"}
    assert shape_kernel(next(s for s in both if s.category == "residual_add")) is None
