"""The fastest a kernel can run on a GPU: its compulsory traffic at peak bandwidth, its FLOPs at its pipe's peak.

Every estimator's prediction is held at or above this bound (:class:`servesim.estimator.base.BoundedEstimator`),
so no learned correction, extrapolated network or future estimator predicts a kernel faster than physics allows.
It is the roofline's time without the roofline's launch floor and stalls:

- FLOPs at the peak of the pipe the kernel computes on: the Tensor pipe at its dtype for GEMM-family, attention
  and fused-MoE kernels, the FP32 FMA pipe for everything else;
- ``bytes_moved()`` (every input read once, every output written once) at the DRAM's peak bandwidth, except the
  share ``l2_resident_fraction`` the kernel object says L2 already holds when it starts (a measured kernel timed in
  a loop whose working set fits in L2), which moves at the L2's. Serving kernels record none, so their bound is
  all DRAM.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servesim.hardware.spec import GpuSpec
from servesim.kernels.types import Kernel

#: Categories whose arithmetic runs on the Tensor cores.
TENSOR_CATEGORIES = frozenset({"gemm", "fp4_mm", "scaled_mm", "attn_prefill", "attn_decode", "moe", "moe_marlin",
                               "moe_trtllm", "gdn_prefill", "index_logits"})


def pipe_peak_flops(kernel: Kernel, gpu: GpuSpec) -> float:
    """FLOP/s of the pipe ``kernel`` computes on, at the sustained clock."""
    if kernel.category in TENSOR_CATEGORIES:
        dtype = "bf16" if kernel.dtype in ("fp16", "bf16") else kernel.dtype
        return gpu.tensor_tflops(dtype) * 1e12 or gpu.tensor_tflops("bf16") * 1e12
    return gpu.fma_tflops() * 1e12


def traffic_us(bytes_moved: np.ndarray | float, l2_resident_fraction: np.ndarray | float,
               gpu: GpuSpec) -> np.ndarray | float:
    """Time to move ``bytes_moved`` at peak when ``l2_resident_fraction`` of it is in L2 and the rest in DRAM."""
    return (bytes_moved * (1.0 - l2_resident_fraction) / (gpu.dram_bandwidth_gbps * 1e3)
            + bytes_moved * l2_resident_fraction / (gpu.l2_bandwidth_gbps * 1e3))


def l2_resident_fraction(kernel: Kernel) -> float:
    """The share of ``kernel``'s traffic L2 holds when it starts; 0 for kernel types that record none."""
    return getattr(kernel, "l2_resident_fraction", 0.0)


def peak_times_us(kernels: Sequence[Kernel], gpu: GpuSpec) -> tuple[np.ndarray, np.ndarray]:
    """Each kernel's compute time and memory time at ``gpu``'s peak rates (µs)."""
    count = len(kernels)
    flops = np.fromiter((k.flops() for k in kernels), dtype=float, count=count)
    bytes_moved = np.fromiter((k.bytes_moved() for k in kernels), dtype=float, count=count)
    peaks: dict[tuple[str, str], float] = {}

    def peak(kernel: Kernel) -> float:
        key = (kernel.category, kernel.dtype)
        if key not in peaks:
            peaks[key] = pipe_peak_flops(kernel, gpu)
        return peaks[key]

    pipe = np.fromiter((peak(k) for k in kernels), dtype=float, count=count)
    resident = np.fromiter((l2_resident_fraction(k) for k in kernels), dtype=float, count=count)
    return flops / pipe * 1e6, traffic_us(bytes_moved, resident, gpu)


def lower_bound_us(kernels: Sequence[Kernel], gpu: GpuSpec) -> np.ndarray:
    """The shortest time each of ``kernels`` can take on ``gpu`` (µs): the longer of its compute and memory times
    at peak (see the module docstring)."""
    if not len(kernels):
        return np.zeros(0)
    compute_us, memory_us = peak_times_us(kernels, gpu)
    return np.maximum(compute_us, memory_us)
