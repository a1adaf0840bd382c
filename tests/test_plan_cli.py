"""``servesim plan`` (the SLO capacity planner and its --quick estimate) and the catalogue commands, as a user runs
them."""

import csv
import io
import json
import math
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from servesim.cli import main

DOCS = Path(__file__).resolve().parents[1] / "docs" / "planner.md"
#: A small, fast plan: llama3-8b on one layout, short fixed-length requests.
SMALL = ("--model", "llama3-8b", "--tp", "1", "--pp", "1", "--workload", "fixed:512:48", "-n", "300", "--jobs", "1")

PLAN_KEYS = ["schema_version", "model", "dtype", "kv_cache_dtype", "engine", "engine_release", "estimator",
             "estimator_label",
             "estimator_coverage", "workload",
             "search", "target", "slos", "gpu_budget", "recommendation", "infeasible", "options"]
OPTION_KEYS = ["rank", "gpu", "layout", "tp", "pp", "ep", "dp", "gpus_per_replica", "status", "capacity_qps",
               "capacity_concurrency", "slo_values_ms", "binding", "replicas", "total_gpus", "usd_per_gpu_hour",
               "price_date", "usd_per_hour", "usd_per_million_output_tokens", "output_tokens_per_s_per_gpu",
               "weights_gib_per_gpu", "kv_tokens", "unloaded_ms", "simulations", "note", "sample_warning",
               "launch_command", "probes"]
PROBE_KEYS = ["load", "meets_slos", "stopped_by", "sustained", "request_rate_per_s", "completion_ratio",
              "output_tokens_per_s", "slo_values_ms", "latency_ms", "peak_kv_occupancy", "preemptions"]


@pytest.fixture(autouse=True, scope="module")
def step_store(tmp_path_factory):
    """Plans keep their step times in a folder of these tests' own (servesim/planner/step_store.py)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SERVESIM_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def plan_json(*args: str) -> dict:
    result = run("plan", *SMALL, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.fixture(scope="module")
def two_gpus() -> dict:
    return plan_json("--gpus", "H100,A100", "--qps", "150", "--tpot-p90", "30")


def test_readme_command_plans_with_printed_defaults():
    result = run("plan", "--model", "llama3-70b", "--tp", "4", "--pp", "1", "--gpus", "H100,H20", "-n", "150",
                 "--estimator", "roofline")
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[:3]
    assert "TTFT p90 ≤ 2000 ms and TPOT p90 ≤ 100 ms (default SLOs)" in header[0]
    assert "workload splitwise-conv: 150 requests" in header[1] and "poisson arrivals" in header[1]
    assert "splits to 5%" in header[2] and "estimator: roofline" in header[2]
    rows = [line for line in result.output.splitlines() if re.match(r"\s+\d+\s+(H100-SXM|H20)\s+TP4\s", line)]
    assert len(rows) == 2
    assert "Recommendation: " in result.output and " is the cheapest option per output token within" in result.output


def test_json_keys_are_stable_and_documented(two_gpus):
    assert list(two_gpus) == PLAN_KEYS and two_gpus["schema_version"] == 1
    option = two_gpus["options"][0]
    assert list(option) == OPTION_KEYS
    assert list(option["probes"][0]) == PROBE_KEYS
    assert list(option["slo_values_ms"]) == ["tpot_p90"]
    documented = set(re.findall(r"`([a-z_0-9]+)`", DOCS.read_text()))
    assert set(PLAN_KEYS + OPTION_KEYS + PROBE_KEYS) <= documented
    assert set(two_gpus["workload"]) | set(two_gpus["search"]) | set(two_gpus["slos"][0]) <= documented


def test_replicas_cover_the_target_and_ranking_follows_cost(two_gpus):
    ranked = [o for o in two_gpus["options"] if o["rank"]]
    assert [o["rank"] for o in ranked] == [1, 2]
    assert [o["usd_per_hour"] for o in ranked] == sorted(o["usd_per_hour"] for o in ranked)
    for option in ranked:
        assert option["replicas"] * option["capacity_qps"] >= 150
        assert (option["replicas"] - 1) * option["capacity_qps"] < 150
        assert option["total_gpus"] == option["replicas"] * option["gpus_per_replica"]
        assert option["usd_per_hour"] == pytest.approx(option["total_gpus"] * option["usd_per_gpu_hour"])
        assert option["slo_values_ms"]["tpot_p90"] <= 30
        capacity = next(p for p in option["probes"] if p["load"] == option["capacity_qps"])
        assert capacity["meets_slos"]
        assert all(not p["meets_slos"] for p in option["probes"] if p["load"] > option["capacity_qps"])
    winner = ranked[0]
    assert two_gpus["recommendation"]["gpu"] == winner["gpu"]
    assert two_gpus["recommendation"]["explanation"].startswith(f"{winner['gpu']} {winner['layout']} is the cheapest")


def test_prices_decide_the_ranking_but_never_a_capacity(two_gpus):
    capacities = {o["gpu"]: o["capacity_qps"] for o in two_gpus["options"]}
    for cheap, dear, winner in (("H100", "A100", "H100-SXM"), ("A100", "H100", "A100-SXM-80GB")):
        payload = plan_json("--gpus", "H100,A100", "--qps", "150", "--tpot-p90", "30", "--price", f"{cheap}=0.01",
                            "--price", f"{dear}=100")
        assert payload["recommendation"]["gpu"] == winner
        assert {o["gpu"]: o["capacity_qps"] for o in payload["options"]} == capacities


def test_csv_has_one_line_per_option(two_gpus):
    result = run("plan", *SMALL, "--gpus", "H100,A100", "--qps", "150", "--tpot-p90", "30", "--csv")
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert sorted(r["gpu"] for r in rows) == ["A100-SXM-80GB", "H100-SXM"]
    assert {"capacity_qps", "slo_tpot_p90_ms", "usd_per_million_output_tokens", "status"} <= set(rows[0])


def test_an_slo_below_the_unloaded_latency_is_one_line_saying_what_would_work():
    result = run("plan", *SMALL, "--gpus", "H100", "--tpot-p90", "1")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "tighter than the unloaded latency" in result.output and "loosen --tpot-p90 to at least" in result.output


@pytest.mark.parametrize("command", [("plan", *SMALL, "--gpus", "H100"), ("latency", "--model", "llama3-8b"),
                                     ("kernel", "gemm", "--m", "1", "--n", "8", "--k", "8"),
                                     ("validate", "silicon", "--gpu", "H100")])
def test_every_command_names_the_nearest_estimator_for_a_misspelt_one(command):
    result = run(*command, "--estimator", "rooflin")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "unknown estimator 'rooflin'. Did you mean roofline?" in result.output


def test_a_model_that_fits_nowhere_says_which_gpu_would_hold_it():
    result = run("plan", "--model", "llama3-70b", "--tp", "1", "--pp", "1", "--gpus", "H100")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "fits no layout tried" in result.output and "131.4 GiB" in result.output and "it fits" in result.output


def test_options_over_the_gpu_budget_are_reported_not_dropped():
    payload_result = run("plan", *SMALL, "--gpus", "H100", "--qps", "1000", "--tpot-p90", "30", "--gpu-budget", "1",
                         "--json")
    assert payload_result.exit_code == 2
    payload = json.loads(payload_result.output)
    [option] = payload["options"]
    assert option["status"] == "over_budget" and option["total_gpus"] > 1
    assert payload["recommendation"] is None and "raise --gpu-budget" in payload["infeasible"]
    table = run("plan", *SMALL, "--gpus", "H100", "--qps", "1000", "--tpot-p90", "30", "--gpu-budget", "1")
    assert table.exit_code == 2 and f"raise --gpu-budget to {option['total_gpus']}" in table.output


def test_concurrency_searches_clients_and_sizes_replicas_for_them():
    payload = plan_json("--gpus", "H100", "--concurrency", "100", "--tpot-p90", "30")
    [option] = payload["options"]
    assert payload["search"]["variable"] == "concurrency" and payload["target"]["concurrency"] == 100
    assert option["capacity_concurrency"] == int(option["capacity_concurrency"]) >= 1
    assert option["replicas"] == math.ceil(100 / option["capacity_concurrency"])


def test_plot_writes_latency_and_pareto_pngs(tmp_path):
    result = run("plan", *SMALL, "--gpus", "H100,A100", "--tpot-p90", "30", "--plot", str(tmp_path))
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["latency_A100-SXM-80GB_TP1.png", "latency_H100-SXM_TP1.png", "pareto_cost_vs_tpot.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in tmp_path.iterdir())


def test_ray_executor_without_ray_says_how_to_install_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)
    result = run("plan", *SMALL, "--gpus", "H100", "--executor", "ray")
    assert result.exit_code == 2 and "pip install 'servesim[ray]'" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_bad_inputs_are_one_line_errors():
    cases = [
        (("plan", "--model", "llama3-70b", "--tp", "3", "--gpus", "H100"), "does not divide the 64 attention heads"),
        (("plan", "--model", "llama3-70b", "--gpus", "H1000"), "unknown GPU 'H1000'"),
        (("plan", "--model", "lama3-70b", "--gpus", "H100"), "unknown model 'lama3-70b'"),
        (("plan", "--model", "llama3-8b", "--gpus", "H100", "--price", "H100"), "GPU=USD_PER_GPU_HOUR"),
        (("plan", "--model", "llama3-8b", "--gpus", "H100", "--price", "H100=inf"), "'inf' is not a price"),
        (("plan", "--model", "llama3-8b", "--gpus", "H100", "--price", "H100=-1"), "'-1' is not a price"),
        (("plan", "--model", "llama3-8b", "--gpus", "H100", "--tp", "16"), "exceeds the 8 GPUs"),
        (("plan", "--model", "llama3-8b", "--qps", "5", "--concurrency", "8"), "not both"),
        (("plan", "--model", "llama3-8b", "--input-len", "100"), "go with --quick"),
        (("plan", "--model", "llama3-8b", "--concurrency", "8", "--arrival", "trace"), "drop --arrival"),
        (("plan", "--model", "llama3-8b", "--address", "auto"), "use it with --executor ray"),
        (("plan", "--model", "llama3-8b", "--workload", "nonsense"), "unknown workload 'nonsense'"),
        (("plan", "--model", "llama3-8b", "--quick", "--pp", "16"), "PP=16 exceeds the 8 GPUs of one H100-SXM node; use PP ≤ 8"),
        (("plan", "--model", "llama3-8b", "--quick", "--qps", "3", "--ttft-p90", "500"),
         "--quick estimates without traffic, so --qps, --ttft-p90 would be ignored"),
        (("plan", "--model", "llama3-8b", "--quick", "--input-len", "100000"), "exceed llama3-8b's context of 8,192"),
        (("plan", "--model", "llama3-8b", "--workload", "fixed:9000:100", "-n", "3"),
         "3 of 3 requests (up to 9,100 prompt + output tokens) exceed llama3-8b's context"),
        (("simulate", "--model", "llama3-8b", "--goodput", "ttft_ms=0"), "must be a positive number"),
        (("simulate", "--model", "llama3-8b", "--goodput", "ttft_ms=100,ttft_ms=200"), "given twice"),
        (("simulate", "--model", "llama3-8b", "--cv", "2"), "applies to gamma arrivals, not trace"),
        (("latency", "--model", "llama3-8b", "--input-len", "100000"), "lower --input-len/--output-len"),
    ]
    for args, message in cases:
        result = run(*args)
        assert result.exit_code == 2, args
        assert message in result.output and "Traceback" not in result.output, (args, result.output)
        assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(("args", "message"), [
    (("plan", "--model", "llama3-8b", "--qps", "inf"), "'inf' is not a positive finite number"),
    (("plan", "--model", "llama3-8b", "--ttft-p90", "nan"), "'nan' is not a positive finite number"),
    (("simulate", "--model", "llama3-8b", "--seed", "-1"), "0<=x<=4294967295"),
    (("simulate", "--model", "llama3-8b", "--trace", "no-such-folder/t.json"), "'no-such-folder' does not exist"),
    (("workload", "fixed:1024:128", "--qps", "1", "--out", ""), "needs a file name"),
])
def test_bad_option_values_are_refused_before_any_work(args, message):
    result = run(*args)
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output


def test_quick_prints_every_gpu_with_numbers_and_the_estimator_label():
    result = run("plan", "--model", "llama3-70b", "--tp", "4", "--pp", "1", "--gpus", "H100,H20", "--quick",
                 "--estimator", "roofline")
    assert result.exit_code == 0, result.output
    assert "estimator: roofline" in result.output and "quick estimate" in result.output
    lines = [line for line in result.output.splitlines() if line.startswith(("H100-SXM ", "H20 ")) and "TP4" in line]
    assert len(lines) == 2 and all("yes" in line for line in lines)


def test_quick_json_is_consistent_with_cost_arithmetic():
    result = run("plan", "--model", "llama3-70b", "--tp", "4", "--pp", "1", "--gpus", "H100,H20", "--quick", "--json",
                 "--estimator", "roofline")
    payload = json.loads(result.output)
    assert payload["estimator"] == "roofline"
    by_gpu = {o["gpu"]: o for o in payload["options"]}
    h100, h20 = by_gpu["H100-SXM"], by_gpu["H20"]
    for option in (h100, h20):
        assert option["fits"] and option["ttft_ms"] > 0 and option["tpot_loaded_ms"] >= option["tpot_batch1_ms"]
        tokens_per_hour = option["output_tokens_per_s_per_gpu"] * option["num_gpus"] * 3600
        assert option["usd_per_million_output_tokens"] * tokens_per_hour / 1e6 == pytest.approx(option["usd_per_hour"])
    # The H20 has more DRAM bandwidth but a quarter of the H100's Tensor throughput.
    assert h20["tpot_batch1_ms"] < h100["tpot_batch1_ms"]
    assert h20["ttft_ms"] > 3 * h100["ttft_ms"]


def test_quick_searches_layouts_left_open_and_says_what_does_not_fit():
    result = run("plan", "--model", "llama3-8b", "--gpus", "H100,L40S,A100", "--tp", "1", "--quick", "--csv")
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert [(r["gpu"], r["layout"]) for r in rows][:2] == [("H100-SXM", "TP1"), ("H100-SXM", "TP1xPP2")]
    misfit = run("plan", "--model", "llama3-70b", "--tp", "1", "--pp", "1", "--gpus", "H100", "--quick")
    assert misfit.exit_code == 2 and "does not fit" in misfit.output and "131.4 GiB" in misfit.output


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


def test_a_short_run_warns_that_the_capacity_may_be_understated_and_names_an_n_that_works():
    import json

    from click.testing import CliRunner

    from servesim.cli import main

    args = ["plan", "--model", "llama3-8b", "--gpus", "H100", "--tp", "1", "--pp", "1", "--workload", "fixed:512:64"]
    short = CliRunner().invoke(main, [*args, "-n", "100"])
    assert short.exit_code == 0, short.output
    (warning,) = [line for line in short.output.splitlines() if "may be understated" in line]
    assert warning.startswith("H100-SXM TP1: 100 requests (a run of ") and warning.endswith("use -n 1000 or more")
    (option,) = json.loads(CliRunner().invoke(main, [*args, "-n", "100", "--json"]).output)["options"]
    assert option["sample_warning"] == warning.removeprefix("H100-SXM TP1: ")
    enough = json.loads(CliRunner().invoke(main, [*args, "-n", "1000", "--json"]).output)["options"]
    assert enough[0]["sample_warning"] is None  # the suggestion works


@pytest.mark.parametrize("command", [
    ("plan", "--model", "llama3-8b", "--gpus", "H100", "--tp", "1", "--pp", "1", "--jobs", "1"),
    ("plan", "--model", "llama3-8b", "--gpus", "H100", "--tp", "1", "--pp", "1", "--jobs", "1", "--concurrency", "4"),
    ("simulate", "--model", "llama3-8b", "--qps", "2", "--arrival", "gamma", "--cv", "2"),
])
def test_the_command_suggested_for_requests_past_the_context_writes_a_workload_that_runs(command, tmp_path,
                                                                                        monkeypatch):
    """A workload with requests past the model's context is refused with a ``servesim workload`` command that, run as
    given, writes the same requests capped to fit, which the refused command then accepts."""
    monkeypatch.chdir(tmp_path)
    workload = ("--workload", "uniform:2000-9000:16-64", "-n", "40", "--seed", "5")
    refused = run(*command, *workload)
    assert refused.exit_code == 2 and "exceed llama3-8b's context of 8,192" in refused.output, refused.output
    suggested, file = re.search(r"\((servesim workload .*?), then --workload (\S+)\)", refused.output).groups()
    written = run(*suggested.split()[1:])
    assert written.exit_code == 0, written.output
    capped = list(csv.DictReader(open(file)))
    assert len(capped) == 40
    assert max(int(r["prompt_tokens"]) + int(r["output_tokens"]) for r in capped) <= 8192
    accepted = run(*command, "--workload", file, "--json")
    assert accepted.exit_code == 0, accepted.output
