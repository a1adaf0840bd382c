"""``servesim workload``: describe workloads as a table, JSON or CSV, and write their requests to CSV."""

from __future__ import annotations

import csv
import io
import json

from click.testing import CliRunner

from servesim.cli.workloads import COMMANDS, workload
from servesim.errors import ServesimError
from servesim.workloads import build_workload, load_trace


def run(*args: str):
    return CliRunner().invoke(workload, list(args))


def test_workload_is_exported_for_registration():
    assert [command.name for command in COMMANDS] == ["workload"]


def test_table_describes_each_workload_by_prompt_and_output():
    result = run("splitwise-conv", "splitwise-code", "--requests", "200")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:5] == ["workload", "requests", "arrival", "req/s", "gap"]
    body = [line.split() for line in lines[2:6]]
    assert [(row[0], row[1], row[2], row[5]) for row in body] == [
        ("splitwise-conv", "200", "trace", "prompt"),
        ("splitwise-conv", "200", "trace", "output"),
        ("splitwise-code", "200", "trace", "prompt"),
        ("splitwise-code", "200", "trace", "output"),
    ]


def test_json_gives_statistics_per_workload():
    result = run("lognormal:2048,0.5:128", "--qps", "4", "--requests", "3000", "--json")
    assert result.exit_code == 0, result.output
    (described,) = json.loads(result.output)
    assert described["requests"] == 3000 and described["arrival"] == "poisson"
    assert abs(described["rate_per_s"] / 4 - 1) < 0.1
    assert abs(described["prompt_tokens"]["mean"] / 2048 - 1) < 0.05
    assert described["output_tokens"]["p99"] == 128


def test_csv_has_one_line_per_workload_and_token_kind():
    result = run("fixed:1024:128", "--concurrency", "16", "--csv")
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert [(r["arrival"], r["tokens"], r["mean"]) for r in rows] == [
        ("closed x16", "prompt", "1024.0"),
        ("closed x16", "output", "128.0"),
    ]
    assert rows[0]["rate_per_s"] == ""  # a pure closed loop has no arrival rate


def test_out_writes_requests_that_load_back_as_the_same_workload(tmp_path):
    out = tmp_path / "requests.csv"
    result = run("splitwise-code", "--requests", "300", "--seed", "4", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote 300 requests to {out}" in result.output
    generated = build_workload("splitwise-code", 300, seed=4)
    trace = load_trace(out)
    assert trace.prompt_tokens.tolist() == generated.prompt_tokens.tolist()
    assert trace.output_tokens.tolist() == generated.output_tokens.tolist()
    assert abs(trace.arrival_s - generated.arrival_s).max() < 1e-6
    replayed = run(str(out), "--json")
    assert json.loads(replayed.output)[0]["requests"] == 300


def test_user_errors_are_servesim_errors():
    result = run("arxiv")
    assert isinstance(result.exception, ServesimError) and "--qps" in str(result.exception)
    result = run("arxiv", "splitwise-conv", "--qps", "1", "--out", "x.csv")
    assert isinstance(result.exception, ServesimError) and "single source" in str(result.exception)


def test_more_requests_than_a_run_can_hold_are_refused_as_typed():
    result = run("arxiv", "--qps", "1", "-n", "1000000000000")
    assert result.exit_code == 2 and "1<=x<=1000000" in result.output


def test_a_source_without_arrival_times_is_described_by_its_lengths_beside_the_others():
    result = run("splitwise-conv", "arxiv", "--requests", "200")
    assert result.exit_code == 0, result.output
    body = [line.split() for line in result.output.splitlines()[2:6]]
    assert body[0][:3] == ["splitwise-conv", "200", "trace"] and body[0][3] != "-"
    assert [row[:4] for row in body[2:]] == [["arxiv", "200", "none", "-"]] * 2
    notes = [line for line in result.output.splitlines() if line.startswith("arxiv:")]
    assert notes == ["arxiv: no arrival times of its own, so lengths only; give --qps, --concurrency or --arrival "
                     "burst to describe arrivals for every source"]
    described = json.loads(run("splitwise-conv", "arxiv", "--requests", "200", "--json").output)
    assert described[0]["arrival"] == "trace" and described[0]["rate_per_s"] > 0
    assert described[1]["arrival"] == "none" and described[1]["rate_per_s"] is None
    assert described[1]["prompt_tokens"]["mean"] > 0
    for fix in (("--qps", "4"), ("--concurrency", "4"), ("--arrival", "burst")):  # the note's suggestions work
        assert run("splitwise-conv", "arxiv", "--requests", "200", *fix).exit_code == 0
