"""Malformed input fed to the command line: every refusal is exit status 2 with exactly one error line, never a
traceback, and no output file is left half-written."""

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.cli import main

FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def invoke(*args) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


def check(result, out: Path | None = None) -> None:
    """Accepted (0), or refused the project's way: status 2, one error line, no traceback, no output file."""
    assert "Traceback" not in result.output
    if result.exit_code == 0:
        return
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    errors = [line for line in result.output.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1, result.output
    if out is not None:
        assert not out.exists(), f"{out} written by a refused command"


NUMBERS = st.one_of(
    st.integers(-10**30, 10**30).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", "nan", "inf", "-inf", "1e300", "-1", "0", "1.5", "0x10", "ten", "1,000", " 7 "]),
)
ROW = st.lists(NUMBERS, min_size=0, max_size=5)
HEADERS = st.sampled_from([
    "arrival_s,prompt_tokens,output_tokens", "prompt_tokens,output_tokens", "a,b,c", "", "arrival_s,prompt_tokens",
    "num_prefill_tokens,num_decode_tokens,arrived_at", "prompt_tokens,output_tokens,prompt_id",
])


@FUZZ
@given(header=HEADERS, rows=st.lists(ROW, max_size=6), junk=st.binary(max_size=12))
def test_malformed_csv_traces(tmp_path_factory, header, rows, junk):
    folder = tmp_path_factory.mktemp("trace")
    trace = folder / "t.csv"
    trace.write_bytes((header + "\n" + "\n".join(",".join(r) for r in rows) + "\n").encode() + junk)
    out = folder / "out.csv"
    result = invoke("workload", trace, "--out", out)
    check(result)
    if result.exit_code != 0:
        assert not out.exists()


@FUZZ
@given(records=st.lists(st.dictionaries(st.sampled_from(["prompt_tokens", "output_tokens", "arrival_s", "x"]),
                                        st.one_of(st.integers(-10**20, 10**20), st.floats(), st.text(max_size=4),
                                                  st.none(), st.lists(st.integers(), max_size=2))),
                        max_size=5),
       junk=st.binary(max_size=8))
def test_malformed_jsonl_traces(tmp_path_factory, records, junk):
    folder = tmp_path_factory.mktemp("jsonl")
    trace = folder / "t.jsonl"
    trace.write_bytes(("\n".join(json.dumps(r) for r in records) + "\n").encode() + junk)
    out = folder / "out.csv"
    result = invoke("workload", trace, "--out", out)
    check(result)
    if result.exit_code != 0:
        assert not out.exists()


@FUZZ
@given(config=st.one_of(
    st.dictionaries(st.sampled_from(["hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size",
                                     "intermediate_size", "num_key_value_heads", "model_type"]),
                    st.one_of(st.integers(-10, 10**12), st.floats(), st.text(max_size=3), st.none()),
                    max_size=7).map(json.dumps),
    st.text(max_size=20)), junk=st.binary(max_size=6))
def test_malformed_model_configs(tmp_path_factory, config, junk):
    path = tmp_path_factory.mktemp("model") / "config.json"
    path.write_bytes(config.encode() + junk)
    check(invoke("plan", "--model", path, "--tp", "1", "--pp", "1", "--quick"))


@FUZZ
@given(rows=st.lists(st.tuples(st.sampled_from(["H100", "A100", "nope", "", "h100-sxm"]), NUMBERS,
                               st.sampled_from(["", "2025-01-01", "yesterday"])), max_size=4),
       header=st.sampled_from(["gpu,usd_per_gpu_hour,date", "gpu,price", ""]), junk=st.binary(max_size=6))
def test_malformed_price_files(tmp_path_factory, rows, header, junk):
    path = tmp_path_factory.mktemp("prices") / "p.csv"
    path.write_bytes((header + "\n" + "\n".join(",".join(r) for r in rows) + "\n").encode() + junk)
    check(invoke("plan", "--model", "llama3-8b", "--tp", "1", "--pp", "1", "--quick", "--prices", path))


@FUZZ
@given(option=st.sampled_from(["--qps", "--cv", "--time-scale", "-n", "--seed", "--max-prompt-tokens"]),
       value=NUMBERS)
def test_workload_option_values(tmp_path_factory, option, value):
    out = tmp_path_factory.mktemp("opt") / "w.csv"
    args = ["workload", "fixed:64:8", "-n", "20", "--out", out]
    args = args[:2] + args[4:] if option == "-n" else args
    result = invoke(*args, option, value)
    check(result)
    if result.exit_code != 0:
        assert not out.exists()


@FUZZ
@given(option=st.sampled_from(["--tp", "--pp", "--qps", "-n", "--tolerance", "--ttft-p90", "--memory-fraction",
                               "--gpu-budget", "--max-num-seqs"]),
       value=NUMBERS)
def test_plan_option_values(option, value):
    args = ["plan", "--model", "llama3-8b", "--workload", "fixed:64:8", "-n", "30", "--jobs", "1"]
    if option not in ("--tp", "--pp"):
        args += ["--tp", "1", "--pp", "1"]
    if option == "-n":
        args = args[:5] + args[7:]
    if option in ("--tp", "--pp", "--memory-fraction", "--max-num-seqs"):
        args += ["--quick"]
        args = [a for i, a in enumerate(args) if a not in ("--workload", "fixed:64:8", "-n", "30", "--jobs", "1")]
    check(invoke(*args, option, value))


@pytest.mark.parametrize("args", [
    ("simulate", "--model", "llama3-8b", "--qps", "nan"),
    ("simulate", "--model", "llama3-8b", "--qps", "-1"),
    ("kernel", "allreduce", "--gpu", "H100", "--gpus", "100000", "--bytes", "1MiB"),
    ("kernel", "allreduce", "--gpu", "H100", "--bytes", "-5"),
    ("latency", "--model", "llama3-8b", "--tp", "3"),
    ("plan", "--model", "llama3-8b", "--tp", "1", "--pp", "1", "--tolerance", "1e-20"),  # a search that never closes
])
def test_refused_option_values(args):
    result = invoke(*args)
    check(result)
    assert result.exit_code == 2
