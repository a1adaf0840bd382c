"""Bad input as a user types it: one line saying what is wrong and what works, exit status 2, no traceback, and
nothing written before the check."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from servesim.cli import main


def run(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def refused(result, *fragments: str) -> str:
    """The one error line of a refused command, after checking the exit status and that no traceback came out."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# Files that are not UTF-8 ---------------------------------------------------------------------------------------

def test_latin1_trace_is_refused_with_its_line(tmp_path: Path):
    trace = tmp_path / "l1.csv"
    trace.write_bytes(b"arrival_s,prompt_tokens,output_tokens,note\n0,100,10,caf\xe9\n")
    refused(run("workload", trace), "line 2 is not UTF-8", "0xe9")


def test_latin1_jsonl_trace_is_refused(tmp_path: Path):
    trace = tmp_path / "l1.jsonl"
    trace.write_bytes(b'{"prompt_tokens": 1, "output_tokens": 2, "note": "caf\xe9"}\n')
    refused(run("workload", trace), "line 1 is not UTF-8")


def test_latin1_price_file_is_refused(tmp_path: Path):
    prices = tmp_path / "p.csv"
    prices.write_bytes(b"gpu,usd_per_gpu_hour,date\nH100,2.0,caf\xe9\n")
    refused(run("plan", "--model", "llama3-8b", "--tp", "1", "--pp", "1", "--quick", "--prices", prices),
            "line 2 is not UTF-8")


def test_latin1_model_config_is_refused(tmp_path: Path):
    config = tmp_path / "config.json"
    config.write_bytes(b'{"hidden_size": 4096, "name": "caf\xe9"}')
    refused(run("plan", "--model", config, "--quick"), "line 1 is not UTF-8")


# Output paths are checked before the work ------------------------------------------------------------------------

READ_ONLY = Path("/sys")  # a folder no one can create files in, root included


def usage_error(result, *fragments: str) -> str:
    """click's refusal of an option value: exit status 2, one 'Error:' line, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.output
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


@pytest.mark.skipif(not READ_ONLY.is_dir(), reason="needs Linux's /sys")
@pytest.mark.parametrize("args", [
    ("plan", "--model", "llama3-8b", "--gpus", "H100", "--tp", "1", "--pp", "1", "--plot", "/sys"),
    ("plan", "--model", "llama3-8b", "--gpus", "H100", "--tp", "1", "--pp", "1", "--plot", "/sys/new/plots"),
    ("simulate", "--model", "llama3-8b", "--requests-csv", "/sys/requests.csv"),
    ("simulate", "--model", "llama3-8b", "--trace", "/sys/trace.json"),
    ("workload", "arxiv", "--out", "/sys/arxiv.csv"),
])
def test_unwritable_output_is_refused_before_the_work(args, monkeypatch):
    import servesim.workloads

    def no_work(*args, **kwargs):
        raise AssertionError("the work started before the output path was checked")

    monkeypatch.setattr(servesim.workloads, "build_workload", no_work)
    usage_error(run(*args), "cannot write")


def test_output_folder_under_a_file_is_refused(tmp_path: Path):
    (tmp_path / "file").write_text("x")
    usage_error(run("plan", "--model", "llama3-8b", "--tp", "1", "--pp", "1", "--plot", tmp_path / "file" / "plots"),
                "is a file")


def test_output_folder_that_can_be_created_is_accepted(tmp_path: Path):
    from servesim.cli.params import OutputFolder

    assert OutputFolder().convert(str(tmp_path / "a" / "b"), None, None) == tmp_path / "a" / "b"


# Custom-column traces ----------------------------------------------------------------------------------------------

def custom_trace(tmp_path: Path) -> Path:
    trace = tmp_path / "custom.csv"
    trace.write_text("t,inp,outp\n" + "".join(f"{i * 0.5},{200 + i},{20 + i % 7}\n" for i in range(60)))
    return trace


def test_unknown_trace_format_names_the_columns_option(tmp_path: Path):
    refused(run("simulate", "--model", "llama3-8b", "--workload", custom_trace(tmp_path)), "--columns prompt=")


def test_simulate_reads_a_trace_through_columns(tmp_path: Path):
    result = run("simulate", "--model", "llama3-8b", "--workload", custom_trace(tmp_path),
                 "--columns", "prompt=inp,output=outp,arrival=t", "--json")
    assert result.exit_code == 0, result.output
    assert '"requests"' in result.output or "60" in result.output


def test_plan_reads_a_trace_through_columns(tmp_path: Path):
    result = run("plan", "--model", "llama3-8b", "--tp", "1", "--pp", "1", "--jobs", "1", "--workload",
                 custom_trace(tmp_path), "--columns", "prompt=inp,output=outp", "--json")
    assert result.exit_code == 0, result.output
    import json

    assert json.loads(result.output)["workload"]["requests"] == 60


def test_plan_quick_refuses_columns():
    refused(run("plan", "--model", "llama3-8b", "--quick", "--columns", "prompt=a,output=b"), "--columns")


def test_plan_quick_refuses_a_stream_interval_it_would_ignore():
    """--stream-interval only changes the simulated ITL, which --quick does not compute."""
    refused(run("plan", "--model", "llama3-8b", "--quick", "--stream-interval", "10"), "--stream-interval",
            "drop --quick")


# One GPU without FP8 does not stop an FP8 comparison ---------------------------------------------------------------

def test_fp8_plan_marks_a_gpu_without_fp8_unsupported_and_keeps_the_others():
    import json

    result = run("plan", "--model", "llama3-8b", "--gpus", "H100,A100", "--dtype", "fp8", "--tp", "1", "--pp", "1",
                 "--workload", "fixed:512:48", "-n", "200", "--jobs", "1", "--json")
    assert result.exit_code == 0, result.output
    options = {o["gpu"]: o for o in json.loads(result.output)["options"]}
    assert options["H100-SXM"]["status"] == "ok"
    assert options["A100-SXM-80GB"]["status"] == "unsupported"
    assert "FP8" in options["A100-SXM-80GB"]["note"]


def test_fp8_quick_plan_notes_the_unsupported_gpu():
    result = run("plan", "--model", "mixtral-8x7b", "--gpus", "H100,A100", "--dtype", "fp8", "--tp", "2", "--quick")
    assert result.exit_code == 0, result.output
    assert "H100-SXM" in result.output
    assert any(line.startswith("A100-SXM-80GB TP2") and "(unsupported)" in line for line in result.output.splitlines())


def test_fp8_quick_plan_names_every_unsupported_layout_of_a_gpu_in_one_note():
    result = run("plan", "--model", "llama3-8b", "--gpus", "H100,A100", "--dtype", "fp8", "--pp", "1", "--quick")
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if "(unsupported)" in line]
    assert len(notes) == 1 and notes[0].startswith("A100-SXM-80GB TP1, TP2, TP4, TP8 (unsupported): ")


def test_fp8_plan_on_gpus_without_fp8_only_is_refused():
    refused(run("plan", "--model", "llama3-8b", "--gpus", "A100", "--dtype", "fp8", "--tp", "1", "--quick"),
            "no FP8 Tensor cores")


# Layout suggestions are layouts the same command accepts -------------------------------------------------------------

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def _suggested(args: list[str], error: str) -> list[list[str]]:
    """The commands a layout error suggests: ``args`` with --tp or --pp replaced by each suggested value."""
    def with_value(flag: str, value: int) -> list[str]:
        i = args.index(flag)
        return args[:i + 1] + [str(value)] + args[i + 2:]

    among = re.search(r"use a TP among ([\d, ]+)", error)
    if among:
        values = [int(v) for v in among.group(1).split(",")]
        return [with_value("--tp", v) for v in (values[0], values[-1])]
    most = re.search(r"use PP ≤ (\d+)", error)
    if most:
        return [with_value("--pp", int(most.group(1)))]
    return []


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=st.sampled_from(["llama3-8b", "qwen2.5-7b", "mixtral-8x7b"]), tp=st.integers(1, 40),
       pp=st.integers(1, 40), command=st.sampled_from(["plan", "simulate"]))
def test_layout_suggestions_are_accepted(model, tp, pp, command):
    args = (["plan", "--model", model, "--quick"] if command == "plan"
            else ["latency", "--model", model, "--batch-size", "1", "--input-len", "8", "--output-len", "2"])
    args += ["--tp", str(tp), "--pp", str(pp)]
    result = run(*args)
    if result.exit_code == 0 or not any(w in result.output for w in ("TP=", "PP=", "TP×PP")):
        return
    error = refused(result)
    suggestions = _suggested(args, error)
    assert suggestions, error
    for suggestion in suggestions:
        again = run(*suggestion)
        assert again.exit_code == 0 or again.output.strip() != error, (suggestion, error)
        layout_error = re.search(r"(TP|PP|TP×PP)=\d+ (does not|exceeds|and the)", again.output)
        assert layout_error is None or again.output.strip() != error, (suggestion, again.output)


def test_suggestions_leave_out_tps_plan_refuses():
    assert "use a TP among 1, 2, 4\n" in run("plan", "--model", "qwen2.5-7b", "--tp", "8", "--quick").output
    assert "use a TP among 1, 2, 4, 8\n" in run("plan", "--model", "llama3-8b", "--tp", "3", "--quick").output


def test_one_layout_bound_for_every_command():
    refused(run("simulate", "--model", "llama3-8b", "--tp", "16"), "exceeds the 8 GPUs of one H100-SXM node")
    refused(run("latency", "--model", "llama3-8b", "--tp", "16"), "exceeds the 8 GPUs")
    refused(run("kernels", "--model", "llama3-8b", "--tp", "16", "--batch", "decode:1x10"), "exceeds the 8 GPUs")


def test_collective_group_is_bounded():
    refused(run("kernel", "allreduce", "--gpu", "H100", "--gpus", "100000", "--bytes", "16MiB"),
            "use --gpus between 2 and 16")
    assert run("kernel", "allreduce", "--gpu", "H100", "--gpus", "16", "--bytes", "16MiB").exit_code == 0


def test_fp8_plan_does_not_advise_fp8_or_a_gpu_without_it():
    quick = refused(run("plan", "--model", "llama3-70b", "--tp", "1", "--pp", "1", "--dtype", "fp8", "--quick"))
    assert "FP8" not in quick
    searched = refused(run("plan", "--model", "llama3-70b", "--tp", "1", "--pp", "1", "--dtype", "fp8", "-n", "50"))
    assert "use FP8" not in searched and "fp8 weights" not in searched and "A100" not in searched


# Arrival times beyond any run ----------------------------------------------------------------------------------------

def test_vanishing_rate_is_refused_with_a_rate_that_works():
    error = refused(run("workload", "arxiv", "--qps", "1e-300"), "raise --qps to at least")
    rate = error.rsplit(" ", 1)[-1]
    assert run("workload", "arxiv", "--qps", rate).exit_code == 0


def test_trace_arrival_of_1e300_seconds_is_refused(tmp_path: Path):
    trace = tmp_path / "big.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,10\n1e300,10,10\n")
    refused(run("workload", trace), "1e+300 s", "unit")


# Results that cannot be trusted say so ---------------------------------------------------------------------------

def test_overloaded_simulation_says_the_server_falls_behind():
    import json

    result = run("simulate", "--model", "llama3-8b", "--gpu", "H100", "--workload", "fixed:512:64", "--qps", "1000",
                 "-n", "200")
    assert result.exit_code == 0, result.output
    assert "the server falls behind: requests completed at 0% of the arrival rate" in result.output
    assert "lower --qps or add --replicas" in result.output
    summary = json.loads(run("simulate", "--model", "llama3-8b", "--gpu", "H100", "--workload", "fixed:512:64",
                             "--qps", "1000", "-n", "200", "--json").output)["summary"]
    assert summary["overloaded"] is True and summary["completion_ratio"] < 0.8


def test_sustained_simulation_has_no_overload_note():
    import json

    result = run("simulate", "--model", "llama3-8b", "--gpu", "H100", "--workload", "fixed:512:64", "--qps", "2",
                 "-n", "40", "--json")
    summary = json.loads(result.output)["summary"]
    assert summary["overloaded"] is False and summary["completion_ratio"] == 1.0
    closed = json.loads(run("simulate", "--model", "llama3-8b", "--gpu", "H100", "--workload", "fixed:512:64",
                            "--concurrency", "4", "-n", "20", "--json").output)["summary"]
    assert closed["overloaded"] is False and closed["completion_ratio"] is None


def test_target_needing_more_replicas_than_the_bound_is_not_a_plan():
    import json
    import re

    from servesim.limits import MAX_REPLICAS

    args = ("plan", "--model", "llama3-8b", "--gpus", "H100", "--tp", "1", "--pp", "1", "-n", "100", "--qps", "1e9")
    line = refused(run(*args), f"more than the {MAX_REPLICAS:,} servesim plans for", "lower --qps to at most")
    fits = float(re.search(r"lower --qps to at most (\S+)$", line).group(1))
    result = run(*args, "--json")
    assert result.exit_code == 2, result.output
    payload = json.loads(result.output)
    (option,) = payload["options"]
    assert option["status"] == "too_large" and option["rank"] is None and payload["recommendation"] is None
    assert option["replicas"] > MAX_REPLICAS and option["usd_per_hour"] is None
    assert f"{MAX_REPLICAS:,}" in option["note"]
    assert payload["infeasible"] == line.removeprefix("error: ")
    assert fits / option["capacity_qps"] <= MAX_REPLICAS  # the suggested target plans within the bound


# A hub id without network ----------------------------------------------------------------------------------------

def test_hub_id_without_network_fails_fast_with_a_local_path_to_use(monkeypatch):
    import time

    import servesim.models.registry as registry

    monkeypatch.setattr(registry, "_hub_reachable", lambda *args: False)
    start = time.monotonic()
    refused(run("plan", "--model", "some-org/some-model", "--gpus", "H100", "--quick"),
            "hub id 'some-org/some-model'", "cannot be reached", "pass a local path to its config.json")
    assert time.monotonic() - start < 15  # no retries against an unreachable hub


@pytest.mark.parametrize("command", [
    ("plan", "--gpus", "H100", "--tp", "1", "--pp", "1", "-n", "50"),
    ("simulate", "-n", "10"),
    ("latency",),
])
def test_an_sglang_flag_given_to_vllm_says_which_engine_takes_it(command):
    """--scheduler-recv-interval is SGLang's; with vLLM every command refuses it in one line that names the way out,
    and that way out works."""
    base = [command[0], "--model", "llama3-8b", *command[1:], "--scheduler-recv-interval", "10"]
    refused(run(*base), "SGLang flag", "--engine sglang")
    if command[0] == "latency":
        assert run(*base, "--engine", "sglang").exit_code == 0


def test_a_vllm_graph_size_given_to_sglang_says_which_engine_takes_it():
    """--max-cudagraph-capture-size is vLLM's: SGLang refuses it in one line that names the way out, which works."""
    base = ["latency", "--model", "llama3-8b", "--max-cudagraph-capture-size", "64"]
    refused(run(*base, "--engine", "sglang"), "vLLM flag", "--engine vllm")
    assert run(*base, "--engine", "vllm").exit_code == 0
