"""``servesim kernels`` as a user runs it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from servesim.cli.kernels import kernels_command
from servesim.errors import ServesimError

ARGS = ["--model", "llama3-70b", "--engine", "vllm", "--tp", "4", "--batch", "prefill:2048, decode:16x1024"]


def test_table_groups_identical_layers_and_prints_totals():
    result = CliRunner().invoke(kernels_command, ARGS)
    assert result.exit_code == 0, result.output
    assert "1-79 (x79)" in result.output
    assert "qkv_proj" in result.output and "m=2064 n=2560 k=8192" in result.output
    assert "step total:" in result.output and "TFLOP" in result.output
    assert "attention backend fa3" in result.output


def test_all_layers_lists_every_layer():
    result = CliRunner().invoke(kernels_command, [*ARGS, "--all-layers", "--csv"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert sum(1 for line in lines if line.startswith("79,")) == 12  # one row per op of the last layer


def test_json_carries_the_full_sequence_and_consistent_totals():
    result = CliRunner().invoke(kernels_command, [*ARGS, "--json"])
    payload = json.loads(result.output)
    ops = payload["ops"]
    assert payload["cuda_graph"] == "none" and payload["num_tokens"] == 2064
    assert sum(op.get("flops", 0) for op in ops) == pytest.approx(payload["totals"]["flops"])
    assert sum(1 for op in ops if op["kind"] == "all_reduce") == 2 * 80 + 1
    first = next(op for op in ops if op["name"] == "qkv_proj")
    assert (first["layer"], first["m"], first["n"], first["k"]) == (0, 2064, 2560, 8192)


@pytest.mark.parametrize("extra,message", [
    (["--batch", "prefill=2048"], "prefill:NEW"),
    (["--tp", "3"], "TP=3"),
    (["--engine", "trtllm"], "vllm"),
    (["--batch", "decode:4x100, prefill:9000"], "exceed llama3-70b's context of 8,192 tokens"),
])
def test_bad_input_is_a_one_line_error(extra, message):
    result = CliRunner().invoke(kernels_command, [*ARGS, *extra])
    assert isinstance(result.exception, ServesimError)
    assert message in str(result.exception) and "\n" not in str(result.exception)


@pytest.mark.parametrize("option", ["--tp", "--pp"])
def test_parallel_sizes_are_checked_as_the_command_line_is_parsed(option):
    result = CliRunner().invoke(kernels_command, [*ARGS, option, "0"])
    assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output


def test_json_and_csv_together_are_refused_not_resolved_by_order():
    result = CliRunner().invoke(kernels_command, [*ARGS, "--json", "--csv"])
    assert result.exit_code == 2 and "--json and --csv are alternatives" in result.output


def test_a_release_is_accepted_as_the_other_commands_take_it():
    result = CliRunner().invoke(kernels_command, [*ARGS, "--engine", "vllm==0.12.0", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["release"] == "vllm==0.12.0" and payload["engine"] == "vllm"
    unknown = CliRunner().invoke(kernels_command, [*ARGS, "--engine", "vllm==0.9"])
    assert isinstance(unknown.exception, ServesimError) and "vllm==0.15.1" in str(unknown.exception)
