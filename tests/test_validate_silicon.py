"""silicon_sample rows become simulation setups (or are skipped with a reason), replay end to end, and the
overhead calibration's linear predictions match a re-simulation."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest
from click.testing import CliRunner

pytest.importorskip("aiconfigurator_core")

from servesim.cli import main  # noqa: E402
from servesim.validate.calibration import calibrate, calibration_frame, predict_with, zero_step_overhead  # noqa: E402
from servesim.validate.replay import ServingCase, Skipped, StepModels, preset_for, replay  # noqa: E402
from servesim.validate.silicon import load_silicon_rows, silicon_case, silicon_cases  # noqa: E402

# A short SGLang run (Qwen3-32B, TP 8, 1024 in, 128 out, 16 clients) and a vLLM 0.12.0 one, which schedules
# synchronously (TP 2, 8 clients).
SGLANG_ROW = "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_sglang_agg_1024x128_c16_tp8_epnone_3"
VLLM_SYNC_ROW = "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_vllm_agg_1024x128_c8_tp2_epnone_1"


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    return load_silicon_rows()


def _row(rows: pd.DataFrame, row_id: str) -> dict:
    return rows[rows["id"] == row_id].iloc[0].to_dict()


def test_selection_is_aggregated_vllm_and_sglang_on_every_gpu(rows: pd.DataFrame) -> None:
    assert set(rows["mode"]) == {"aggregated"}
    assert set(rows["gpu"]) == {"H100-SXM", "H200", "B200", "B300", "GB200"}
    assert set(rows["backend"]) == {"vllm", "sglang"}


def test_row_maps_to_its_setup(rows: pd.DataFrame) -> None:
    case = silicon_case(_row(rows, SGLANG_ROW))
    assert isinstance(case, ServingCase)
    assert (case.preset, case.gpu, case.engine, case.tp, case.pp, case.dtype) == (
        "qwen3-32b", "H100-SXM", "sglang", 8, 1, "bf16")
    # aiconfigurator's collection: fixed lengths, a closed loop of 16 clients, 10 requests each.
    assert case.concurrency == 16 and case.workload.concurrency == 16
    assert case.kv_cache_dtype == "auto" and case.max_num_seqs is None
    assert len(case.workload) == 160
    assert set(case.workload.prompt_tokens) == {1024} and set(case.workload.output_tokens) == {128}


def test_inferencex_rows_draw_lengths_like_its_benchmark(rows: pd.DataFrame) -> None:
    inferencex = rows["source"].str.startswith("source_file=2026-04-06.csv")
    llama_h100 = (rows["model"] == "meta-llama/Llama-3.1-70B") & (rows["gpu"] == "H100-SXM")
    row = rows[inferencex & llama_h100].iloc[0].to_dict()
    case = silicon_case(row)
    assert case.dtype == "fp8" and case.preset == "llama3.1-70b"
    assert case.kv_cache_dtype == "fp8" and case.max_num_seqs == row["concurrency"]  # its launch scripts' flags
    prompt, output = case.workload.prompt_tokens, case.workload.output_tokens
    assert prompt.max() <= row["isl"] and prompt.min() >= int(0.8 * row["isl"])
    assert output.max() <= row["osl"] and output.min() >= int(0.8 * row["osl"])
    assert len(case.workload) == 10 * row["concurrency"]


@pytest.mark.parametrize(("model_id", "max_num_seqs_is_concurrency", "prefix_caching", "moe_backend"), [
    ("openai/gpt-oss-120b", True, False, "marlin"), ("MiniMaxAI/MiniMax-M2.5", False, None, "auto")])
def test_inferencex_rows_keep_their_own_launch_flags(rows: pd.DataFrame, model_id: str,
                                                     max_num_seqs_is_concurrency: bool,
                                                     prefix_caching: bool | None, moe_backend: str) -> None:
    # Their launch scripts pass no KV-cache dtype, unlike the Llama-3.1-70B ones, so the cache is the model's dtype;
    # gpt-oss's Hopper scripts export VLLM_MXFP4_USE_MARLIN=1.
    selected = rows[(rows["model"] == model_id) & (rows["gpu"] == "H200") & (rows["backend"] == "vllm")]
    case = silicon_case(selected.iloc[0].to_dict())
    assert case.kv_cache_dtype == "auto" and case.prefix_caching is prefix_caching
    assert (case.max_num_seqs == case.concurrency) is max_num_seqs_is_concurrency
    assert case.max_num_seqs is None or max_num_seqs_is_concurrency
    assert case.mxfp4_moe_backend == moe_backend


def test_unbuildable_rows_are_reported_with_a_reason(rows: pd.DataFrame) -> None:
    cases, skipped = silicon_cases(rows)
    assert len(cases) + len(skipped) == len(rows)
    assert all(isinstance(s, Skipped) and s.reason for s in skipped)
    # The three dense model families of the accuracy bar are all replayable, and GLM-5 (DeepSeek Sparse Attention).
    replayable = {c.preset for c in cases}
    assert {"llama3.1-8b", "llama3.1-70b", "qwen3-32b", "glm-5"} <= replayable


def test_runs_whose_client_ignored_the_nominal_concurrency_are_skipped(rows: pd.DataFrame) -> None:
    # InferenceX's gpt-oss H100 script gave its client 512 clients for every run for two weeks of 2025: those rows'
    # TPOT is that of a few requests at a time, and the server's cap is not recorded.
    gpt_oss_h100 = rows[(rows["model"] == "openai/gpt-oss-120b") & (rows["gpu"] == "H100-SXM")]
    outcomes = [silicon_case(row) for row in gpt_oss_h100.to_dict("records")]
    skipped = [o for o in outcomes if isinstance(o, Skipped)]
    assert skipped and all("4e135fd3f" in s.reason for s in skipped)
    assert {gpt_oss_h100.set_index("id").loc[s.case_id, "concurrency"] for s in skipped} == {512}
    assert any(isinstance(o, ServingCase) for o in outcomes)  # the later runs replay


def test_runs_the_file_does_not_tell_apart_are_skipped(rows: pd.DataFrame) -> None:
    # InferenceX ran DeepSeek-R1 on B200 with SGLang with and without MTP at once (2026-03-25): the file holds two
    # results of each such configuration, and copies of them from a later export, and not which ran speculative
    # decoding. All are left out; copies of one result, or runs at other times, are not.
    dsr1 = rows[(rows["model"] == "deepseek-ai/DeepSeek-R1") & (rows["gpu"] == "B200") & (rows["backend"] == "sglang")]
    cases, skipped = silicon_cases(dsr1)
    mixed = dsr1[dsr1["id"].isin({s.case_id for s in skipped if s.reason.startswith("another run")})]
    assert len(mixed) == 30 and (mixed["gemm_quant"] == "fp8").all() and (mixed["moe_ep"] == 1).all()
    assert (mixed["tpot_ms"].round(3).groupby([mixed["isl"], mixed["osl"], mixed["concurrency"]]).nunique() == 2).all()
    results = set(zip(mixed["ttft_ms"].round(3), mixed["tpot_ms"].round(3)))
    assert not [c for c in cases if (round(c.measured_ttft_ms, 3), round(c.measured_tpot_ms, 3)) in results]
    doubled = pd.concat([dsr1.iloc[:1], dsr1.iloc[:1].assign(id="copy")])
    assert not [s for s in silicon_cases(doubled, among=doubled)[1] if "MTP" in s.reason]
    # A row chosen alone (--row-id) is skipped as it is among the whole file.
    (alone,) = silicon_cases(dsr1[dsr1["id"] == mixed["id"].iloc[0]])[1]
    assert "MTP" in alone.reason


def _cases(rows: pd.DataFrame, model_id: str, gpu: str, backend: str = "vllm",
           gemm_quant: str | None = None) -> list[ServingCase]:
    """The replayed InferenceX runs of a model on a GPU and engine (of one GEMM quantisation when given)."""
    selected = rows[(rows["model"] == model_id) & (rows["gpu"] == gpu) & (rows["backend"] == backend)
                    & ~rows["source"].str.contains("aic-auto-gap-analysis")]
    if gemm_quant is not None:
        selected = selected[selected["gemm_quant"] == gemm_quant]
    return [c for c in map(silicon_case, selected.to_dict("records")) if isinstance(c, ServingCase)]


def test_runs_beyond_the_plain_configuration_beside_an_mtp_launch_are_skipped(rows: pd.DataFrame) -> None:
    # dsr1-fp8-b200-sglang ran TP 8 up to 64 clients (1k/1k, 1k/8k) and 4 (8k/1k); its MTP launch, on the same image
    # and layout, up to 512: the rows beyond are the MTP launch's, in the export of the day and a later copy.
    dsr1 = rows[(rows["model"] == "deepseek-ai/DeepSeek-R1") & (rows["gpu"] == "B200") & (rows["backend"] == "sglang")]
    cases, skipped = silicon_cases(dsr1)
    mtp = dsr1[dsr1["id"].isin({s.case_id for s in skipped if "MTP speculative decoding (its" in s.reason})]
    assert len(mtp) == 26 and set(zip(mtp["tp"], mtp["moe_ep"], mtp["gemm_quant"])) == {(8, 1, "fp8")}
    limit = {(1024, 1024): 64, (1024, 8192): 64, (8192, 1024): 4}
    assert all(c > limit[(i, o)] for i, o, c in zip(mtp["isl"], mtp["osl"], mtp["concurrency"]))
    assert not [c for c in cases if c.tp == 8 and c.concurrency > limit.get((c.isl, c.osl), 512)
                and "v0.5.9-cu130" in c.source and c.dtype == "fp8"]


def test_deepseek_nvfp4_b200_sglang_runs_of_2025_spread_the_experts_over_tp(rows: pd.DataFrame) -> None:
    # dsr1_fp4_b200_docker.sh (4b860b78e) passed --enable-ep-moe; the rows of its runs record EP 1 and no release.
    cases = _cases(rows, "deepseek-ai/DeepSeek-R1", "B200", "sglang", "nvfp4")
    old = [c for c in cases if not c.engine_version]
    assert old and all(c.ep == c.tp for c in old)


def test_deepseek_fp8_blackwell_tp4_runs_keep_the_memory_fraction_that_fits_them(rows: pd.DataFrame) -> None:
    # dsr1_fp8_b200.sh (64c20b6b5) passes --mem-fraction-static 0.95 at TP 4 (0.82 at TP 8, not followed): with
    # SGLang's default the weights leave no KV cache on four B200s, and the runs would not replay at all.
    selected = rows[(rows["model"] == "deepseek-ai/DeepSeek-R1") & (rows["gpu"] == "B200") & (rows["backend"] == "sglang")
                    & (rows["gemm_quant"] == "fp8") & (rows["tp"] == 4)]
    cases, skipped = silicon_cases(selected)
    assert cases and not skipped and all(c.memory_fraction == 0.95 for c in cases)


@pytest.mark.parametrize(("gpu", "quant", "kv"), [("B200", "nvfp4", "fp8"), ("H200", "fp8", "auto")])
def test_glm5_sglang_auto_kv_cache_follows_the_dsa_default_of_the_gpu(rows: pd.DataFrame, gpu: str, quant: str,
                                                                      kv: str) -> None:
    # Neither script passes a KV-cache dtype; SGLang serves a DSA model's "auto" cache in FP8 on compute capability
    # 10 and in BF16 on Hopper.
    cases = _cases(rows, "zhipuai/GLM-5", gpu, "sglang", quant)
    assert cases and all(c.kv_cache_dtype == kv for c in cases)


def test_qwen35_b300_runs_on_the_mtp_image_and_layout_are_skipped(rows: pd.DataFrame) -> None:
    qwen = rows[(rows["model"] == "Qwen/Qwen3.5-397B-A17B") & (rows["gpu"] == "B300") & (rows["backend"] == "sglang")]
    cases, skipped = silicon_cases(qwen)
    mtp = qwen[qwen["id"].isin({s.case_id for s in skipped if "MTP speculative decoding (its" in s.reason})]
    assert len(mtp) == 12 and set(zip(mtp["tp"], mtp["moe_ep"], mtp["backend_version"])) == {(4, 1, "0.5.9")}
    assert all(c.engine_version != "0.5.9" or (c.tp, c.ep) != (4, 1) for c in cases)


def test_runs_of_an_mtp_launch_and_their_copies_are_skipped(rows: pd.DataFrame) -> None:
    # InferenceX's Qwen3.5 FP8 B200 runs at TP 4 EP 1 on lmsysorg/sglang:v0.5.9-cu130 are its MTP launch; the plain
    # one ran TP 4 EP 4 and TP 8 on another image. Exports without the image keep copies of their results.
    qwen = rows[(rows["model"] == "Qwen/Qwen3.5-397B-A17B") & (rows["gpu"] == "B200") & (rows["backend"] == "sglang")]
    cases, skipped = silicon_cases(qwen)
    mtp = qwen[qwen["id"].isin({s.case_id for s in skipped if "MTP speculative decoding (its" in s.reason})]
    assert len(mtp) == 63 and set(zip(mtp["tp"], mtp["moe_ep"])) == {(4, 1)}
    assert (~mtp["source"].str.contains("image=")).sum() == 21  # the copies
    assert {(c.tp, c.ep) for c in cases if c.dtype == "fp8-block"} == {(4, 4), (8, 1)}


def test_minimax_runs_keep_the_expert_parallelism_their_script_passed(rows: pd.DataFrame) -> None:
    # The H200 script passed --enable-expert-parallel for every run from 2026-03-13 (its TP 8 runs), not before.
    h200 = rows[(rows["model"] == "MiniMaxAI/MiniMax-M2.5") & (rows["gpu"] == "H200")]
    cases = [silicon_case(row) for row in h200.to_dict("records")]
    assert {c.ep == c.tp for c in cases if c.tp == 8} == {True}
    assert {c.ep for c in cases if c.tp == 4} == {1}


def test_minimax_vllm_0_19_runs_replay_the_trtllm_moe_that_release_picked(rows: pd.DataFrame) -> None:
    blackwell = rows[(rows["model"] == "MiniMaxAI/MiniMax-M2.5") & rows["gpu"].isin(["B200", "B300"])]
    cases = [c for c in map(silicon_case, blackwell.to_dict("records"))
             if isinstance(c, ServingCase) and c.dtype.startswith("fp8")]
    by_version = {c.engine_version[:4]: set() for c in cases}
    for c in cases:
        by_version[c.engine_version[:4]].add(c.moe_backend)
    assert by_version["0.19"] == {"flashinfer-trtllm"} and by_version["0.17"] == {"auto"}


def test_inferencex_rows_pay_the_api_server_for_their_random_token_prompts(rows: pd.DataFrame) -> None:
    # InferenceX's runs, vLLM's and SGLang's, carry the tokenising cost of its random-token prompt text; the
    # aiconfigurator collection's and a release keep none.
    cases, _ = silicon_cases(rows)
    costs: dict[tuple, set] = {}
    for c in cases:
        costs.setdefault((c.extra["protocol"], c.engine), set()).add(c.per_prompt_token_us)
    assert costs[("InferenceX", "vllm")] == costs[("InferenceX", "sglang")] == {6.0}
    assert costs[("aiconfigurator", "vllm")] == costs[("aiconfigurator", "sglang")] == {None}
    llama = next(c for c in cases if c.engine == "vllm" and c.extra["protocol"] == "InferenceX")
    models = StepModels("roofline")
    assert models.get(llama).overhead.per_prompt_token_us == 6.0
    assert models.get(replace(llama, per_prompt_token_us=None)).overhead.per_prompt_token_us == 0.0


def test_runs_replay_the_release_they_were_measured_on() -> None:
    from servesim.validate.replay import case_release

    def release(version: str) -> str:
        return case_release(ServingCase("id", "m", "llama3-8b", "H100-SXM", "vllm", version, "bf16", 1, 1, 8, 8, 1,
                                        None, 1.0, 1.0))

    assert release("0.12.0") == "vllm==0.12.0" and release("0.13.1") == "vllm==0.12.0"
    assert release("0.10.2") == "vllm==0.11.0"  # older than every modelled release: the oldest
    # Unrecorded, or a nightly build (newer than every release): the newest.
    assert release("") == release("nightly-5b8c30d62b754b57") == release("0.19.0") == "vllm==0.15.1"


def test_checkpoint_ids_map_to_the_architecture_preset() -> None:
    assert preset_for("nvidia/Llama-3.1-8B-Instruct-FP8") == "llama3.1-8b"
    assert preset_for("meta-llama/Llama-3.1-70B") == "llama3.1-70b"
    assert preset_for("Qwen/Qwen3-32B") == "qwen3-32b"
    assert preset_for("moonshotai/Kimi-K2.5") == "kimi-k2.5"
    assert preset_for("zhipuai/GLM-5") == "glm-5"


def test_calibration_predictions_equal_a_resimulation(rows: pd.DataFrame) -> None:
    """Exact for a synchronous engine: a step lasts its host time plus its GPU time."""
    case = silicon_case(_row(rows, VLLM_SYNC_ROW))
    frame, skipped = calibration_frame([case], "roofline")
    assert not skipped
    predicted = predict_with(frame, step_us=300.0, per_seq_us=4.0).iloc[0]
    overhead = replace(zero_step_overhead("vllm"), step_us=300.0, per_seq_us=4.0)
    (simulated,), _ = replay([case], "roofline", overheads={"vllm": overhead})
    assert predicted["predicted_ttft_ms"] == pytest.approx(simulated["predicted_ttft_ms"], rel=1e-9)
    assert predicted["predicted_tpot_ms"] == pytest.approx(simulated["predicted_tpot_ms"], rel=1e-9)
    # More overhead never makes a run faster.
    assert (frame[["ttft_ms_per_step_us", "ttft_ms_per_seq_us", "tpot_ms_per_step_us",
                   "tpot_ms_per_seq_us"]] > 0).all(axis=None)


def test_fit_recovers_constants_that_generated_the_measurements(rows: pd.DataFrame) -> None:
    case = silicon_case(_row(rows, SGLANG_ROW))
    base, _ = calibration_frame([case], "roofline")
    # Two synthetic "measurements" of different batch sizes generated with known constants.
    frame = pd.concat([base, base.assign(ttft_ms_per_seq_us=base["ttft_ms_per_seq_us"] * 3,
                                         tpot_ms_per_seq_us=base["tpot_ms_per_seq_us"] * 3)], ignore_index=True)
    truth = predict_with(frame, 180.0, 6.0)
    frame = frame.assign(measured_ttft_ms=truth["predicted_ttft_ms"], measured_tpot_ms=truth["predicted_tpot_ms"])
    result = calibrate(frame, pd.Series(True, index=frame.index), "all rows")
    assert result.overheads["sglang"].step_us == pytest.approx(180.0, rel=1e-6)
    assert result.overheads["sglang"].per_seq_us == pytest.approx(6.0, rel=1e-6)


def test_only_launches_known_to_run_attention_dp_replay_with_ranks(rows: pd.DataFrame) -> None:
    """InferenceX's exports label every expert-parallel vLLM run attention_dp = TP; its configuration 727 ran
    --data-parallel-size 2, its configuration 726 beside it --tensor-parallel-size 2 --enable-expert-parallel."""
    case = silicon_case(_row(rows, "minimaxm2_5_b300_vllm_fp4_agg_1024x1024_c1024_cfg727"))
    assert (case.tp, case.ep, case.dp) == (2, 2, 2)
    case = silicon_case(_row(rows, "minimaxm2_5_b300_vllm_fp4_agg_1024x1024_c128_cfg726"))
    assert (case.tp, case.ep, case.dp) == (2, 2, 1)


def test_replay_on_several_processes_gives_the_rows_of_one_process(rows: pd.DataFrame) -> None:
    """Rows and refusals come back in the order of the cases, equal to a replay in one process."""
    sglang, vllm = (silicon_case(_row(rows, row_id)) for row_id in (SGLANG_ROW, VLLM_SYNC_ROW))
    no_fit = replace(vllm, case_id="no-fit", preset="llama3.1-70b", tp=1)  # 140 GB of weights on one H100
    cases = [sglang, no_fit, vllm, replace(sglang, case_id="again")]
    serial = replay(cases, "roofline")
    parallel = replay(cases, "roofline", jobs=2)
    assert parallel == serial
    assert [row["case_id"] for row in parallel[0]] == [SGLANG_ROW, VLLM_SYNC_ROW, "again"]
    assert [s.case_id for s in parallel[1]] == ["no-fit"]


def test_cli_replays_one_row_end_to_end(tmp_path) -> None:
    plot = tmp_path / "scatter.png"
    result = CliRunner().invoke(main, ["validate", "silicon", "--row-id", SGLANG_ROW, "--estimator", "roofline",
                                       "--plot", str(plot), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    (row,) = payload["rows"]
    assert row["case_id"] == SGLANG_ROW and row["split"] == "train"
    assert row["measured_ttft_ms"] == pytest.approx(349.523, rel=1e-4)
    assert 0 < row["predicted_tpot_ms"] < 100
    assert payload["groups"][0]["rows"] == 1
    # A Qwen3-32B row: one of the models the bar is set on.
    assert payload["bar"] == [payload["overall"][0] | {"meets_bar": payload["bar"][0]["meets_bar"]}]
    assert plot.stat().st_size > 1000


def test_cli_rejects_an_unknown_row_id() -> None:
    result = CliRunner().invoke(main, ["validate", "silicon", "--row-id", "no-such-run"])
    assert result.exit_code == 2 and "no-such-run" in result.output


@pytest.mark.parametrize(("model_id", "gpu", "tp", "kv", "chunk"), [
    ("deepseek-ai/DeepSeek-R1", "H200", 8, "auto", 32768),  # dsr1_fp8_h200.sh passes no KV dtype
    ("deepseek-ai/DeepSeek-R1", "B200", 4, "fp8", 8192),
    ("Qwen/Qwen3.5-397B-A17B", "H200", 8, "fp8", 16384),
])
def test_inferencex_sglang_rows_follow_their_scripts(rows: pd.DataFrame, model_id: str, gpu: str, tp: int, kv: str,
                                                     chunk: int) -> None:
    selected = rows[(rows["model"] == model_id) & (rows["gpu"] == gpu) & (rows["backend"] == "sglang")
                    & (rows["tp"] == tp) & rows["gemm_quant"].isin(["fp8", "fp8_block"])
                    & ~rows["source"].str.contains("aic-auto-gap-analysis")]
    cases = [c for c in map(silicon_case, selected.to_dict("records")) if isinstance(c, ServingCase)]
    assert cases and all(c.kv_cache_dtype == kv and c.max_num_batched_tokens == chunk for c in cases)
    assert all(c.max_num_seqs == c.concurrency and not c.prefix_caching for c in cases)


def test_kimi_b200_vllm_rows_run_the_experts_over_tp_as_their_script_did(rows: pd.DataFrame) -> None:
    # kimik2.5_fp4_b200.sh never passes --enable-expert-parallel, though the configuration labels runs "ep: 4";
    # from 2026-04-20 (6c3acebfa) it passes an FP8 KV cache and a token budget of twice the prompt.
    cases = _cases(rows, "moonshotai/Kimi-K2.5", "B200")
    assert cases and all(c.ep == 1 for c in cases)
    april = [c for c in cases if "measured=2026-04-20" in c.source]
    assert april and all(c.kv_cache_dtype == "fp8" and c.max_num_batched_tokens == 2 * c.isl for c in april)
    assert all(c.max_num_batched_tokens is None for c in cases if c not in april)


def test_minimax_b200_nightly_rows_keep_the_default_token_budget(rows: pd.DataFrame) -> None:
    nightly = [c for c in _cases(rows, "MiniMaxAI/MiniMax-M2.5", "B200") if c.engine_version.startswith("nightly")]
    assert nightly and all(c.max_num_batched_tokens is None and c.kv_cache_dtype == "fp8" for c in nightly)


def test_blackwell_vllm_rows_graph_the_steps_their_scripts_captured(rows: pd.DataFrame) -> None:
    # --max-cudagraph-capture-size 2048 in minimaxm2.5_fp8_b200.sh from 2026-04-03 and the 0.19 MiniMax scripts,
    # kimik2.5_fp4_b200.sh from 2026-04-20; not in the earlier scripts nor the B200 NVFP4 nightly one.
    minimax = [*_cases(rows, "MiniMaxAI/MiniMax-M2.5", "B200"), *_cases(rows, "MiniMaxAI/MiniMax-M2.5", "B300")]
    kimi = _cases(rows, "moonshotai/Kimi-K2.5", "B200")
    captured = [c for c in minimax if c.engine_version.startswith("0.19")]
    captured += [c for c in kimi if "measured=2026-04-20" in c.source]
    assert captured and all(c.max_cudagraph_capture_size == 2048 for c in captured)
    others = [c for c in (*minimax, *kimi) if c not in captured and c.gpu == "B200"]
    assert others and all(c.max_cudagraph_capture_size is None for c in others)


def test_minimax_vllm_rows_keep_the_memory_fraction_their_scripts_passed(rows: pd.DataFrame) -> None:
    # --gpu-memory-utilization 0.95 in minimaxm2.5_fp8_h200.sh, the 0.17 B200 script and the B200 nightly one; the
    # 0.19 scripts leave vLLM's 0.9.
    cases = [*_cases(rows, "MiniMaxAI/MiniMax-M2.5", "H200"), *_cases(rows, "MiniMaxAI/MiniMax-M2.5", "B200")]
    assert cases and all(c.memory_fraction == (None if c.engine_version.startswith("0.19") else 0.95) for c in cases)


@pytest.mark.parametrize("gpu", ["B200", "H100-SXM", "H200"])
def test_gpt_oss_rows_of_2025_replay_the_scripts_of_then(rows: pd.DataFrame, gpu: str) -> None:
    # No FP8 KV cache before 2025-12-05 (25506e87c) nor Marlin MoE before 2026-01-02 (4e52ed4c6).
    cases = _cases(rows, "openai/gpt-oss-120b", gpu)
    old = [c for c in cases if "measured=2025-" in c.source]
    assert old and all(c.kv_cache_dtype == "auto" and c.mxfp4_moe_backend != "marlin" for c in old)
    assert any(c.mxfp4_moe_backend == "marlin" or c.kv_cache_dtype == "fp8" for c in cases if c not in old)


@pytest.mark.parametrize(("quant", "kv", "chunk", "interval_at_16"), [
    ("fp8", "fp8", 16384, 10),  # qwen3.5_fp8_b300.sh (c0f62a2ef), block-scaled checkpoint
    ("", "auto", 32768, 30),  # qwen3.5_bf16_b300.sh (32274d6c1): the B200 recipe
    ("nvfp4", "fp8", 32768, 30),  # qwen3.5_fp4_b300.sh (8acbd08b7)
])
def test_qwen35_b300_sglang_0_5_10_rows_follow_the_script_of_their_precision(rows: pd.DataFrame, quant: str, kv: str,
                                                                             chunk: int, interval_at_16: int) -> None:
    gemm_quant = rows["gemm_quant"].fillna("")
    selected = rows[(rows["model"] == "Qwen/Qwen3.5-397B-A17B") & (rows["gpu"] == "B300")
                    & (rows["backend"] == "sglang") & rows["backend_version"].astype(str).str.startswith("0.5.10")
                    & (gemm_quant == quant)]
    cases = [c for c in map(silicon_case, selected.to_dict("records")) if isinstance(c, ServingCase)]
    assert cases and all(c.kv_cache_dtype == kv and c.max_num_batched_tokens == chunk for c in cases)
    assert all(c.scheduler_recv_interval == (interval_at_16 if c.concurrency >= 16 else 10) for c in cases)


@pytest.mark.parametrize(("version", "kv", "budget_per_isl"), [("0.17.0", "auto", None), ("0.19.0", "fp8", 2)])
def test_minimax_b200_rows_follow_the_script_of_their_release(rows: pd.DataFrame, version: str, kv: str,
                                                               budget_per_isl: int | None) -> None:
    # minimaxm2.5_fp8_b200.sh left vLLM's defaults until 2026-04-03; from then (the 0.19 runs) it passes an FP8 KV
    # cache and a token budget of twice the prompt length.
    selected = rows[(rows["model"] == "MiniMaxAI/MiniMax-M2.5") & (rows["gpu"] == "B200")
                    & (rows["backend_version"] == version)]
    cases = [c for c in map(silicon_case, selected.to_dict("records")) if isinstance(c, ServingCase)]
    assert cases and all(c.kv_cache_dtype == kv for c in cases)
    assert all(c.max_num_batched_tokens == (budget_per_isl and budget_per_isl * c.isl) for c in cases)


def test_qwen35_fp8_rows_run_the_block_scaled_checkpoint(rows: pd.DataFrame) -> None:
    # InferenceX serves Qwen/Qwen3.5-397B-A17B-FP8, whose weights carry 128 x 128 block scales.
    selected = rows[(rows["model"] == "Qwen/Qwen3.5-397B-A17B") & (rows["gemm_quant"] == "fp8")]
    cases = [c for c in map(silicon_case, selected.to_dict("records")) if isinstance(c, ServingCase)]
    assert cases and {c.dtype for c in cases} == {"fp8-block"}
