"""Vidur's per-op CSVs read as a tidy frame of element-wise and GEMM operator times in µs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from servesim.data.vidur import load_vidur_ops
from servesim.errors import ServesimError

VIDUR_ROOT = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "vidur"


@pytest.fixture(scope="module")
def ops() -> pd.DataFrame:
    if not (VIDUR_ROOT / "compute").is_dir():
        pytest.skip(f"Vidur data not present at {VIDUR_ROOT}")
    return load_vidur_ops(VIDUR_ROOT)


def test_rmsnorm_is_measured_on_a100_and_h100_in_microseconds(ops: pd.DataFrame) -> None:
    rmsnorm = ops[ops.op == "rmsnorm"]
    assert set(rmsnorm["gpu"]) == {"A100-SXM-80GB", "H100-SXM"}
    # 4096 tokens x 4096 hidden in bf16 is 32 MiB in and out: tens of µs on HBM, not ms and not ns.
    big = rmsnorm[(rmsnorm.model == "meta-llama/Llama-2-7b-hf") & (rmsnorm.num_tokens == 4096) & (rmsnorm.tp == 1)]
    assert big["latency_us"].between(20, 500).all()
    assert (ops["latency_us"] > 0).all()


def test_every_element_wise_category_is_present(ops: pd.DataFrame) -> None:
    assert {"rmsnorm", "silu_mul", "rope", "add"} <= set(ops["op"])
    assert {"qkv_proj", "o_proj", "mlp_up_proj", "mlp_down_proj"} <= set(ops["op"])


def test_non_gated_layernorm_model_gets_its_own_kernel_names(ops: pd.DataFrame) -> None:
    phi = ops[ops.model == "microsoft/phi-2"]
    assert {"layernorm", "gelu"} <= set(phi["op"])
    assert not {"rmsnorm", "silu_mul"} & set(phi["op"])


def test_gemms_scale_with_the_tensor_parallel_shard(ops: pd.DataFrame) -> None:
    up = ops[(ops.gpu == "H100-SXM") & (ops.model == "meta-llama/Llama-2-70b-hf") & (ops.op == "mlp_up_proj")
             & (ops.num_tokens == 4096)].groupby("tp")["latency_us"].median()
    assert up[8] < up[1] / 4


def test_missing_folder_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-vidur-here"
    with pytest.raises(ServesimError, match="no-vidur-here"):
        load_vidur_ops(missing)
