"""The roofline estimator: each kernel takes the longer of its compute time and its memory time at peak.

It is the analytical floor every learned model is compared with: it ignores tile quantisation, wave tails,
occupancy and cache misses, so it is optimistic for small and irregular kernels. Tensor-core kernels (GEMMs,
attention, fused MoE) use the Tensor pipe at their dtype; everything else the FP32 FMA pipe. The traffic a kernel
finds in L2 when it starts (``l2_resident_fraction``: none in serving, all of it in a measuring loop whose working
set fits; servesim/kernels/types.py) moves at the L2's bandwidth, the rest at the DRAM's.

It is also the time of the categories no network learns, and one of them waits on something no peak describes:
vLLM's per-tensor FP8 quantisation (:func:`vllm_quant_stall_us`), whose stall is added to its peak time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servesim.estimator.base import BoundedEstimator, predict_per_gpu_us
from servesim.estimator.bounds import (  # noqa: F401  (other modules import them from here)
    TENSOR_CATEGORIES,
    peak_times_us,
    pipe_peak_flops,
    traffic_us,
)
from servesim.hardware.spec import GpuSpec
from servesim.kernels.types import Kernel, Quantize, dtype_bytes

#: The shortest time a kernel takes from start to finish on the GPU however little it does: the launch latency
#: of the grid, one wave of CTAs and its drain. Vidur's smallest measured element-wise ops on A100/H100 take
#: 2 to 4 µs (servesim/data/vidur.py reads them).
MIN_KERNEL_US = 2.0


#: Cycles a resident thread of vLLM's abs-max kernel waits for each of its unvectorised loads, and cycles the
#: L2 takes per atomicMax on the one scale, one per CTA. Fitted on the H100, B200 and GB200 rows, no test GPU's
#: (``python tools/fit_quant_stall.py``; docs/estimator.md, "vLLM's per-tensor quantisation").
SCALAR_LOAD_LATENCY_CYCLES = 295.0
SAME_ADDRESS_ATOMIC_CYCLES = 8.8


def vllm_quant_stall_us(rows: np.ndarray | int, cols: np.ndarray | int, read_us: np.ndarray | float, gpu: GpuSpec,
                        load_latency_cycles: float = SCALAR_LOAD_LATENCY_CYCLES,
                        atomic_cycles: float = SAME_ADDRESS_ATOMIC_CYCLES) -> np.ndarray | float:
    """Time vLLM's per-tensor quantisation of ``rows`` x ``cols`` spends beyond its traffic, ``read_us`` being the
    time of one read of its input from wherever it is (DRAM or L2).

    Its abs-max kernel (``segmented_max_reduction_strided``: a CTA of 256 threads per row) loads one element per
    thread at a time, so each SM has one load per resident thread in flight and reads ``threads / latency``
    elements a cycle, below the DRAM rate on every GPU with HBM (Little's law); then every CTA updates the one
    scale with an atomicMax, which the L2 serialises."""
    elems = np.asarray(rows, dtype=float) * np.asarray(cols, dtype=float)
    resident_threads = gpu.sm_count * min(gpu.max_threads_per_sm, gpu.max_ctas_per_sm * 256)
    latency_bound_us = elems * load_latency_cycles / resident_threads / gpu.clock_hz() * 1e6
    atomics_us = np.asarray(rows, dtype=float) * atomic_cycles / gpu.clock_hz() * 1e6
    return np.maximum(latency_bound_us - read_us, 0.0) + atomics_us


def stall_us(kernel: Kernel, gpu: GpuSpec) -> float:
    """Time ``kernel`` waits beyond its peak compute and memory times (see :func:`vllm_quant_stall_us`)."""
    if isinstance(kernel, Quantize) and kernel.per_tensor:
        read_us = traffic_us(kernel.rows * kernel.cols * dtype_bytes(kernel.in_dtype), kernel.l2_resident_fraction, gpu)
        return float(vllm_quant_stall_us(kernel.rows, kernel.cols, read_us, gpu))
    return 0.0


class RooflineEstimator(BoundedEstimator):
    name = "roofline"
    label = "roofline (analytical peak compute / DRAM bandwidth, no learned correction)"

    def _predict_us(self, kernels: Sequence[Kernel], gpu: GpuSpec) -> np.ndarray:
        compute_us, memory_us = peak_times_us(kernels, gpu)
        stalls_us = np.fromiter((stall_us(k, gpu) for k in kernels), dtype=float, count=len(kernels))
        return np.maximum(np.maximum(compute_us, memory_us) + stalls_us, MIN_KERNEL_US)


def roofline_us(kernels: Sequence[Kernel], gpu_names: Sequence[str]) -> np.ndarray:
    """The roofline's time of each of ``kernels`` on its own row's GPU (``gpu_names[i]``), one batch per GPU."""
    return predict_per_gpu_us(RooflineEstimator(), kernels, gpu_names)
