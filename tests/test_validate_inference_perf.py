"""inference-perf report folders become one replayable run per load stage: the shared-prefix prompts cycled as the
benchmark sends them, its arrivals, the harness's server settings, and the per-token time from the means."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.errors import ServesimError
from servesim.validate.inference_perf import ScaledExponential
from servesim.validate.results import Deployment, ServerFlags, read_result_file, result_cases, run_case

REPORT = Path(__file__).parent / "data" / "validate" / "inference_perf" / "llama2-7b-tp2-chat" / "results"


def test_each_stage_is_a_run_with_the_rate_times_duration_requests() -> None:
    first, second = read_result_file(REPORT)
    assert [len(first.prompt_tokens), len(second.prompt_tokens)] == [20, 400]
    assert first.concurrency is None and first.file_format == "inference-perf"
    assert first.run_id.startswith("llama2-7b-tp2-chat#0") and second.run_id.startswith("llama2-7b-tp2-chat#1")


def test_measured_time_per_token_comes_from_the_mean_e2e_and_ttft() -> None:
    run = read_result_file(REPORT)[0]
    assert run.measured_ttft_ms == pytest.approx(30.0) and run.measured_e2e_ms == pytest.approx(600.0)
    assert run.measured_tpot_ms == pytest.approx((600.0 - 30.0) / 63)  # output_len 64 with ignore_eos
    assert set(run.output_tokens) == {64}


def test_prompts_cycle_through_the_groups_and_share_their_system_prompt() -> None:
    run = read_result_file(REPORT)[1]
    prefixes, n, distinct = run.prefixes, len(run.prompt_tokens), 6
    ids = prefixes.segment_ids.reshape(n, 2)
    assert (ids[distinct:] == ids[:-distinct]).all()  # request k sends prompt k mod 6
    assert len({tuple(row) for row in ids}) == distinct and set(ids[:, 0]) == {0, 1}
    for group in (0, 1):  # three questions per system prompt
        assert len(set(ids[ids[:, 0] == group, 1])) == 3
    assert (prefixes.prompt_tokens() == 420).all()  # scaled to the measured mean prompt length
    assert (prefixes.segment_tokens.reshape(n, 2)[:, 0] == 105).all()  # system part: 100 of 400 nominal tokens


def test_a_stage_with_failed_requests_is_listed_not_replayed() -> None:
    cases, skipped = result_cases([REPORT], Deployment(gpu="H100-SXM"))
    assert len(cases) == 1 and len(skipped) == 1
    assert "90 of 400 requests failed" in skipped[0].reason and skipped[0].case_id.endswith("constant@40")


def test_the_harness_config_gives_the_layout_and_the_command_line_wins() -> None:
    run = read_result_file(REPORT)[0]
    case = run_case(run, Deployment(gpu="H100-SXM"))
    assert (case.preset, case.tp, case.engine, case.max_num_seqs, case.max_num_batched_tokens) == (
        "llama2-7b", 2, "vllm", 64, 2048)
    case = run_case(run, Deployment(gpu="H100-SXM", tp=1), flags=ServerFlags(max_num_seqs=128))
    assert (case.tp, case.max_num_seqs, case.max_num_batched_tokens) == (1, 128, 2048)
    assert case.workload.prefixes is run.prefixes and case.workload.arrival_mode == "open"


def test_constant_load_spreads_exponential_gaps_over_the_duration() -> None:
    times = ScaledExponential(rate_per_s=4.0, duration_s=30.0).arrival_times_s(np.random.default_rng(1), 120)
    assert len(times) == 120 and times[-1] == pytest.approx(30.0) and (np.diff(times) > 0).all()


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "run" / "results"
    shutil.copytree(REPORT, folder)
    return folder


@pytest.mark.parametrize(("edit", "message"), [
    (("type: shared_prefix", "type: random"), "data type 'random' is not replayable; shared_prefix is"),
    (("type: constant", "type: concurrent"), "load type 'concurrent' is not replayable; constant and poisson are"),
    (("streaming: true", "streaming: false"), "api.streaming is off"),
    (("output_len: 64", "output_len: -3"), "output_len must be a positive number"),
])
def test_unreplayable_configs_fail_with_one_line(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    folder = _copy(tmp_path)
    config = folder / "config.yaml"
    config.write_text(config.read_text().replace(*edit))
    with pytest.raises(ServesimError, match=message) as info:
        read_result_file(folder)
    assert "\n" not in str(info.value)


def test_a_folder_without_a_config_names_what_to_give(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["validate", "results", str(tmp_path), "--gpu", "H100-SXM"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "config.yaml: no such file; give an inference-perf report folder" in result.output


def test_cli_replays_a_report_folder_with_e2e_columns(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["validate", "results", str(REPORT), "--gpu", "H100-SXM", "--engine",
                                       "vllm==0.15.1", "--estimator", "roofline", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    (row,) = payload["rows"]
    assert row["measured_e2e_ms"] == pytest.approx(600.0)
    assert row["e2e_error"] == pytest.approx(row["predicted_e2e_ms"] / 600.0 - 1)
    assert row["predicted_ttft_ms"] < row["predicted_e2e_ms"] and row["requests"] == 20
    (skipped,) = payload["skipped"]
    assert "requests failed" in skipped["reason"]


def test_cli_table_ends_with_the_errors_over_the_runs() -> None:
    result = CliRunner().invoke(main, ["validate", "results", str(REPORT), "--gpu", "H100-SXM", "--estimator",
                                       "roofline"])
    assert result.exit_code == 0, result.output
    summary = next(line for line in result.output.splitlines() if line.startswith("over these runs:"))
    assert "TTFT MAPE" in summary and "TPOT MAPE" in summary and "E2E MAPE" in summary
    assert "not replayed: llama2-7b-tp2-chat#1" in result.output
