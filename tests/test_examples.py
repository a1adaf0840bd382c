"""Every script in examples/ runs and prints what its docstring promises (the roofline estimator and few requests,
so that each takes seconds)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(script: str, *args: str, cwd: Path | None = None) -> str:
    result = subprocess.run([sys.executable, str((cwd or EXAMPLES) / script), *args], capture_output=True, text=True,
                            cwd=cwd, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_chat_service_recommends_and_prints_the_launch_command() -> None:
    out = _run("chat_service.py", "--estimator", "roofline", "-n", "100", "--jobs", "2")
    assert "Recommendation: " in out and "cheapest option to serve 20 req/s" in out
    assert "Launch: vllm serve Qwen/Qwen3-8B" in out
    assert all(gpu in out for gpu in ("H100-SXM TP1", "A100-SXM-80GB TP1", "L40S TP1"))


def test_plan_from_trace_prints_the_plan_json(tmp_path: Path) -> None:
    import json

    out_file = tmp_path / "plan.json"
    out = _run("plan_from_trace.py", "--estimator", "roofline", "--jobs", "2", "--out", str(out_file))
    assert "trace support_trace: 200 requests" in out
    assert "launch_command: vllm serve meta-llama/Meta-Llama-3-8B" in out
    payload = json.loads(out_file.read_text())
    assert payload["workload"]["arrival"] == "trace" and payload["target"]["qps"] == 8
    assert payload["recommendation"]["launch_command"] in out
    assert [s["name"] for s in payload["slos"]] == ["ttft_p90", "tpot_p99"]


def test_prefix_caching_compares_cache_on_and_off() -> None:
    out = _run("prefix_caching.py", "--estimator", "roofline", "-n", "200")
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("on ", "off "))}
    assert set(rows) == {"on", "off"}
    assert "launch: vllm serve Qwen/Qwen3-8B" in out
    assert float(rows["on"][-1].rstrip("%")) > 0 and rows["off"][-1] == "0.0%"
    ttft_p90 = {name: float(row[2].removesuffix("ms")) for name, row in rows.items()}
    assert ttft_p90["on"] < ttft_p90["off"]  # cached system prompts and turns skip prefill


def test_trace_is_small_and_regenerates_identically(tmp_path: Path) -> None:
    shutil.copy(EXAMPLES / "make_trace.py", tmp_path)
    _run("make_trace.py", cwd=tmp_path)
    committed = (EXAMPLES / "support_trace.csv").read_bytes()
    assert (tmp_path / "support_trace.csv").read_bytes() == committed
    assert len(committed) < 20_000 and committed.count(b"\n") == 201
