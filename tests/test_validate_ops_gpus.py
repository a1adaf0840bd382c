"""`servesim validate ops` reads any Vidur-format GPU folder whose name is a catalogue GPU, not a fixed list."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.errors import ServesimError
from servesim.validate.ops import load_ops, vidur_gpu

VIDUR_ROOT = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "vidur"
MODEL = Path("meta-llama") / "Llama-2-7b-hf"


def _copy_as(tmp_path: Path, folders: dict[str, str]) -> Path:
    """A Vidur-layout folder holding Vidur's Llama-2-7B profile of each GPU under another folder name."""
    source = VIDUR_ROOT / "compute"
    if not (source / "h100" / MODEL / "mlp.csv").is_file():
        pytest.skip(f"Vidur data not present at {VIDUR_ROOT}")
    for vidur_folder, new_folder in folders.items():
        target = tmp_path / "compute" / new_folder / MODEL
        target.mkdir(parents=True)
        shutil.copy(source / vidur_folder / MODEL / "mlp.csv", target / "mlp.csv")
    return tmp_path


def test_folder_names_map_through_the_catalogue():
    assert vidur_gpu("a100") == "A100-SXM-80GB" and vidur_gpu("h100") == "H100-SXM"
    assert vidur_gpu("a40") == "A40" and vidur_gpu("l40s") == "L40S" and vidur_gpu("h200_sxm") == "H200"
    with pytest.raises(ServesimError, match="'tpu-v5'"):
        vidur_gpu("tpu-v5")


def test_a_renamed_gpu_folder_is_scored_as_that_gpu(tmp_path):
    root = _copy_as(tmp_path, {"h100": "h800", "a100": "a40"})
    frame = load_ops(root)
    assert set(frame["gpu"]) == {"H800", "A40"}
    result = CliRunner().invoke(main, ["validate", "ops", "--vidur-root", str(root), "--estimator", "roofline",
                                       "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert {row["gpu"] for row in rows} == {"H800", "A40"}
    assert all(row["roofline_mape_pct"] >= 0 for row in rows if not row["note"])
    one = CliRunner().invoke(main, ["validate", "ops", "--vidur-root", str(root), "--estimator", "roofline",
                                    "--gpu", "H800-SXM"])
    assert one.exit_code == 0 and "H800" in one.output and "A40" not in one.output


def test_a_gpu_the_data_lacks_is_refused_with_what_it_has(tmp_path):
    root = _copy_as(tmp_path, {"h100": "h800"})
    result = CliRunner().invoke(main, ["validate", "ops", "--vidur-root", str(root), "--gpu", "H100"])
    assert result.exit_code != 0 and "it measured H800" in result.output


def test_a_folder_that_is_no_catalogue_gpu_is_an_error(tmp_path):
    root = _copy_as(tmp_path, {"h100": "mystery-gpu"})
    result = CliRunner().invoke(main, ["validate", "ops", "--vidur-root", str(root)])
    assert result.exit_code != 0 and "'mystery-gpu' names no catalogue GPU" in result.output
