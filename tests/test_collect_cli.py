"""``servesim collect`` run on the CPU: the timing harness, every CPU implementation, the files it writes,
resuming, the time budget, and one-line errors. CPU timings only; no GPU is needed or claimed."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")

from servesim.cli.collect import collect_group  # noqa: E402
from servesim.collect import CATEGORIES, load_collection  # noqa: E402
from servesim.collect.ops import rms_norm_native, rope_neox, silu_and_mul  # noqa: E402
from servesim.collect.timing import TimingSettings, make_flush, time_on_cpu  # noqa: E402
from servesim.errors import ServesimError  # noqa: E402

torch.set_num_threads(1)
FAST = ["--device", "cpu", "--warmup", "1", "--repetitions", "5", "--flush-mib", "1"]


def _invoke(*args: str):
    return CliRunner().invoke(collect_group, list(args))


def test_the_cpu_timing_harness_gives_positive_medians_that_grow_with_work() -> None:
    settings = TimingSettings(warmup=1, repetitions=7, flush_bytes=2**20)
    flush = make_flush("cpu", settings.flush_bytes)
    small, large = (torch.randn(n, n) for n in (16, 256))
    fast = time_on_cpu(lambda: small @ small, settings, flush)
    slow = time_on_cpu(lambda: large @ large, settings, flush)
    assert 0 < fast.p10_us <= fast.median_us <= fast.p90_us and fast.repetitions == 7
    assert slow.median_us > 5 * fast.median_us  # 4096x the FLOPs


def test_timing_settings_reject_nonsense() -> None:
    with pytest.raises(ServesimError, match="--repetitions >= 1"):
        TimingSettings(repetitions=0)
    with pytest.raises(ServesimError, match="events or graph"):
        TimingSettings(method="cupti")


def test_the_operations_compute_what_they_are_named_after() -> None:
    x, w = torch.randn(4, 64), torch.randn(64)
    assert torch.allclose(rms_norm_native(x, w), torch.nn.functional.rms_norm(x, (64,), w, 1e-6), atol=1e-5)
    gate_up = torch.randn(3, 10)
    assert torch.allclose(silu_and_mul(gate_up), torch.nn.functional.silu(gate_up[:, :5]) * gate_up[:, 5:])
    q, k = torch.randn(5, 2 * 8), torch.randn(5, 8)
    cache = torch.cat((torch.ones(10, 4), torch.zeros(10, 4)), dim=-1)  # angle 0 at every position: identity
    positions = torch.arange(5)
    rq, rk = rope_neox(positions, q, k, cache)
    assert torch.equal(rq, q) and torch.equal(rk, k)
    angles = torch.rand(10, 4)
    rq, _ = rope_neox(positions, q, k, torch.cat((angles.cos(), angles.sin()), dim=-1))
    pairs = lambda t: t.unflatten(-1, (-1, 2, 4)).pow(2).sum(-2)  # noqa: E731 - a rotation keeps each pair's norm
    assert torch.allclose(pairs(rq), pairs(q), atol=1e-5) and not torch.allclose(rq, q)


def test_cli_end_to_end_on_cpu_labels_rows_cpu_and_writes_the_contract(tmp_path: Path) -> None:
    out = tmp_path / "cpu-run"
    result = _invoke("--device", "cpu", "--category", "gemm", "--m", "16", "--n", "64", "--k", "64",
                     "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "1 measurements on cpu" in result.output and "not GPU measurements" in result.output
    frame = pd.read_csv(out / "gemm.csv")
    assert list(frame.columns) == list(CATEGORIES["gemm"].file_columns)
    row = frame.iloc[0]
    assert (row["gpu"], row["kernel_source"], row["m"], row["n"], row["k"]) == ("cpu", "torch_matmul_cpu", 16, 64, 64)
    assert row["latency_p10_us"] <= row["latency_us"] <= row["latency_p90_us"] and row["repetitions"] == 50
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["device"], manifest["gpu"], manifest["backend"]) == ("cpu", None, "torch")
    assert manifest["torch_version"] == torch.__version__ and manifest["servesim_version"]
    [run] = manifest["runs"]
    assert run["status"] == "complete" and run["timing"]["method"] == "perf_counter_ns"
    assert run["sweep"] == [{"kind": "grid", "category": "gemm", "axes": {"m": [16], "n": [64], "k": [64]}}]
    assert not (out / "launches.csv").exists() and "not recorded" in manifest["launches"]
    with pytest.raises(ServesimError, match="CPU timings"):
        load_collection(out, "gemm")


SWEEP = """
[[sweep]]
category = "scaled_mm"
m = [16]
n = [64]
k = [64]

[[sweep]]
category = "context_attention"
batch = [2]
seq_len = [32]
prefix_len = [0, 16]
heads = ["8/2"]
head_dim = [64]

[[sweep]]
category = "generation_attention"
batch = [2]
kv_len = [64]
heads = ["8/2"]
head_dim = [64]

[[sweep]]
category = "rmsnorm"
tokens = [4]
hidden = [256]

[[sweep]]
category = "silu_mul"
tokens = [4]
hidden = [256]

[[sweep]]
category = "rope"
tokens = [4]
heads = ["8/2"]
head_dim = [64]

[[sweep]]
category = "residual_add"
tokens = [4]
hidden = [256]
"""


def test_every_category_runs_on_cpu_and_each_file_has_its_schema(tmp_path: Path) -> None:
    sweep, out = tmp_path / "sweep.toml", tmp_path / "all"
    sweep.write_text(SWEEP)
    result = _invoke(*FAST, "--sweep", str(sweep), "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output[result.output.index("{"):])
    measured = {r["category"]: r["measured"] for r in payload["counts"]}
    assert measured == {c: 1 for c in CATEGORIES if c != "gemm"}
    # The only skip: SDPA cannot attend to a cached prefix, and the manifest says so.
    assert [(s["category"], s["shapes"]) for s in payload["skipped"]] == [("context_attention", 1)]
    assert "cached prefix" in json.loads((out / "manifest.json").read_text())["runs"][0]["skipped"][0]["reason"]
    for category, schema in CATEGORIES.items():
        assert list(pd.read_csv(out / schema.file).columns) == list(schema.file_columns)
        frame = load_collection(out, category, allow_cpu=True)
        assert list(frame.columns) == list(schema.columns) and (frame["latency_us"] > 0).all()
        assert len(frame) == (0 if category == "gemm" else 1)  # gemm.csv holds the scaled_mm row only
        assert set(frame["gpu"]) <= {"cpu"} and all(s.endswith("_cpu") for s in frame["kernel_source"])


def test_a_second_run_resumes_and_skips_measured_shapes(tmp_path: Path) -> None:
    out = tmp_path / "resume"
    args = [*FAST, "--category", "residual_add", "--hidden", "64", "--out", str(out)]
    assert _invoke(*args, "--tokens", "1,2").exit_code == 0
    result = _invoke(*args, "--tokens", "1,2,3", "--json")
    payload = json.loads(result.output[result.output.index("{"):])
    assert [(r["measured"], r["already"]) for r in payload["counts"]] == [(1, 2)]
    assert sorted(pd.read_csv(out / "residual_add.csv")["num_tokens"]) == [1, 2, 3]
    assert len(json.loads((out / "manifest.json").read_text())["runs"]) == 2


def test_the_time_budget_stops_the_run_and_leaves_the_rest_for_later(tmp_path: Path) -> None:
    out = tmp_path / "budget"
    result = _invoke(*FAST, "--category", "residual_add", "--tokens", "1,2", "--hidden", "64",
                     "--time-budget-s", "1e-9", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "2 measurements left" in result.output
    assert json.loads((out / "manifest.json").read_text())["runs"][0]["status"] == "stopped: time budget"


@pytest.mark.parametrize("args,message", [
    (["--device", "cpu", "--gpu", "H100"], "a --device cpu run has none"),
    (["--gpu", "H1000"], "--gpu: unknown GPU 'H1000'. Did you mean H100"),
    (["--m", "16,x"], "sweep axis m takes integers; got 'x'"),
    (["--m", "16", "--hidden", "64"], "gemm has no axis hidden"),
    (["--device", "cpu", "--impl", "flashinfer"], "--impl flashinfer measures none of the selected categories"),
])
def test_bad_input_is_a_one_line_error(tmp_path: Path, args: list[str], message: str) -> None:
    result = _invoke("--category", "gemm", "--m", "16", "--n", "64", "--k", "64", "--out", str(tmp_path / "x"), *args)
    assert isinstance(result.exception, ServesimError), result.output
    assert message in str(result.exception) and "\n" not in str(result.exception)


def test_without_a_gpu_the_cuda_default_says_to_use_the_cpu(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    result = _invoke("--category", "gemm", "--m", "16", "--n", "64", "--k", "64", "--out", str(tmp_path / "x"))
    assert isinstance(result.exception, ServesimError) and "--device cpu" in str(result.exception)
    assert not (tmp_path / "x").exists()


def test_dry_run_lists_the_default_sweep_without_measuring(tmp_path: Path) -> None:
    result = _invoke("--dry-run", "--model", "llama3-8b", "--tp", "1", "--tokens", "16", "--json")
    assert result.exit_code == 0, result.output
    shapes = json.loads(result.output)["shapes"]
    assert {"category": "gemm", "m": 16, "n": 6144, "k": 4096, "dtype": "bf16", "scaling": "none"} in shapes


@pytest.mark.parametrize("bad,message", [
    (("--warmup", "-1"), "--warmup >= 0"),
    (("--gpu", "H999"), "--gpu: unknown GPU 'H999'"),
    (("--time-budget-s", "0"), "--time-budget-s must be positive"),
])
def test_dry_run_checks_the_options_a_real_run_would_refuse(bad: tuple[str, str], message: str) -> None:
    result = _invoke("--dry-run", "--category", "gemm", "--m", "1", "--n", "8", "--k", "8", *bad)
    assert isinstance(result.exception, ServesimError) and message in str(result.exception)
