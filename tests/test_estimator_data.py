"""Measured rows become the kernel objects the step model builds for the same work, with finite features."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.errors import ServesimError
from servesim.training.datasets import (
    collector_routing,
    SOURCES,
    DataOptions,
    harness_quantize_kernels,
    load_samples,
    prepare_frame,
    samples_from_frame,
    split_by_shape,
)
from servesim.estimator.roofline import RooflineEstimator
from servesim.features import kernel_features
from servesim.hardware import get_gpu
from servesim.kernels.types import AttentionDecode, AttentionPrefill, Quantize

VIDUR = Path("/work/shared/data/vidur")
needs_vidur = pytest.mark.skipif(not VIDUR.is_dir(), reason="Vidur's data is not in ../shared")

_IDS = {"backend_version": "x", "latency_us": 100.0, "source": "test"}


def _context_rows(rows: list[tuple]) -> pd.DataFrame:
    columns = ("gpu", "system", "backend", "kernel_source", "window_size")
    frame = pd.DataFrame([dict(zip(columns, r)) for r in rows]).assign(
        batch=2, seq_len=1024, prefix_len=0, num_heads=32, num_kv_heads=8, head_dim=128, dtype="bf16",
        kv_dtype="bf16", **_IDS)
    return frame


def test_attention_rows_take_the_engines_backend_page_size_and_layout():
    frame = _context_rows([
        ("H100-SXM", "h100_sxm", "vllm", "vllm_flash_attn_fa3", 0),
        ("B200", "b200_sxm", "sglang", "trtllm_mha", 0),
        ("L40S", "local", "torch", "flashinfer", 0),
        ("B200", "b200_sxm", "vllm", "vllm_flashinfer_trtllmprefill", 0),
        ("A100-SXM-80GB", "a100_sxm", "vllm", "vllm_flash_attn", 0),
        ("H100-SXM", "h100_sxm", "sglang", "triton", 0),
        ("H100-SXM", "h100_sxm", "vllm", "vllm_flash_attn_fa3", 128),
        ("B200", "b200_sxm", "vllm", "vllm_flashinfer_trtllmdecode", 0),
    ])
    prepared = prepare_frame("attn_prefill", frame)
    assert list(prepared.frame["attention_backend"]) == ["fa3", "trtllm_mha", "flashinfer", "flashinfer", "fa2"]
    assert list(prepared.frame["page_size"]) == [16, 64, 16, 16, 16]
    assert list(prepared.frame["kv_layout"]) == ["paged", "paged", "ragged", "paged", "paged"]
    assert sum(prepared.dropped.values()) == 3
    samples = samples_from_frame("attn_prefill", prepared.frame)
    first = samples.kernels[0]
    assert isinstance(first, AttentionPrefill) and first.query_lens == (1024, 1024) and first.backend == "fa3"
    assert np.isfinite(samples.features.values).all() and (samples.theoretical_us > 0).all()
    # Our own collections are reported as their own rows.
    assert list(samples.group) == ["H100-SXM", "B200", "L40S (local)", "B200", "A100-SXM-80GB"]


def test_an_unknown_attention_kernel_source_is_an_error_not_a_silent_drop():
    frame = _context_rows([("H100-SXM", "local", "vllm", "my_new_kernel", 0)])
    with pytest.raises(ServesimError, match="my_new_kernel"):
        prepare_frame("attn_prefill", frame)


def test_measured_decode_rows_featurize_with_sane_efficiency():
    samples = load_samples("attn_decode", max_rows=300, seed=1)
    assert all(isinstance(k, AttentionDecode) for k in samples.kernels)
    assert np.isfinite(samples.features.values).all()
    assert len(set(samples.gpu)) >= 8
    # theoretical / measured stays within a few x of 1 once backends and page sizes are mapped right
    assert np.quantile(samples.efficiency, 0.99) < 8 and np.median(samples.efficiency) > 0.01
    # aiconfigurator times one attention kernel again and again: it runs from L2 exactly when its traffic fits.
    l2_bytes = np.array([get_gpu(g).l2_cache_bytes for g in samples.gpu])
    fits = np.array([k.bytes_moved() for k in samples.kernels]) <= l2_bytes
    assert 0 < fits.sum() < len(fits)
    assert [k.l2_resident_fraction for k in samples.kernels] == fits.astype(float).tolist()


@pytest.mark.parametrize("gpu, backend", [
    ("A100-SXM-80GB", "fa2"), ("A100-SXM-80GB", "flashinfer"), ("L40S", "fa2"), ("L40S", "flashinfer"),
    ("RTX-PRO-6000", "fa2"), ("RTX-PRO-6000", "flashinfer"), ("H100-SXM", "fa3"), ("B200", "flashinfer"),
    ("B200", "trtllm_mha"),
])
def test_attention_of_every_backend_and_head_layout_decomposes(gpu, backend):
    """Head sizes 64-256, GQA groups 1-96 and FP8 KV on the GPUs each backend runs on: the measured tables and
    the engines' models hold all of them."""
    spec = get_gpu(gpu)
    kernels = [
        cls(**lens, num_heads=heads, num_kv_heads=kv_heads, head_dim=d, backend=backend, kv_dtype=kv)
        for cls, lens in ((AttentionPrefill, {"query_lens": (300, 40), "kv_lens": (300, 40)}),
                          (AttentionDecode, {"kv_lens": (4096, 17)}))
        for heads, kv_heads in ((8, 8), (32, 4), (96, 1))
        for d in (64, 128, 256)
        for kv in ("bf16", "fp8")
    ]
    for category in ("attn_prefill", "attn_decode"):
        batch = [k for k in kernels if k.category == category]
        assert np.isfinite(kernel_features(batch, spec).values).all()


def test_trtllm_mha_is_decomposed_as_flashinfer():
    common = dict(kv_lens=(2048,) * 8, num_heads=32, num_kv_heads=8, head_dim=128, page_size=64)
    b200 = get_gpu("B200")
    trtllm = kernel_features([AttentionDecode(backend="trtllm_mha", **common)], b200).values
    flashinfer = kernel_features([AttentionDecode(backend="flashinfer", **common)], b200).values
    np.testing.assert_array_equal(trtllm, flashinfer)


def _fp8_rows() -> pd.DataFrame:
    rows = [("H100-SXM", "vllm", "CutlassFP8ScaledMMLinearKernel", "tensor", 40.0),
            ("H100-SXM", "vllm", "DeepGemmFp8BlockScaledMMKernel", "block", 90.0),
            ("H100-SXM", "sglang", "sglang_deepgemm_gemm_nt_f8f8bf16", "block", 1.0),
            ("H100-SXM", "sglang", "sglang_deepgemm_gemm_nt_f8f8bf16", "block", 2.3)]
    frame = pd.DataFrame(rows, columns=["gpu", "backend", "kernel_source", "scaling", "latency_us"])
    return frame.assign(system="h100_sxm", backend_version="x", m=512, n=4096, k=4096, dtype="fp8", source="t")


def test_scaled_mm_target_is_the_linear_time_less_the_quantize_kernel():
    prepared = prepare_frame("scaled_mm", _fp8_rows())
    assert list(prepared.frame["kernel_source"]) == ["CutlassFP8ScaledMMLinearKernel"]
    # One layer's buffers (26 MiB) fit in the H100's L2, so the loop's quantisation reads from there.
    warm = Quantize(rows=512, cols=4096, l2_resident_fraction=1.0)
    quant_us = RooflineEstimator().predict_us([warm], get_gpu("H100-SXM"))[0]
    assert prepared.frame["latency_us"].iloc[0] == pytest.approx(40.0 - quant_us)
    # Left out: the host-bound vLLM block path, and the rows whose quantisation (2 µs) leaves nothing (1 µs
    # measured) or under a fifth of the measured time (2.3 µs).
    assert sum(prepared.dropped.values()) == 3 and len(prepared.dropped) == 2


def test_measured_quantisation_finds_its_input_in_l2_when_the_timing_loop_leaves_it_there():
    """vLLM's collector passes one activation tensor to its six copies of the layer, so only one layer's buffers
    pass between two quantisations of it; SGLang's gives each copy its own, so six layers' do."""
    shapes = pd.DataFrame({"m": [512, 512, 8192], "n": 4096, "k": 4096, "scaling": "tensor",
                           "backend": ["vllm", "sglang", "vllm"], "library": ["cutlass", "sgl_kernel", "cutlass"],
                           "gpu": "H100-SXM", "system": "h100_sxm"})
    kernels = harness_quantize_kernels(shapes)
    # 26 MiB for one layer of m = 512 fits in the H100's 50 MiB L2; six of them, or one of m = 8192, do not.
    assert [q.l2_resident_fraction for q in kernels] == [1.0, 0.0, 0.0]
    h100 = get_gpu("H100-SXM")
    warm_us, cold_us = RooflineEstimator().predict_us([kernels[0], replace(kernels[0], l2_resident_fraction=0.0)],
                                                      h100)
    assert warm_us < cold_us


def test_vllm_per_tensor_quantisation_waits_on_its_unvectorised_loads_and_atomics():
    """vLLM's abs-max kernel loads one element per thread at a time and takes an atomic per row: on HBM GPUs it runs
    below the DRAM rate, so the roofline adds the wait; SGLang's vectorised kernels and per-group scales do not."""
    from servesim.estimator.roofline import SAME_ADDRESS_ATOMIC_CYCLES, stall_us

    b200, l40s = get_gpu("B200"), get_gpu("L40S")
    big = dict(rows=32768, cols=2048)
    vllm_us, sglang_us = RooflineEstimator().predict_us([Quantize(**big), Quantize(**big, engine="sglang")], b200)
    assert vllm_us > 2 * sglang_us
    assert stall_us(Quantize(**big, engine="sglang"), b200) == stall_us(Quantize(**big, group=128), b200) == 0.0
    # The L40S's GDDR is slower than its scalar loads: only the atomics remain.
    atomics_us = 32768 * SAME_ADDRESS_ATOMIC_CYCLES / l40s.clock_hz() * 1e6
    assert 0.0 < stall_us(Quantize(**big), l40s) == pytest.approx(atomics_us)


def test_scaled_mm_rows_carry_the_library_of_their_kernel_source():
    frame = pd.concat([_fp8_rows(), _fp8_rows().iloc[:1].assign(backend="sglang", latency_us=30.0,
                                                                    kernel_source="sglang_sgl_kernel_fp8_scaled_mm")])
    samples = samples_from_frame("scaled_mm", prepare_frame("scaled_mm", frame).frame)
    assert [k.library for k in samples.kernels] == ["cutlass", "sgl_kernel"]
    assert samples.features.column("library_cutlass").tolist() == [1.0, 0.0]
    assert samples.features.column("library_sgl_kernel").tolist() == [0.0, 1.0]
    unknown = _fp8_rows().iloc[:1].assign(kernel_source="SomeNewFp8Kernel")
    with pytest.raises(ServesimError, match="unknown FP8 kernel source.*SomeNewFp8Kernel"):
        prepare_frame("scaled_mm", unknown)


def test_measured_gemm_rows_find_in_l2_what_the_timing_loop_left_there():
    """aiconfigurator times six copies of a linear in turn: they run from L2 when all six fit, else cold."""
    frame = pd.concat([_fp8_rows().iloc[:1], _fp8_rows().iloc[:1].assign(m=8, n=1024, k=1024),
                       _fp8_rows().iloc[:1].assign(system="local")])
    kernels = samples_from_frame("scaled_mm", prepare_frame("scaled_mm", frame).frame).kernels
    l2_bytes = get_gpu("H100-SXM").l2_cache_bytes
    big, small, ours = kernels
    assert 6 * small.bytes_moved() <= l2_bytes < 6 * big.bytes_moved() and big.bytes_moved() < l2_bytes
    assert (big.l2_resident_fraction, small.l2_resident_fraction) == (0.0, 1.0)
    assert ours.l2_resident_fraction == 0.0  # our collector flushes L2 before every repetition
    gemm = samples_from_frame("gemm", prepare_frame("gemm", frame.assign(dtype="bf16")).frame).kernels
    assert [k.l2_resident_fraction for k in gemm] == [0.0, 1.0, 0.0]


def test_moe_rows_become_the_local_experts_share_of_balanced_routing():
    base = dict(gpu="H100-SXM", system="h100_sxm", backend="sglang", backend_version="x", num_tokens=32,
                hidden=2048, intermediate=1536, num_experts=64, topk=8, moe_tp=2, moe_ep=4, dtype="bf16",
                scaling="none", latency_us=50.0, source="t")
    frame = pd.DataFrame([
        {**base, "kernel_source": "sglang_fused_moe_triton", "distribution": "balanced"},
        {**base, "kernel_source": "sglang_fused_moe_triton", "distribution": "power_law_1.2"},
        {**base, "kernel_source": "sglang_flashinfer_cutlass_moe", "distribution": "balanced"},
    ])
    prepared = prepare_frame("moe", frame)
    (kernel,) = SOURCES["moe"].to_kernels(prepared.frame)
    assert (kernel.num_experts, kernel.intermediate, kernel.tokens) == (16, 768, 32)
    assert kernel.routed_pairs() == 32 * 8 // 4  # a quarter of the experts gets a quarter of the pairs
    assert sum(prepared.dropped.values()) == 2


def test_collector_routing_spreads_few_tokens_over_every_expert_parallel_rank():
    # 4 tokens x top-8 over 128 experts: stride 16, token i's choices are 4i + 16j, so rank 0 of EP 4 (experts
    # 0-31) gets 8 of the 32 pairs, one per expert, not all 32.
    local = collector_routing(4, 128, 8, 32)
    assert len(local) == 32 and local.sum() == 8 and set(local[local > 0]) == {1}
    assert list(np.flatnonzero(local)) == [0, 4, 8, 12, 16, 20, 24, 28]


@pytest.mark.parametrize("tokens", [1, 2, 3, 7, 16, 33, 256])
@pytest.mark.parametrize("experts,top_k", [(8, 2), (64, 8), (128, 8), (160, 6), (256, 8), (512, 22)])
def test_collector_routing_places_every_pair_and_shares_them_between_ranks(tokens, experts, top_k):
    assert collector_routing(tokens, experts, top_k, experts).sum() == tokens * top_k  # EP 1: every pair is local
    for ep in (2, 4, 8):
        if experts % ep == 0 and tokens * top_k >= experts:  # every expert chosen: rank 0 gets about its share
            share = collector_routing(tokens, experts, top_k, experts // ep).sum()
            assert abs(share - tokens * top_k / ep) <= 0.05 * tokens * top_k / ep + top_k


@needs_vidur
def test_elementwise_categories_read_vidur_and_check_collection_columns():
    options = DataOptions(vidur_root=VIDUR)
    for category in ("rmsnorm", "silu_mul", "rope"):
        samples = load_samples(category, max_rows=200, seed=0, options=options)
        assert set(samples.gpu) == {"A100-SXM-80GB", "H100-SXM"}
        assert np.isfinite(samples.features.values).all() and (samples.efficiency > 0).all()
    local = pd.DataFrame({"gpu": ["H100-SXM"], "system": ["local"], "backend": ["vllm"], "kernel_source": ["k"],
                          "num_tokens": [64], "hidden": [4096], "dtype": ["bf16"], "latency_us": [5.0]})
    assert len(prepare_frame("rmsnorm", local).frame) == 1
    with pytest.raises(ServesimError, match="num_heads"):
        prepare_frame("rope", local)


def test_a_missing_vidur_folder_is_a_one_line_error(tmp_path):
    result = CliRunner().invoke(main, ["eval", "efficiency", "--category", "rope", "--vidur-root",
                                       str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    assert result.output.startswith("error: Vidur data folder") and result.output.count("\n") == 1


@needs_vidur
def test_train_and_efficiency_commands_on_a_small_category(tmp_path):
    pytest.importorskip("torch")
    runner = CliRunner()
    out = tmp_path / "rope.npz"
    result = runner.invoke(main, ["train", "--category", "rope", "--max-rows", "400", "--vidur-root", str(VIDUR),
                                  "--max-epochs", "2", "--patience-epochs", "5", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert out.exists() and "training rows, 2 epochs" in result.output and " s in all" in result.output
    from servesim.estimator.mlp import load_weights

    metadata = load_weights(out).metadata
    assert (metadata["patience_epochs"], metadata["lr_patience_epochs"]) == ("5", "3")  # set, and the default
    result = runner.invoke(main, ["eval", "efficiency", "--category", "rope", "--max-rows", "400", "--vidur-root",
                                  str(VIDUR), "--csv"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(pd.io.common.StringIO(result.output))
    assert set(table["group"]) == {"A100-SXM-80GB", "H100-SXM"} and (table["p50"] > 0).all()


@needs_vidur
def test_eval_kernels_scores_five_predictors_on_seen_and_left_out_gpus():
    pytest.importorskip("torch")
    result = CliRunner().invoke(main, ["eval", "kernels", "--category", "rope", "--max-rows", "1500", "--vidur-root",
                                       str(VIDUR), "--holdout", "H100", "--csv"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(pd.io.common.StringIO(result.output))
    assert list(table.columns[-5:]) == ["roofline", "linear", "neusight", "habitat", "mlp"]
    assert set(zip(table["set"], table["gpu"])) == {
        ("seen GPU, held-out shapes", "A100-SXM-80GB"), ("seen GPU, held-out shapes", "H100-SXM"),
        ("seen GPU, held-out shapes", "all"), ("unseen GPU", "H100-SXM")}
    assert (table[["roofline", "linear", "neusight", "habitat", "mlp"]] > 0).all().all()
    # --max-epochs bounds the retrainings only: the seen rows use the shipped weights either way.
    short = CliRunner().invoke(main, ["eval", "kernels", "--category", "rope", "--max-rows", "1500", "--vidur-root",
                                      str(VIDUR), "--holdout", "H100", "--max-epochs", "1", "--csv"])
    assert short.exit_code == 0, short.output
    short_table = pd.read_csv(pd.io.common.StringIO(short.output))
    seen = table["set"] != "unseen GPU"
    pd.testing.assert_frame_equal(short_table[seen], table[seen])
    assert short_table.loc[~seen, "mlp"].item() != table.loc[~seen, "mlp"].item()


@needs_vidur
def test_eval_kernels_scores_seen_gpus_on_shapes_the_shipped_weights_never_trained_on_whatever_the_seed():
    """Another --seed draws another sample, but the seen rows must stay the shipped weights' own test shapes: the
    test split of seed 1 is mostly shapes trained on under seed 0."""
    from servesim.estimator.mlp import shipped_weights

    trained_seed = int(shipped_weights()["rope"].metadata["seed"])
    samples = load_samples("rope", max_rows=1500, seed=trained_seed + 1, options=DataOptions(vidur_root=VIDUR))
    never_seen = split_by_shape(samples.shape_id, trained_seed).test
    other_split = split_by_shape(samples.shape_id, trained_seed + 1).test
    assert never_seen.sum() != other_split.sum()
    result = CliRunner().invoke(main, ["eval", "kernels", "--category", "rope", "--max-rows", "1500", "--vidur-root",
                                       str(VIDUR), "--seed", str(trained_seed + 1), "--csv"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(pd.io.common.StringIO(result.output))
    assert table.loc[table["gpu"] == "all", "rows"].item() == never_seen.sum()


def _local_collection(directory: Path) -> Path:
    """A collection written through the collector's own writers: a scaled MM, a prefill and an RMSNorm row."""
    from servesim.collect import CATEGORIES
    from servesim.collect.run import Device, open_manifest
    from servesim.collect.schema import make_shape
    from servesim.collect.store import append_rows, source_name, write_manifest

    device = Device("cuda", "NVIDIA H100 80GB HBM3", get_gpu("H100-SXM"), "device name", "9.0", "2.13.0", "12.8")
    directory.mkdir(parents=True)
    write_manifest(directory, open_manifest(directory, device, record_launches=False))
    rows = {
        "scaled_mm": (make_shape("scaled_mm", m=16, n=4096, k=4096), "torch_scaled_mm", 8.25),
        "context_attention": (make_shape("context_attention", batch=1, seq_len=1024, prefix_len=0, num_heads=32,
                                         num_kv_heads=8, head_dim=128, window_size=0), "sdpa_flash", 40.0),
        "rmsnorm": (make_shape("rmsnorm", num_tokens=64, hidden=4096), "torch_rmsnorm_inductor", 4.5),
    }
    for category, (shape, kernel_source, latency_us) in rows.items():
        schema = CATEGORIES[category]
        row = {"gpu": device.label, "system": "local", "backend": "torch", "backend_version": "2.13.0",
               "kernel_source": kernel_source, **shape.as_dict(), "latency_us": latency_us,
               "source": source_name(directory), "latency_p10_us": latency_us, "latency_p90_us": latency_us,
               "repetitions": 10}
        append_rows(directory / schema.file, schema.file_columns, [row])
    return directory


def test_our_own_collections_map_through_the_collectors_implementations(tmp_path):
    from servesim.collect import load_collection

    directory = _local_collection(tmp_path / "h100")
    mm = prepare_frame("scaled_mm", load_collection(directory, "scaled_mm")).frame
    assert list(mm["latency_us"]) == [8.25]  # the collector times the scaled MM alone: nothing subtracted
    prefill = prepare_frame("attn_prefill", load_collection(directory, "context_attention").assign(system="local"))
    row = prefill.frame.iloc[0]
    assert (row["attention_backend"], row["kv_layout"]) == ("fa2", "ragged")
    samples = samples_from_frame("attn_prefill", prefill.frame)
    assert list(samples.group) == ["H100-SXM (local)"] and np.isfinite(samples.features.values).all()


@needs_vidur
def test_extra_data_adds_local_rows_to_a_category(tmp_path):
    from servesim.training.datasets import read_rows

    options = DataOptions(vidur_root=VIDUR, extra_data=_local_collection(tmp_path / "h100"))
    frame = read_rows("rmsnorm", options)
    local = frame[frame["system"] == "local"]
    assert len(local) == 1 and local["kernel_source"].iloc[0] == "torch_rmsnorm_inductor"
    assert len(frame) > 1000  # Vidur's rows stay


def test_the_category_help_names_every_category_with_data():
    help_text = " ".join(CliRunner().invoke(main, ["train", "--help"]).output.split())
    for category in SOURCES:
        assert category in help_text


@pytest.mark.parametrize("command", [["train"], ["eval", "kernels"], ["eval", "efficiency"]])
def test_an_unknown_category_is_refused_with_the_nearest_name_before_any_work(command):
    result = CliRunner().invoke(main, [*command, "--category", "atn_decode"])
    assert result.exit_code == 2 and "Did you mean attn_decode" in result.output


@needs_vidur
def test_holding_out_a_gpu_the_category_never_measured_is_an_error_not_an_empty_table():
    result = CliRunner().invoke(main, ["eval", "kernels", "--category", "rope", "--max-rows", "500", "--vidur-root",
                                       str(VIDUR), "--holdout", "H100", "--holdout", "L20"])
    assert result.exit_code == 2
    assert "--holdout L20: no rope rows measured on it" in result.output and "Traceback" not in result.output
    assert "A100-SXM-80GB, H100-SXM" in result.output
