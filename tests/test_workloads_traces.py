"""Trace loaders (Vidur, Azure, servesim, any CSV/JSONL with a column mapping) and trace replay."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servesim.errors import ServesimError
from servesim.workloads import arrival_stats, build_workload, load_trace, parse_columns

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "vidur" / "traces"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n4.3,396,109\n4.5,879,55\n6.0,91,16\n"


def test_vidur_csv_loads_in_order(tmp_path):
    trace = load_trace(write(tmp_path, "conv.csv", VIDUR))
    assert trace.name == "conv"
    assert trace.prompt_tokens.tolist() == [374, 396, 879, 91]
    assert trace.output_tokens.tolist() == [44, 109, 55, 16]
    assert trace.arrival_s.tolist() == [0.0, 4.3, 4.5, 6.0]


def test_azure_trace_timestamps_become_seconds(tmp_path):
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,4808,10\n"
        "2023-11-16 18:15:46.7325900,3180,0\n"
        "2023-11-16 18:15:48.1805900,110,27\n"
    )
    trace = load_trace(write(tmp_path, "azure.csv", text))
    assert trace.arrival_s == pytest.approx([0.0, 0.052, 1.5])
    assert trace.output_tokens.tolist() == [10, 1, 27]  # 0 generated tokens: the prefill still emits one


def test_any_jsonl_loads_with_a_column_mapping(tmp_path):
    text = '{"t": 1.5, "in": 100, "out": 7}\n\n{"t": 0.5, "in": 50, "out": 3}\n'
    trace = load_trace(write(tmp_path, "log.jsonl", text), parse_columns("prompt=in, output=out, arrival=t"))
    assert trace.prompt_tokens.tolist() == [50, 100]  # sorted by arrival
    assert trace.arrival_s.tolist() == [0.5, 1.5]


def test_arrival_column_is_optional(tmp_path):
    trace = load_trace(write(tmp_path, "lens.csv", "num_prefill_tokens,num_decode_tokens\n10,2\n20,3\n"))
    assert trace.arrival_s is None and len(trace) == 2


@pytest.mark.parametrize(
    ("name", "text", "columns", "message"),
    [
        ("a.csv", VIDUR.replace("879", "lots"), None, r"line 4: num_prefill_tokens is 'lots'"),
        ("a.csv", VIDUR.replace("109", "-3"), None, r"line 3: num_decode_tokens is '-3'"),
        ("a.csv", VIDUR.replace("396", "39.5"), None, r"line 3: num_prefill_tokens is '39.5'"),
        ("a.csv", VIDUR.replace(",16\n", ",\n"), None, r"line 5: num_decode_tokens is missing"),
        ("a.csv", VIDUR.replace("4.5,", "soon,"), None, r"line 4: arrived_at is 'soon'"),
        ("a.csv", VIDUR.replace("4.3,396,109", "4.3,396,109,1"), None, r"malformed CSV"),
        ("a.csv", "a,b\n1,2\n", None, r"columns a, b, not a known trace format.*prompt="),
        ("a.csv", VIDUR, {"prompt": "input", "output": "num_decode_tokens"}, r"no column 'input'"),
        ("a.csv", "", None, "empty"),
        ("b.jsonl", '{"p": 1, "o": 2}\n{"p": 3, "o": \n', {"prompt": "p", "output": "o"}, r"line 2: not valid JSON"),
        ("b.jsonl", '{"p": 1, "o": 2}\n[3, 4]\n', {"prompt": "p", "output": "o"}, r"line 2: expected a JSON object"),
        ("b.jsonl", '{"p": 1, "o": 2}\n\n{"p": 0, "o": 4}\n', {"prompt": "p", "output": "o"}, r"line 3: p is 0"),
    ],
)
def test_malformed_traces_are_rejected_naming_the_row(tmp_path, name, text, columns, message):
    with pytest.raises(ServesimError, match=message):
        load_trace(write(tmp_path, name, text), columns)


@pytest.mark.parametrize("text", ["prompt=a", "prompt=a,output", "tokens=a,output=b"])
def test_bad_column_mappings_are_explained(tmp_path, text):
    with pytest.raises(ServesimError, match="prompt"):
        load_trace(write(tmp_path, "t.csv", "a,b\n1,2\n"), parse_columns(text))


def test_trace_replay_uses_its_own_times_scaled_or_rescaled(tmp_path):
    path = str(write(tmp_path, "conv.csv", VIDUR))
    replay = build_workload(path)
    assert replay.arrival_process == "trace" and replay.arrival_s.tolist() == [0.0, 4.3, 4.5, 6.0]
    assert build_workload(path, time_scale=0.5).arrival_s.tolist() == pytest.approx([0.0, 2.15, 2.25, 3.0])
    assert arrival_stats(build_workload(path, qps=2.0, arrival="trace").arrival_s)["rate_per_s"] == pytest.approx(2.0)
    assert build_workload(path, qps=2.0).arrival_process == "poisson"
    assert build_workload(path, 2).prompt_tokens.tolist() == [374, 396]
    with pytest.raises(ServesimError, match="has 4 requests"):
        build_workload(path, 5)


def test_a_trace_without_times_needs_a_rate(tmp_path):
    path = str(write(tmp_path, "lens.csv", "num_prefill_tokens,num_decode_tokens\n10,2\n20,3\n"))
    with pytest.raises(ServesimError, match="no arrival times"):
        build_workload(path)
    assert len(build_workload(path, qps=1.0)) == 2


def test_a_missing_trace_file_is_named():
    with pytest.raises(ServesimError, match="no trace file 'nowhere.csv'"):
        build_workload("nowhere.csv")


def test_the_shared_splitwise_trace_loads_with_its_published_rate():
    if not TRACES.is_dir():
        pytest.skip("the shared Vidur traces are absent")
    trace = load_trace(TRACES / "splitwise_conv.csv")
    assert len(trace) == 19_366
    assert arrival_stats(trace.arrival_s)["rate_per_s"] == pytest.approx(5.53, abs=0.01)
    assert np.mean(trace.prompt_tokens) == pytest.approx(1155, abs=1)


@pytest.mark.parametrize("cell", ["1e300", "3000000000", "[]"])
def test_token_counts_past_the_engines_limit_or_not_numbers_are_refused(tmp_path, cell):
    path = tmp_path / "t.jsonl"
    path.write_text(f'{{"prompt_tokens": {cell}, "output_tokens": 5}}\n')
    with pytest.raises(ServesimError, match="prompt_tokens .*expected a whole number of tokens from 1 to 2,147,483,647"):
        load_trace(path)
