"""Behaviour of the communication model that step times and the planner rely on."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from click.testing import CliRunner

from servesim.comm import allreduce_implementation, collective_time_us, topology_of
from servesim.comm.measurements import ENGINE_CODES, load_table, prediction_releases, release_number
from servesim.comm.systems import HARNESSES, MEASURED_SYSTEMS
from servesim.errors import ServesimError
from servesim.hardware import get_gpu
from servesim.training.comm_eval import seen_errors

MIB = 1024 * 1024
SIZES = 2.0 ** np.arange(8, 31)


@pytest.fixture(scope="module")
def h100():
    return get_gpu("H100")


def _variant(gpu, **changes):
    """A GPU that differs from ``gpu`` only in the given figures (stands in for catalogue entries)."""
    return dataclasses.replace(gpu, **changes)


@pytest.fixture(scope="module")
def h20(h100):
    # HGX H20: NVLink 900 GB/s bidirectional through NVSwitch, like H100; far fewer SMs. Never measured.
    return _variant(h100, name="H20-test", sm_count=78, memory_gib=96)


@pytest.fixture(scope="module")
def pcie_gpu(h100):
    # An L20/L40S-like PCIe Gen4 card without NVLink.
    return _variant(h100, name="L20-test", architecture="ada", nvlink_unidir_bandwidth_gbps=0, nvswitch=False,
                    pcie_gen=4, pcie_unidir_bandwidth_gbps=32)


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"])
def test_latency_grows_with_message_size(h100, op):
    times = collective_time_us(op, SIZES, 4 if op != "send_recv" else 2, h100)
    assert np.all(np.isfinite(times)) and np.all(times > 0)
    assert np.all(np.diff(times) >= 0)
    assert times[-1] > 20 * times[0]


@pytest.mark.parametrize("implementation", ["nccl", "custom_graph"])
def test_more_gpus_cost_more_for_large_all_reduce(h100, implementation):
    large = 256 * MIB
    # Measured H100 timings put 4 GPUs slightly above 8 at this size, so only the 2 -> 4 and 2 -> 8 steps are sure.
    two, four, eight = (collective_time_us("all_reduce", large, n, h100, implementation) for n in (2, 4, 8))
    assert two < four and two < eight


def test_custom_all_reduce_below_its_limit_nccl_above(h100):
    # vLLM: 8 GPUs on Hopper take the custom kernel below 256 KiB (CUSTOM_ALL_REDUCE_MAX_SIZES), SGLang below 8 MiB.
    choice = allreduce_implementation("vllm", h100, 8, np.array([64 * 1024, 4 * MIB]))
    assert list(choice) == ["custom_graph", "nccl"]
    assert allreduce_implementation("sglang", h100, 8, 4 * MIB) == "custom_graph"
    assert allreduce_implementation("sglang", h100, 8, 16 * MIB) == "nccl"
    assert allreduce_implementation("vllm", h100, 2, 1 * MIB, cuda_graph=False) == "custom_eager"


def test_pcie_only_gpu_never_gets_custom_all_reduce(pcie_gpu):
    for group_size in (2, 4, 8):
        assert set(allreduce_implementation("vllm", pcie_gpu, group_size, SIZES)) == {"nccl"}
        assert set(allreduce_implementation("sglang", pcie_gpu, group_size, SIZES)) == {"nccl"}
    with pytest.raises(ServesimError, match="NVLink"):
        collective_time_us("all_reduce", MIB, 4, pcie_gpu, implementation="custom_graph")


def test_pcie_server_keeps_most_of_its_bandwidth_beyond_a_pair(pcie_gpu):
    # The measured L40S server loses 16x of its bus bandwidth from 2 to 8 GPUs because its peer traffic crosses the
    # CPU root complex (servesim/comm/systems.py); a PCIe server known only by its spec sheet is not assumed to.
    message_bytes = 256 * MIB
    bus_gbps = {n: message_bytes * (n - 1) / n / collective_time_us("all_gather", message_bytes, n, pcie_gpu) / 1e3
                for n in (2, 8)}
    assert bus_gbps[8] > bus_gbps[2] / 4


def test_topology_from_the_spec_sheet(h100):
    a100 = get_gpu("A100-SXM-80GB")
    assert topology_of(h100, 8).nvlink_sharp and not topology_of(a100, 8).nvlink_sharp
    assert topology_of(get_gpu("GB200"), 4).domain_gpus == 72
    assert not any(topology_of(get_gpu(name), n).p2p_via_cpu for name in ("L40S", "H100") for n in (2, 4, 8))


def test_groups_spanning_servers_use_nccl(h100):
    assert allreduce_implementation("vllm", h100, 16, 1024) == "nccl"


def test_vllm_keeps_its_custom_all_reduce_to_one_host_of_an_nvl72_rack():
    # 8 GB200s span two compute trays (hosts) of one NVLink domain: vLLM's in_the_same_node_as check sends the
    # group to NCCL, SGLang's custom all-reduce v2 serves one NVLink clique across hosts.
    gb200 = get_gpu("GB200")
    assert topology_of(gb200, 4).hosts == 1 and topology_of(gb200, 8).hosts == 2
    assert allreduce_implementation("vllm", gb200, 4, 64 * 1024) == "custom_graph"
    assert allreduce_implementation("vllm", gb200, 8, 64 * 1024) == "nccl"
    assert allreduce_implementation("sglang", gb200, 8, 64 * 1024) == "custom_graph"
    with pytest.raises(ServesimError, match="one host"):
        collective_time_us("all_reduce", 64 * 1024, 8, gb200, implementation="custom_graph", engine="vllm")


def test_predictions_are_for_the_newest_release_measured_on_most_systems():
    # vLLM 0.27.0 was measured on the GB300 alone; a prediction for an unmeasured GPU uses 0.24.0, measured on six.
    table = load_table()
    vllm_releases = set(table.engine_release[table.engine == ENGINE_CODES.index("vllm")])
    assert release_number("0.27.0") in vllm_releases
    assert prediction_releases(table) == {"": 0.0, "vllm": release_number("0.24.0"), "sglang": release_number("0.5.14")}


def test_unmeasured_gpu_prediction_lies_between_bandwidth_bounds(h20):
    message_bytes = 16 * MIB
    time_us = collective_time_us("all_reduce", message_bytes, 4, h20, implementation="nccl")
    link_bytes_per_us = h20.nvlink_unidir_bandwidth_gbps * 1e3
    # No faster than a ring at full NVLink bandwidth; no slower than the same data through PCIe Gen3 (16 GB/s).
    ring_bytes = 2 * 3 / 4 * message_bytes
    assert ring_bytes / link_bytes_per_us < time_us < ring_bytes / 16e3
    assert np.isfinite(collective_time_us("all_reduce", SIZES, 4, h20)).all()


def test_capped_nvlink_is_slower_for_large_messages(h100):
    h800 = _variant(h100, name="H800-test", nvlink_unidir_bandwidth_gbps=200)
    assert collective_time_us("all_reduce", 256 * MIB, 8, h800, "nccl") > collective_time_us(
        "all_reduce", 256 * MIB, 8, h100, "nccl")


def test_seen_mape_under_the_bar():
    # One of the five folds `servesim eval comm` scores: 20% of the measured points held out, one fit.
    table = load_table()
    errors = seen_errors(table, folds=[0])
    kernel_timed = [i for i, name in enumerate(table.systems) if MEASURED_SYSTEMS[name].harness == HARNESSES[0]]
    assert np.nanmean(errors[np.isin(table.system, kernel_timed)]) <= 10.0


def test_bad_inputs_say_what_to_fix(h100):
    with pytest.raises(ServesimError, match="all_reduce"):
        collective_time_us("allreduse", 1024, 2, h100)
    with pytest.raises(ServesimError, match="at least 2"):
        collective_time_us("all_reduce", 1024, 1, h100)
    with pytest.raises(ServesimError, match="engine"):
        collective_time_us("all_reduce", 1024, 2, h100, engine="trt")


def _cli():
    from servesim.cli import main
    from servesim.cli.comm import COMMANDS

    for command in COMMANDS:
        if command.name not in main.commands:
            main.add_command(command)
    return main


def test_kernel_allreduce_prints_a_latency():
    result = CliRunner().invoke(_cli(), ["kernel", "allreduce", "--gpu", "H100", "--gpus", "4", "--bytes", "16MiB",
                                         "--json"])
    assert result.exit_code == 0, result.output
    import json

    row = json.loads(result.output)[0]
    assert row["implementation"] == "custom_graph" and 0.01 < row["latency_ms"] < 1.0


def test_kernel_allreduce_rejects_a_bad_size_in_one_line():
    result = CliRunner().invoke(_cli(), ["kernel", "allreduce", "--gpu", "H100", "--bytes", "16 parsecs"])
    assert result.exit_code == 2
    assert "16 parsecs" in result.output and len(result.output.strip().splitlines()) == 1


def test_curve_smoothing_is_the_least_squares_isotonic_fit():
    from sklearn.isotonic import isotonic_regression

    from servesim.comm.model import _isotonic_increasing

    rng = np.random.default_rng(0)
    for size in (1, 2, 7, 105):
        values = np.cumsum(rng.normal(0.05, 1.0, size))
        fitted = _isotonic_increasing(values)
        assert np.all(np.diff(fitted) >= 0)
        np.testing.assert_allclose(fitted, isotonic_regression(values, increasing=True))


def test_shipped_forests_match_the_table_and_a_refit() -> None:
    """comm_forests.npz is stamped with the shipped table's digest and predicts every training row as a fresh fit
    does (else rerun tools/fit_comm_forests.py). The trees themselves are compared only there: numpy's logarithms
    may differ in the last bit between CPUs, which moves a few split points and the predictions between rows."""
    from servesim.comm.model import FORESTS_FILE, MODEL_VERSION, default_model, training_arrays
    from servesim.training.comm_forest import fit_model

    table = load_table()
    with np.load(FORESTS_FILE) as data:
        assert (str(data["digest"]), str(data["model_version"])) == (table.digest, MODEL_VERSION)
    shipped, refit = default_model(), fit_model(table)
    assert shipped.forests.keys() == refit.forests.keys()
    for harness, (features, _) in training_arrays(table).items():
        np.testing.assert_allclose(shipped.forests[harness].predict(features), refit.forests[harness].predict(features),
                                   rtol=0, atol=1e-12, err_msg=harness)


def test_stale_forests_are_an_error_naming_the_tool(tmp_path) -> None:
    from servesim.comm.model import FORESTS_FILE, load_forests

    with np.load(FORESTS_FILE) as data:
        arrays = dict(data)
    arrays["digest"] = np.array("0" * 16)
    np.savez(tmp_path / "stale.npz", **arrays)
    with pytest.raises(ServesimError, match="tools/fit_comm_forests.py"):
        load_forests(tmp_path / "stale.npz", load_table())
    with pytest.raises(ServesimError, match="tools/fit_comm_forests.py"):
        load_forests(tmp_path / "missing.npz", load_table())


def test_cli_breakdowns_are_the_evaluations() -> None:
    from servesim.cli.comm import _BREAKDOWNS
    from servesim.training.comm_eval import BREAKDOWNS

    assert _BREAKDOWNS == BREAKDOWNS
