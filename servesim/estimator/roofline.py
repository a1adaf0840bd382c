"""The roofline estimator: each kernel takes the longer of its compute time at peak and its DRAM time at peak.

It is the analytical floor every learned model is compared with: it ignores tile quantisation, wave tails,
occupancy and caches, so it is optimistic for small and irregular kernels. Tensor-core kernels (GEMMs,
attention, fused MoE) use the Tensor pipe at their dtype; everything else the FP32 FMA pipe.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servesim.hardware.spec import GpuSpec
from servesim.kernels.types import Kernel

#: Categories whose arithmetic runs on the Tensor cores.
TENSOR_CATEGORIES = frozenset({"gemm", "scaled_mm", "attn_prefill", "attn_decode", "moe"})

#: The shortest time a kernel takes from start to finish on the GPU however little it does: the launch latency
#: of the grid, one wave of CTAs and its drain. Vidur's smallest measured element-wise ops on A100/H100 take
#: 2 to 4 µs (servesim/data/vidur.py reads them).
MIN_KERNEL_US = 2.0


def pipe_peak_flops(kernel: Kernel, gpu: GpuSpec) -> float:
    """FLOP/s of the pipe ``kernel`` computes on, at the sustained clock."""
    if kernel.category in TENSOR_CATEGORIES:
        dtype = "bf16" if kernel.dtype in ("fp16", "bf16") else kernel.dtype
        return gpu.tensor_tflops(dtype) * 1e12 or gpu.tensor_tflops("bf16") * 1e12
    return gpu.fma_tflops() * 1e12


class RooflineEstimator:
    name = "roofline"
    label = "roofline (analytical peak compute / DRAM bandwidth, no learned correction)"

    def trained_gpus(self, category: str | None = None) -> tuple[str, ...]:
        return ()

    def predict_us(self, kernels: Sequence[Kernel], gpu: GpuSpec) -> np.ndarray:
        flops = np.fromiter((k.flops() for k in kernels), dtype=float, count=len(kernels))
        bytes_moved = np.fromiter((k.bytes_moved() for k in kernels), dtype=float, count=len(kernels))
        peaks = np.fromiter((pipe_peak_flops(k, gpu) for k in kernels), dtype=float, count=len(kernels))
        compute_us = flops / peaks * 1e6
        memory_us = bytes_moved / (gpu.dram_bandwidth_gbps * 1e9) * 1e6
        return np.maximum(np.maximum(compute_us, memory_us), MIN_KERNEL_US)
