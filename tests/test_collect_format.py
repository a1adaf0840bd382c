"""The collection format as the estimator reads it: columns and dtypes of the aiconfigurator loaders,
``load_collection`` and its refusals, the catalogue name of a CUDA device, and the launch-grid check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from servesim.collect import CATEGORIES, load_collection
from servesim.collect.launches import LAUNCH_COLUMNS, check_grids, grid_agreement, kernel_launches
from servesim.collect.run import Device, gpu_for_device_name, open_manifest
from servesim.collect.schema import MANIFEST_FILE, make_shape, shape_kernel
from servesim.collect.store import append_rows, measured_keys, source_name, write_manifest
from servesim.decompose import decompose
from servesim.errors import ServesimError
from servesim.hardware import get_gpu

H100 = Device("cuda", "NVIDIA H100 80GB HBM3", get_gpu("H100-SXM"), "device name", "9.0", "2.13.0", "12.8")


def _row(device: Device, directory: Path, shape, kernel_source: str, latency_us: float) -> dict:
    return {"gpu": device.label, "system": "local", "backend": "torch", "backend_version": device.torch_version,
            "kernel_source": kernel_source, **shape.as_dict(), "latency_us": latency_us,
            "source": source_name(directory), "latency_p10_us": latency_us * 0.9,
            "latency_p90_us": latency_us * 1.1, "repetitions": 50}


def _collection(directory: Path, device: Device = H100) -> Path:
    """A small hand-made collection written through the collector's own writers."""
    directory.mkdir(parents=True, exist_ok=True)
    write_manifest(directory, open_manifest(directory, device, record_launches=True))
    gemm = CATEGORIES["gemm"]
    rows = [_row(device, directory, make_shape("gemm", m=16, n=4096, k=4096), "torch_matmul_cublas", 12.5),
            _row(device, directory, make_shape("scaled_mm", m=16, n=4096, k=4096), "torch_scaled_mm", 8.25)]
    append_rows(directory / gemm.file, gemm.file_columns, rows)
    context = CATEGORIES["context_attention"]
    shape = make_shape("context_attention", batch=1, seq_len=1024, prefix_len=0, num_heads=32, num_kv_heads=8,
                       head_dim=128, window_size=0)
    append_rows(directory / context.file, context.file_columns, [_row(device, directory, shape, "sdpa_flash", 40.0)])
    return directory


def test_gemm_rows_split_into_the_estimators_gemm_and_scaled_mm_categories(tmp_path: Path) -> None:
    directory = _collection(tmp_path / "h100")
    gemm, scaled = load_collection(directory, "gemm"), load_collection(directory, "scaled_mm")
    assert gemm[["m", "n", "k", "dtype", "scaling", "latency_us"]].values.tolist() == [
        [16, 4096, 4096, "bf16", "none", 12.5]]
    assert scaled[["dtype", "scaling", "kernel_source", "latency_us"]].values.tolist() == [
        ["fp8", "tensor", "torch_scaled_mm", 8.25]]
    assert list(gemm.columns) == list(CATEGORIES["gemm"].columns)
    assert gemm["gpu"].iloc[0] == "H100-SXM" and gemm["source"].iloc[0] == f"servesim collect h100/{MANIFEST_FILE}"


def test_a_category_the_run_did_not_measure_is_an_empty_frame(tmp_path: Path) -> None:
    frame = load_collection(_collection(tmp_path / "h100"), "rope")
    assert frame.empty and list(frame.columns) == list(CATEGORIES["rope"].columns)
    assert frame["num_tokens"].dtype == np.int64 and frame["latency_us"].dtype == np.float64


def test_columns_and_dtypes_match_the_aiconfigurator_loaders(tmp_path: Path) -> None:
    aic = pytest.importorskip("servesim.data.aiconfigurator")
    pytest.importorskip("aiconfigurator_core")
    directory = _collection(tmp_path / "h100")
    small = dict(systems=["a100_sxm"], backends=["vllm"])
    theirs = {"gemm": aic.load_gemm(dtypes=("bf16",), **small),
              "context_attention": aic.load_context_attention(**small),
              "generation_attention": aic.load_generation_attention(**small)}
    for category, reference in theirs.items():
        ours = load_collection(directory, category)
        assert list(ours.columns) == list(reference.columns), category
        assert ours.dtypes.astype(str).tolist() == reference.dtypes.astype(str).tolist(), category


def test_cpu_collections_are_refused_as_training_data(tmp_path: Path) -> None:
    cpu = Device("cpu", "x86_64", None, "", None, "2.13.0+cpu", None)
    directory = _collection(tmp_path / "cpu", cpu)
    with pytest.raises(ServesimError, match="CPU timings") as caught:
        load_collection(directory, "gemm")
    assert "\n" not in str(caught.value)
    frame = load_collection(directory, "gemm", allow_cpu=True)
    assert list(frame["gpu"]) == ["cpu"]
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    assert manifest["gpu"] is None and manifest["device"] == "cpu" and "not GPU measurements" in manifest["label"]


def _breakers():
    def missing_column(d: Path) -> None:
        frame = pd.read_csv(d / "gemm.csv").drop(columns=["k"])
        frame.to_csv(d / "gemm.csv", index=False)

    def bad_integer(d: Path) -> None:
        text = (d / "gemm.csv").read_text().replace(",16,4096,4096,bf16", ",16.5,4096,4096,bf16")
        (d / "gemm.csv").write_text(text)

    def bad_latency(d: Path) -> None:
        (d / "gemm.csv").write_text((d / "gemm.csv").read_text().replace(",12.5,", ",-1,"))

    def other_gpu(d: Path) -> None:
        (d / "gemm.csv").write_text((d / "gemm.csv").read_text().replace("H100-SXM", "H200", 1))

    def broken_manifest(d: Path) -> None:
        (d / MANIFEST_FILE).write_text("{not json")

    def no_manifest(d: Path) -> None:
        (d / MANIFEST_FILE).unlink()

    return [(missing_column, "lacks the columns k"), (bad_integer, "m '16.5' is not a non-negative integer"),
            (bad_latency, "latency_us '-1' is not a positive number"), (other_gpu, "manifest says 'H100-SXM'"),
            (broken_manifest, "not a readable JSON manifest"), (no_manifest, "has no manifest.json")]


@pytest.mark.parametrize("breaker,message", _breakers())
def test_malformed_collections_are_one_line_errors(tmp_path: Path, breaker, message: str) -> None:
    directory = _collection(tmp_path / "h100")
    breaker(directory)
    with pytest.raises(ServesimError) as caught:
        load_collection(directory, "gemm")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_missing_directory_and_unknown_category_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ServesimError, match="does not exist"):
        load_collection(tmp_path / "nowhere", "gemm")
    with pytest.raises(ServesimError, match="Did you mean silu_mul"):
        load_collection(_collection(tmp_path / "h100"), "silu")


def test_resume_keys_are_the_measured_shapes_and_sources(tmp_path: Path) -> None:
    directory = _collection(tmp_path / "h100")
    assert measured_keys(directory, CATEGORIES["gemm"]) == {
        ("torch_matmul_cublas", make_shape("gemm", m=16, n=4096, k=4096))}
    assert measured_keys(directory, CATEGORIES["scaled_mm"]) == {
        ("torch_scaled_mm", make_shape("scaled_mm", m=16, n=4096, k=4096))}
    assert measured_keys(directory, CATEGORIES["rope"]) == set()


def test_a_run_never_adds_rows_to_another_devices_collection(tmp_path: Path) -> None:
    directory = _collection(tmp_path / "h100")
    h200 = Device("cuda", "NVIDIA H200", get_gpu("H200"), "device name", "9.0", "2.13.0", "12.8")
    with pytest.raises(ServesimError, match="different device_name, gpu"):
        open_manifest(directory, h200, record_launches=True)


@pytest.mark.parametrize("cuda_name,catalogue", [
    # The device names aiconfigurator-core's measured tables record, and the GPUs servesim maps them to.
    ("NVIDIA A100-SXM4-80GB", "A100-SXM-80GB"), ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H200", "H200"),
    ("NVIDIA B200", "B200"), ("NVIDIA B300 SXM6 AC", "B300"), ("NVIDIA GB200", "GB200"), ("NVIDIA GB300", "GB300"),
    ("NVIDIA L40S", "L40S"), ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000"),
    ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA GeForce RTX 4090", "RTX-4090"),
])
def test_cuda_device_names_map_to_catalogue_gpus(cuda_name: str, catalogue: str) -> None:
    assert gpu_for_device_name(cuda_name).name == catalogue


def test_an_unknown_cuda_device_asks_for_gpu() -> None:
    with pytest.raises(ServesimError, match="pass --gpu") as caught:
        gpu_for_device_name("NVIDIA H100 NVL")
    assert "\n" not in str(caught.value)


def _launch(gpu: str, category: str, source: str, shape, name: str, grid: tuple, block: tuple, us: float) -> dict:
    return {"gpu": gpu, "category": category, "kernel_source": source, "shape": shape.describe(), "kernel_name": name,
            "grid_x": grid[0], "grid_y": grid[1], "grid_z": grid[2], "block_x": block[0], "block_y": block[1],
            "block_z": block[2], "registers_per_thread": 168, "shared_memory_bytes": 0, "duration_us": us}


def test_check_grids_compares_each_shapes_longest_kernel_with_the_decomposer(tmp_path: Path) -> None:
    directory = _collection(tmp_path / "h100")
    gpu = get_gpu("H100-SXM")
    small = make_shape("gemm", m=16, n=4096, k=4096)
    big = make_shape("gemm", m=4096, n=4096, k=4096)
    rms = make_shape("rmsnorm", num_tokens=64, hidden=4096)
    add = make_shape("residual_add", num_tokens=64, hidden=4096)
    predicted = {s: decompose(shape_kernel(s), gpu)[0].grid_ctas for s in (small, big, rms)}
    rows = [
        _launch("H100-SXM", "gemm", "torch_matmul_cublas", small, "gemm_main", (predicted[small], 1, 1), (384, 1, 1),
                9.0),
        _launch("H100-SXM", "gemm", "torch_matmul_cublas", small, "splitk_reduce", (4, 1, 1), (128, 1, 1), 1.0),
        _launch("H100-SXM", "gemm", "torch_matmul_cublas", big, "gemm_main", (66, 2, 1), (384, 1, 1), 200.0),
        _launch("H100-SXM", "rmsnorm", "torch_rmsnorm_inductor", rms, "triton_red", (64, 1, 1), (256, 1, 1), 3.0),
        _launch("H100-SXM", "residual_add", "torch_add", add, "add_kernel", (128, 1, 1), (128, 1, 1), 2.0),
    ]
    append_rows(directory / "launches.csv", LAUNCH_COLUMNS, rows)
    checked = check_grids(directory).set_index(["category", "shape"])
    first = checked.loc[("gemm", small.describe())]
    assert (first["kernel_name"], first["kernels"], bool(first["agree"])) == ("gemm_main", 2, True)
    assert checked.loc[("gemm", big.describe()), "ratio"] == pytest.approx(132 / predicted[big])
    assert bool(checked.loc[("rmsnorm", rms.describe()), "agree"])  # vLLM's grid(num_tokens)
    assert np.isnan(checked.loc[("residual_add", add.describe()), "predicted_ctas"])
    summary = grid_agreement(check_grids(directory)).set_index("category")
    assert summary.loc["gemm", "shapes"] == 2 and summary.loc["gemm", "exact"] == 1 + (predicted[big] == 132)
    assert "residual_add" not in summary.index


def test_check_grids_needs_recorded_launches(tmp_path: Path) -> None:
    with pytest.raises(ServesimError, match="launches.csv does not exist"):
        check_grids(_collection(tmp_path / "h100"))


def test_kernel_launches_keep_the_profilers_cuda_kernels_with_their_grids() -> None:
    profiler_util = pytest.importorskip("torch.autograd.profiler_util")
    from torch.autograd import DeviceType

    def event(name: str, device, meta: dict | None, start: float, end: float):
        return profiler_util.FunctionEvent(id=1, name=name, thread=0, start_us=start, end_us=end,
                                           device_type=device, extra_meta=meta)

    events = [
        event("aten::mm", DeviceType.CPU, None, 0.0, 20.0),
        event("Memset (Device)", DeviceType.CUDA, {"bytes": "4096"}, 1.0, 2.0),
        event("sm90_xmma_gemm_bf16", DeviceType.CUDA,
              {"grid": "[132, 1, 1]", "block": "[384, 1, 1]", "registers per thread": "168",
               "shared memory": "213000"}, 5.0, 17.5),
    ]
    [launch] = kernel_launches(events)
    assert (launch.kernel_name, launch.grid_x, launch.block_x) == ("sm90_xmma_gemm_bf16", 132, 384)
    assert (launch.registers_per_thread, launch.shared_memory_bytes, launch.duration_us) == (168, 213000, 12.5)


def test_importing_the_cli_and_the_reader_imports_no_torch() -> None:
    code = ("import sys, servesim.cli, servesim.collect, servesim.collect.run, "
            "servesim.collect.launches; print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
