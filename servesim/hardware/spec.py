"""The GPU specification: every figure a prediction starts from."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Mapping

#: Tensor-pipe data types the catalogue gives a per-SM throughput for.
TENSOR_DTYPES = ("bf16", "fp16", "fp8", "fp4", "int8", "tf32")

#: Fields of a catalogue entry that are figures and therefore need a source.
SOURCED_FIELDS = (
    "architecture",
    "compute_capability",
    "sm_count",
    "boost_clock_mhz",
    "sustained_clock_mhz",
    "tensor_flops_per_sm_per_cycle",
    "fma_flops_per_sm_per_cycle",
    "xu_ops_per_sm_per_cycle",
    "memory_gib",
    "dram_bandwidth_gbps",
    "l2_cache_mib",
    "l2_bandwidth_gbps",
    "smem_per_sm_kib",
    "max_smem_per_cta_kib",
    "registers_per_sm",
    "max_threads_per_sm",
    "max_warps_per_sm",
    "max_ctas_per_sm",
    "nvlink_unidir_bandwidth_gbps",
    "pcie_gen",
    "pcie_unidir_bandwidth_gbps",
    "gpus_per_node",
    "price_usd_per_gpu_hour",
)


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model as its specification sheet describes it.

    Throughputs are per SM per clock cycle so that a kernel's cycles on one SM follow directly; FLOPs count a
    fused multiply-add as two. Bandwidths are in GB/s (10^9 bytes per second). ``tensor_flops_per_sm_per_cycle``
    maps a dtype to the *dense* Tensor-pipe rate; a dtype the GPU has no Tensor-core support for is absent.
    """

    name: str
    aliases: tuple[str, ...]
    vendor: str
    architecture: str  # ampere | ada | hopper | blackwell
    compute_capability: str  # "9.0"
    form_factor: str  # sxm | pcie | superchip
    sm_count: int
    boost_clock_mhz: float
    sustained_clock_mhz: float
    tensor_flops_per_sm_per_cycle: Mapping[str, float]
    fma_flops_per_sm_per_cycle: float  # FP32 FMA pipe
    xu_ops_per_sm_per_cycle: float  # special-function unit (exp, rsqrt, ...)
    memory_gib: float
    dram_bandwidth_gbps: float
    l2_cache_mib: float
    l2_bandwidth_gbps: float
    smem_per_sm_kib: float
    max_smem_per_cta_kib: float
    registers_per_sm: int
    max_threads_per_sm: int
    max_warps_per_sm: int
    max_ctas_per_sm: int
    nvlink_unidir_bandwidth_gbps: float  # per GPU, one direction; 0 when the part has no NVLink
    nvswitch: bool  # all GPUs of a node reach each other at full NVLink bandwidth
    pcie_gen: int
    pcie_unidir_bandwidth_gbps: float  # x16 link, one direction
    gpus_per_node: int
    price_usd_per_gpu_hour: float
    price_date: str
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensor_flops_per_sm_per_cycle", MappingProxyType(dict(self.tensor_flops_per_sm_per_cycle)))
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))

    def __hash__(self) -> int:
        return hash(self.name)

    def __reduce__(self):
        """Pickle through plain dicts (read-only mapping proxies do not pickle), so specs cross process and Ray
        boundaries in planner sweeps."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return _spec_from_fields, ({k: dict(v) if isinstance(v, Mapping) else v for k, v in values.items()},)

    # Derived peaks, at the sustained clock unless asked otherwise.
    def clock_hz(self, boost: bool = False) -> float:
        return (self.boost_clock_mhz if boost else self.sustained_clock_mhz) * 1e6

    def tensor_tflops(self, dtype: str, boost: bool = False) -> float:
        """Dense Tensor-pipe peak in TFLOP/s for ``dtype`` (0 when unsupported)."""
        per_cycle = self.tensor_flops_per_sm_per_cycle.get(dtype, 0.0)
        return per_cycle * self.sm_count * self.clock_hz(boost) / 1e12

    def fma_tflops(self, boost: bool = False) -> float:
        return self.fma_flops_per_sm_per_cycle * self.sm_count * self.clock_hz(boost) / 1e12

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    @property
    def l2_cache_bytes(self) -> float:
        return self.l2_cache_mib * 2**20

    @property
    def has_nvlink(self) -> bool:
        return self.nvlink_unidir_bandwidth_gbps > 0

    def with_price(self, usd_per_gpu_hour: float, date: str, source: str) -> "GpuSpec":
        """A copy with a user-supplied price."""
        from dataclasses import replace

        sources = dict(self.sources)
        sources["price_usd_per_gpu_hour"] = source
        return replace(self, price_usd_per_gpu_hour=usd_per_gpu_hour, price_date=date, sources=sources)


GPU_SPEC_FIELDS = tuple(f.name for f in fields(GpuSpec))


def _spec_from_fields(values: dict) -> GpuSpec:
    return GpuSpec(**values)
