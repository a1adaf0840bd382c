"""MAPE and bias summaries of predicted-vs-measured rows, by group and by concurrency, and the scatter plot."""

from __future__ import annotations

import pandas as pd
import pytest

from servesim.validate.report import against_bar, bias_by_concurrency, concurrency_bucket, grouped_errors, scatter_plot


def _frame() -> pd.DataFrame:
    measured = [10.0, 20.0, 40.0, 80.0]
    return pd.DataFrame({
        "gpu": ["H100-SXM"] * 4, "engine": ["vllm", "vllm", "sglang", "sglang"], "split": ["train"] * 4,
        "concurrency": [4, 16, 64, 256],
        "measured_ttft_ms": measured, "predicted_ttft_ms": [11.0, 18.0, 40.0, 100.0],
        "measured_tpot_ms": measured, "predicted_tpot_ms": [10.5, 20.0, 38.0, 80.0],
        "ttft_error": [0.1, -0.1, 0.0, 0.25], "tpot_error": [0.05, 0.0, -0.05, 0.0],
    })


def test_grouped_errors_are_mape_and_signed_bias_in_percent() -> None:
    (sglang, vllm) = grouped_errors(_frame(), ["engine"])
    assert vllm["engine"] == "vllm" and vllm["rows"] == 2
    assert vllm["ttft_mape_pct"] == pytest.approx(10.0) and vllm["ttft_bias_pct"] == pytest.approx(0.0)
    assert sglang["ttft_mape_pct"] == pytest.approx(12.5) and sglang["tpot_bias_pct"] == pytest.approx(-2.5)


def test_against_bar_needs_both_ttft_and_tpot_within_it() -> None:
    # vLLM: TTFT MAPE 10 %, TPOT 2.5 % -> within; SGLang: TTFT 12.5 %, TPOT 2.5 % -> within. Then SGLang with one
    # TTFT 55 % off (TTFT MAPE 27.5 %) fails the TTFT bar, and vLLM's TPOTs 11 % off fail the TPOT bar alone.
    verdicts = {row["engine"]: row["meets_bar"] for row in against_bar(_frame(), ["engine"])}
    assert verdicts == {"vllm": "yes", "sglang": "yes"}
    worse = _frame().assign(ttft_error=[0.1, -0.1, 0.0, 0.55], tpot_error=[0.11, 0.11, 0.0, 0.0])
    assert [row["meets_bar"] for row in against_bar(worse, ["engine"])] == ["no", "no"]


def test_concurrency_buckets_are_half_open_ranges() -> None:
    labels = concurrency_bucket(pd.Series([1, 8, 9, 32, 33, 128, 129, 512]))
    assert list(labels) == ["1-8", "1-8", "9-32", "9-32", "33-128", "33-128", ">128", ">128"]
    buckets = {row["concurrency_bucket"]: row for row in bias_by_concurrency(_frame())}
    assert buckets[">128"]["ttft_bias_pct"] == pytest.approx(25.0)


def test_scatter_plot_writes_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "scatter.png"
    scatter_plot(_frame().assign(split=["train", "train", "test", "test"]), path, "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
