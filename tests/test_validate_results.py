"""A user's own benchmark results (vllm bench serve JSON, GuideLLM reports) become replayable cases; bad files give
one-line errors naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.errors import ServesimError
from servesim.validate.replay import replay
from servesim.validate.results import Deployment, ServerFlags, read_result_file, result_cases, run_case
from servesim.workloads.arrivals import Burst, Gamma, Replay

DATA = Path(__file__).parent / "data" / "validate"


def test_vllm_bench_serve_summary_file_replays_a_closed_loop_at_mean_lengths() -> None:
    (run,) = read_result_file(DATA / "vllm_bench_serve.json")
    assert run.file_format == "vllm bench serve"
    assert run.measured_ttft_ms == 61.2 and run.measured_tpot_ms == 8.47
    assert run.concurrency == 16 and isinstance(run.arrivals, Burst)
    # No --save-detailed: 64 requests at the mean lengths 32768 / 64 and 8192 / 64.
    assert len(run.prompt_tokens) == 64
    assert set(run.prompt_tokens) == {512} and set(run.output_tokens) == {128}
    # --metadata gpu=H100-SXM tp=1 engine=vllm lands in the file's top level and fills the deployment.
    case = run_case(run, Deployment())
    assert (case.preset, case.gpu, case.engine, case.tp, case.dtype) == ("llama3.1-8b", "H100-SXM", "vllm", 1, "bf16")
    assert case.workload.arrival_mode == "closed" and case.workload.concurrency == 16


def test_vllm_detailed_file_keeps_per_request_lengths_and_drops_failed_requests() -> None:
    (run,) = read_result_file(DATA / "vllm_bench_serve_detailed.json")
    assert list(run.prompt_tokens) == [512, 256, 512, 256, 512]  # the 1024-token request failed (output 0)
    assert list(run.output_tokens) == [64, 32, 96, 64, 64]
    assert run.concurrency is None
    # request_rate 4, burstiness 0.5: gamma gaps with cv = 1 / sqrt(0.5).
    assert isinstance(run.arrivals, Gamma)
    assert run.arrivals.rate_per_s == 4.0 and run.arrivals.cv == pytest.approx(2 ** 0.5)


def test_command_line_deployment_overrides_the_file() -> None:
    (run,) = read_result_file(DATA / "vllm_bench_serve.json")
    case = run_case(run, Deployment(gpu="H200", tp=2, dtype="fp8"))
    assert (case.gpu, case.tp, case.dtype, case.engine) == ("H200", 2, "fp8", "vllm")


def test_missing_deployment_names_the_option_to_give() -> None:
    (run,) = read_result_file(DATA / "vllm_bench_serve_detailed.json")  # no gpu/engine metadata
    with pytest.raises(ServesimError, match="--gpu"):
        run_case(run, Deployment())


def test_guidellm_v03_report_reads_every_strategy() -> None:
    runs = read_result_file(DATA / "guidellm_v0.3.json")
    assert [r.run_id.split(" ")[1] for r in runs] == ["synchronous", "concurrent@8", "constant@2"]
    sync, concurrent, constant = runs
    assert sync.concurrency == 1 and concurrent.concurrency == 8 and constant.concurrency is None
    assert isinstance(constant.arrivals, Replay)
    gaps = np.diff(constant.arrivals.arrival_times_s(np.random.default_rng(0), 5))
    assert np.allclose(gaps, 0.5)  # constant@2: a request every 0.5 s
    # TPOT is GuideLLM's inter-token latency (its time_per_output_token_ms counts the first token).
    assert concurrent.measured_tpot_ms == 7.6 and concurrent.measured_ttft_ms == 41.0
    assert concurrent.model_id == "meta-llama/Llama-3.1-8B-Instruct"
    assert len(concurrent.prompt_tokens) == 48 and set(concurrent.output_tokens) == {128}


def test_guidellm_current_report_reads_config_strategy_and_backend_model() -> None:
    (run,) = read_result_file(DATA / "guidellm_v0.7.json")
    assert run.concurrency == 16 and run.model_id == "Qwen/Qwen3-32B"
    assert run.measured_ttft_ms == 118.0 and run.measured_tpot_ms == 12.4
    cases, skipped = result_cases([DATA / "guidellm_v0.7.json"], Deployment(gpu="H100-SXM", engine="sglang", tp=2))
    assert skipped == []
    assert cases[0].preset == "qwen3-32b" and cases[0].isl == 1024 and cases[0].osl == 256


@pytest.mark.parametrize(("name", "message"), [
    ("vllm_truncated.json", "not valid JSON"),
    ("guidellm_missing_itl.json", "inter_token_latency_ms.successful.mean is missing"),
    ("vllm_negative_tpot.json", "mean_tpot_ms must be a positive number"),
])
def test_malformed_files_fail_with_one_line_naming_the_problem(name: str, message: str) -> None:
    with pytest.raises(ServesimError, match=message) as info:
        read_result_file(DATA / name)
    assert "\n" not in str(info.value) and name in str(info.value)


def test_cli_reports_a_malformed_file_as_error_exit_2() -> None:
    result = CliRunner().invoke(main, ["validate", "results", str(DATA / "guidellm_missing_itl.json"),
                                       "--gpu", "H100-SXM", "--engine", "vllm"])
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and "inter_token_latency_ms" in result.output
    assert "Traceback" not in result.output


def test_cli_fails_when_no_run_could_be_replayed() -> None:
    result = CliRunner().invoke(main, ["validate", "results", str(DATA / "vllm_bench_serve.json"), "--gpu", "H1000"])
    assert result.exit_code == 2
    assert result.output.startswith("error: none of the 1 runs could be replayed") and "unknown GPU 'H1000'" in \
        result.output


def test_cli_replays_a_vllm_result_end_to_end() -> None:
    result = CliRunner().invoke(main, ["validate", "results", str(DATA / "vllm_bench_serve.json"), "--json"])
    assert result.exit_code == 0, result.output
    import json

    (row,) = json.loads(result.output)["rows"]
    assert row["measured_ttft_ms"] == 61.2 and row["requests"] == 64
    assert row["predicted_tpot_ms"] > 0 and row["tpot_error"] == pytest.approx(row["predicted_tpot_ms"] / 8.47 - 1)


def test_a_prompt_cycle_repeats_prompts_and_the_cache_serves_the_repeats() -> None:
    (run,) = read_result_file(DATA / "vllm_bench_serve.json")  # 64 requests of 512 prompt tokens, 16 clients
    flags = ServerFlags(max_num_seqs=8, max_num_batched_tokens=2048, prompt_cycle=4)
    case = run_case(run, Deployment(engine="vllm==0.12.0"), flags=flags)
    assert (case.engine, case.engine_version, case.max_num_seqs, case.max_num_batched_tokens) == (
        "vllm", "0.12.0", 8, 2048)
    assert list(case.workload.prefixes.segment_ids[:6]) == [0, 1, 2, 3, 0, 1]
    (cycled,), _ = replay([case], "roofline")
    (distinct,), _ = replay([run_case(run, Deployment(engine="vllm==0.12.0"),
                                      flags=ServerFlags(max_num_seqs=8, max_num_batched_tokens=2048))], "roofline")
    assert cycled["predicted_ttft_ms"] < distinct["predicted_ttft_ms"]


def test_a_prompt_cycle_the_lengths_contradict_is_refused() -> None:
    (run,) = read_result_file(DATA / "vllm_bench_serve_detailed.json")  # prompts 512, 256, 512, 256, 512
    with pytest.raises(ServesimError, match="request 1 has 256 prompt tokens but request 0"):
        run_case(run, Deployment(gpu="H100-SXM", engine="vllm"), flags=ServerFlags(prompt_cycle=1))
    assert run_case(run, Deployment(gpu="H100-SXM", engine="vllm"), flags=ServerFlags(prompt_cycle=2)).workload


def test_cli_takes_the_release_and_server_flags() -> None:
    result = CliRunner().invoke(main, ["validate", "results", str(DATA / "vllm_bench_serve.json"), "--engine",
                                       "vllm==0.15.1", "--max-num-seqs", "8", "--prompt-cycle", "4",
                                       "--estimator", "roofline", "--json"])
    assert result.exit_code == 0, result.output
    bad = CliRunner().invoke(main, ["validate", "results", str(DATA / "vllm_bench_serve.json"), "--engine",
                                    "vllm==0.1"])
    assert bad.exit_code == 2 and "vllm 0.1 is not modelled" in bad.output


def test_a_run_of_an_unknown_model_is_skipped_with_the_fix_and_a_config_path_is_replayed(tmp_path: Path) -> None:
    given = Deployment(model="acme/unknown-7b", gpu="H100-SXM", engine="vllm")
    cases, skipped = result_cases([DATA / "vllm_bench_serve.json"], given)
    assert not cases
    assert "no servesim preset for model 'acme/unknown-7b'" in skipped[0].reason
    assert "config.json" in skipped[0].reason
    from servesim.models.registry import preset_record

    config = tmp_path / "config.json"
    config.write_text(json.dumps(preset_record("llama3.1-8b")["config"]))
    (case,) = result_cases([DATA / "vllm_bench_serve.json"], Deployment(model=str(config)))[0]
    assert case.preset == str(config)
