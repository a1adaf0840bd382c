"""The shipped GPU catalogue: every entry loads, every figure has a source, and the figures agree with datasheets."""

from __future__ import annotations

import re
from datetime import date

import pytest

from servesim.hardware.catalogue import _normalise, get_gpu, gpu_names, load_catalogue, missing_sources, parse_gpu_list
from servesim.hardware.spec import TENSOR_DTYPES

EXPECTED = [
    "A100-SXM-40GB", "A100-SXM-80GB", "A100-PCIe-80GB", "A10G", "A40", "L4", "L20", "L40", "L40S", "RTX-4090",
    "RTX-6000-Ada", "RTX-A6000", "H100-SXM", "H100-PCIe", "H800", "H20", "H200", "B200", "B300", "GB200", "GB300",
    "RTX-PRO-6000",
]
CATALOGUE = load_catalogue()
SPECS = list(CATALOGUE.values())
IDS = [s.name for s in SPECS]

CC_LIMITS = {  # CUDA guide, per compute capability: smem/SM KiB, smem/CTA KiB, threads, warps, CTAs
    "8.0": (164, 163, 2048, 64, 32),
    "8.6": (100, 99, 1536, 48, 16),
    "8.9": (100, 99, 1536, 48, 24),
    "9.0": (228, 227, 2048, 64, 32),
    "10.0": (228, 227, 2048, 64, 32),
    "10.3": (228, 227, 2048, 64, 32),
    "12.0": (100, 99, 1536, 48, 32),
}
ARCH_CC = {"ampere": {"8.0", "8.6"}, "ada": {"8.9"}, "hopper": {"9.0"}, "blackwell": {"10.0", "10.3", "12.0"}}


def test_catalogue_has_exactly_the_expected_gpus():
    assert sorted(gpu_names()) == sorted(EXPECTED)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_every_figure_has_a_source(spec):
    assert missing_sources(spec) == []
    assert all(isinstance(v, str) and v.strip() for v in spec.sources.values())


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_sources_name_no_placeholder(spec):
    for field, text in spec.sources.items():
        assert "placeholder" not in text.lower(), field
        assert "to be checked" not in text.lower(), field


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_figures_are_plausible(spec):
    assert spec.vendor == "NVIDIA"
    assert spec.compute_capability in ARCH_CC[spec.architecture]
    assert spec.form_factor in {"sxm", "pcie", "superchip"}
    assert 40 <= spec.sm_count <= 200
    assert 1000 <= spec.sustained_clock_mhz <= spec.boost_clock_mhz <= 3000
    assert spec.dram_bandwidth_gbps > 0
    assert spec.l2_bandwidth_gbps > spec.dram_bandwidth_gbps
    assert spec.l2_cache_mib > 0
    assert spec.pcie_unidir_bandwidth_gbps == {4: 32, 5: 64, 6: 128}[spec.pcie_gen]
    assert spec.nvlink_unidir_bandwidth_gbps >= 0
    if spec.nvswitch:
        assert spec.has_nvlink
    assert spec.gpus_per_node in (8, 72)
    assert spec.registers_per_sm == 65536
    assert spec.xu_ops_per_sm_per_cycle == (32 if spec.compute_capability == "10.3" else 16)
    assert spec.fma_flops_per_sm_per_cycle == (128 if spec.compute_capability == "8.0" else 256)
    assert set(spec.tensor_flops_per_sm_per_cycle) <= set(TENSOR_DTYPES)
    assert all(v > 0 for v in spec.tensor_flops_per_sm_per_cycle.values())
    assert {"bf16", "fp16", "int8", "tf32"} <= set(spec.tensor_flops_per_sm_per_cycle)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_occupancy_limits_follow_the_cuda_guide(spec):
    smem, cta_smem, threads, warps, ctas = CC_LIMITS[spec.compute_capability]
    assert (spec.smem_per_sm_kib, spec.max_smem_per_cta_kib) == (smem, cta_smem)
    assert (spec.max_threads_per_sm, spec.max_warps_per_sm, spec.max_ctas_per_sm) == (threads, warps, ctas)
    assert spec.max_warps_per_sm * 32 == spec.max_threads_per_sm


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_dtype_support_follows_the_architecture(spec):
    rates = spec.tensor_flops_per_sm_per_cycle
    assert ("fp8" in rates) == (spec.architecture in {"ada", "hopper", "blackwell"})
    assert ("fp4" in rates) == (spec.architecture == "blackwell")
    assert rates["bf16"] == rates["fp16"]
    assert rates["tf32"] == pytest.approx(rates["bf16"] / 2, rel=0.01)
    if "fp8" in rates:
        assert rates["fp8"] == pytest.approx(2 * rates["bf16"], rel=0.01)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_price_has_a_source_and_a_date(spec):
    assert spec.price_usd_per_gpu_hour > 0
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", spec.price_date)
    assert date(2025, 1, 1) <= date.fromisoformat(spec.price_date) <= date(2027, 1, 1)
    assert spec.sources["price_usd_per_gpu_hour"]


# Dense BF16 Tensor TFLOPS as NVIDIA's datasheets state them.
DATASHEET_BF16_DENSE = {
    "H100-SXM": 989,
    "H100-PCIe": 756,
    "H200": 989,
    "A100-SXM-80GB": 312,
    "A100-SXM-40GB": 312,
    "A100-PCIe-80GB": 312,
    "H20": 148,
    "L40S": 362,
    "L40": 181,
    "L4": 121,
    "RTX-6000-Ada": 364,
    "A40": 149.7,
    "B200": 2250,
    "GB200": 2500,
    "B300": 2250,
    "GB300": 2500,
}


@pytest.mark.parametrize("name,tflops", sorted(DATASHEET_BF16_DENSE.items()))
def test_derived_bf16_peak_matches_the_datasheet(name, tflops):
    assert get_gpu(name).tensor_tflops("bf16") == pytest.approx(tflops, rel=0.02)


@pytest.mark.parametrize(
    "name,dtype,tflops",
    [("H100-SXM", "fp8", 1979), ("B200", "fp4", 9000), ("GB300", "fp4", 15000), ("L40S", "fp8", 733), ("H20", "fp8", 296)],
)
def test_derived_low_precision_peaks(name, dtype, tflops):
    assert get_gpu(name).tensor_tflops(dtype) == pytest.approx(tflops, rel=0.02)


def test_h20_spot_checks():
    h20 = get_gpu("H20")
    assert h20.sm_count == 78
    assert h20.dram_bandwidth_gbps == pytest.approx(4000, rel=0.01)
    assert 88 <= h20.memory_gib <= 96  # 96 GB HBM3
    # The export cap shows as a per-SM Tensor rate far below the H100's.
    assert h20.tensor_flops_per_sm_per_cycle["bf16"] < 0.3 * get_gpu("H100").tensor_flops_per_sm_per_cycle["bf16"]
    assert h20.has_nvlink and h20.nvswitch


def test_h100_spot_checks():
    h100 = get_gpu("H100")
    assert h100.name == "H100-SXM"
    assert h100.sm_count == 132
    assert h100.dram_bandwidth_gbps == 3350
    assert h100.nvlink_unidir_bandwidth_gbps == 450


def test_other_spot_checks():
    assert get_gpu("H200").memory_gib > 130 and get_gpu("H200").dram_bandwidth_gbps == 4800
    assert get_gpu("H800").nvlink_unidir_bandwidth_gbps == 200
    assert get_gpu("A100").nvlink_unidir_bandwidth_gbps == 300
    assert get_gpu("B200").nvlink_unidir_bandwidth_gbps == 900
    assert get_gpu("GB200").gpus_per_node == 72 and get_gpu("GB300").gpus_per_node == 72
    for bridged in ("A40", "RTX-A6000", "A100-PCIe-80GB", "H100-PCIe"):
        spec = get_gpu(bridged)
        assert spec.has_nvlink and not spec.nvswitch
    for plain in ("L4", "L20", "L40", "L40S", "RTX-4090", "RTX-6000-Ada", "A10G", "RTX-PRO-6000"):
        assert not get_gpu(plain).has_nvlink


def test_aliases_are_unique_across_entries():
    seen: dict[str, str] = {}
    for spec in SPECS:
        for key in {_normalise(k) for k in (spec.name, *spec.aliases)}:
            assert key not in seen, f"{key!r} names both {seen[key]} and {spec.name}"
            seen[key] = spec.name


@pytest.mark.parametrize(
    "alias,name",
    [
        ("H100", "H100-SXM"), ("h100_sxm", "H100-SXM"), ("h100 sxm", "H100-SXM"), ("A100", "A100-SXM-80GB"),
        ("a100_sxm", "A100-SXM-80GB"), ("a100_pcie", "A100-PCIe-80GB"), ("H200", "H200"), ("h200_sxm", "H200"),
        ("b200_sxm", "B200"), ("b300_sxm", "B300"), ("gb200", "GB200"), ("gb300", "GB300"), ("l40s", "L40S"),
        ("rtx_pro_6000_server", "RTX-PRO-6000"), ("h100_pcie", "H100-PCIe"), ("l4", "L4"), ("RTX6000Ada", "RTX-6000-Ada"),
        ("A6000", "RTX-A6000"), ("4090", "RTX-4090"), ("h20", "H20"), ("H800", "H800"),
    ],
)
def test_aliases_resolve(alias, name):
    assert get_gpu(alias).name == name


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_every_alias_resolves_to_its_entry(spec):
    for alias in spec.aliases:
        assert get_gpu(alias).name == spec.name


def test_cli_style_gpu_list():
    assert [s.name for s in parse_gpu_list("H100,H20")] == ["H100-SXM", "H20"]
    assert len(parse_gpu_list("all")) == len(EXPECTED)


def test_gpu_spec_pickles_for_process_and_ray_workers():
    import pickle

    gpu = get_gpu("H20")
    copy = pickle.loads(pickle.dumps(gpu))
    assert copy == gpu
    assert dict(copy.sources) == dict(gpu.sources)
    assert dict(copy.tensor_flops_per_sm_per_cycle) == dict(gpu.tensor_flops_per_sm_per_cycle)
