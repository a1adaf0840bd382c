"""The walking-skeleton ``servesim plan`` and the catalogue commands, as a user runs them."""

import csv
import io
import json

from click.testing import CliRunner

from servesim.cli import main


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_plan_prints_every_gpu_with_numbers_and_the_estimator_label():
    result = run("plan", "--model", "llama3-70b", "--tp", "4", "--gpus", "H100,H20")
    assert result.exit_code == 0, result.output
    assert "estimator: roofline" in result.output
    lines = [line for line in result.output.splitlines() if line.startswith(("H100-SXM ", "H20 ")) and "TP4" in line]
    assert len(lines) == 2 and all("yes" in line for line in lines)


def test_plan_json_is_consistent_with_cost_arithmetic():
    result = run("plan", "--model", "llama3-70b", "--tp", "4", "--gpus", "H100,H20", "--json")
    payload = json.loads(result.output)
    assert payload["estimator"] == "roofline"
    by_gpu = {o["gpu"]: o for o in payload["options"]}
    h100, h20 = by_gpu["H100-SXM"], by_gpu["H20"]
    for option in (h100, h20):
        assert option["fits"] and option["ttft_ms"] > 0 and option["tpot_loaded_ms"] >= option["tpot_batch1_ms"]
        tokens_per_hour = option["output_tokens_per_s_per_gpu"] * option["num_gpus"] * 3600
        assert option["usd_per_million_output_tokens"] * tokens_per_hour / 1e6 == __import__("pytest").approx(option["usd_per_hour"])
    # The H20 has more DRAM bandwidth but a quarter of the H100's Tensor throughput.
    assert h20["tpot_batch1_ms"] < h100["tpot_batch1_ms"]
    assert h20["ttft_ms"] > 3 * h100["ttft_ms"]


def test_plan_csv_has_one_line_per_gpu():
    result = run("plan", "--model", "llama3-8b", "--gpus", "H100,L40S,A100", "--csv")
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert [r["gpu"] for r in rows] == ["H100-SXM", "L40S", "A100-SXM-80GB"]


def test_70b_on_one_h100_says_it_does_not_fit():
    result = run("plan", "--model", "llama3-70b", "--tp", "1", "--gpus", "H100")
    assert result.exit_code == 2
    assert "does not fit" in result.output and "131.4 GiB" in result.output
    assert "Traceback" not in result.output


def test_price_override_changes_cost():
    cheap = json.loads(run("plan", "--model", "llama3-8b", "--gpus", "H100", "--price", "H100=1.00", "--json").output)
    dear = json.loads(run("plan", "--model", "llama3-8b", "--gpus", "H100", "--price", "H100=2.00", "--json").output)
    assert dear["options"][0]["usd_per_million_output_tokens"] == __import__("pytest").approx(
        2 * cheap["options"][0]["usd_per_million_output_tokens"]
    )


def test_bad_inputs_are_one_line_errors():
    cases = [
        (("plan", "--model", "llama3-70b", "--tp", "3", "--gpus", "H100"), "does not divide the 64 attention heads"),
        (("plan", "--model", "llama3-70b", "--gpus", "H1000"), "unknown GPU 'H1000'"),
        (("plan", "--model", "lama3-70b", "--gpus", "H100"), "unknown model 'lama3-70b'"),
        (("plan", "--model", "llama3-8b", "--gpus", "H100", "--price", "H100"), "GPU=USD_PER_GPU_HOUR"),
        (("plan", "--model", "llama3-8b", "--gpus", "H100", "--tp", "16"), "exceeds the 8 GPUs"),
    ]
    for args, message in cases:
        result = run(*args)
        assert result.exit_code == 2, args
        assert message in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1


def test_catalogue_commands_list_gpus_and_models():
    gpus = json.loads(run("gpus", "--json").output)
    assert {"H100-SXM", "H20", "L20", "A40", "B200"} <= {g["name"] for g in gpus}
    models = json.loads(run("models", "--json").output)
    assert {"llama3-70b", "qwen3-30b-a3b", "mixtral-8x7b"} <= {m["name"] for m in models}
    details = run("gpus", "--details", "H20")
    assert "sm_count" in details.output and "78" in details.output


def test_every_command_has_help():
    for command in main.commands:
        result = run(command, "--help")
        assert result.exit_code == 0 and "Usage" in result.output
