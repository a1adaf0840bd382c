"""Per-pipeline demand features (SynPerf Table IV): per task, per SM (the busiest SM) and per GPU, plus the GPU's
spec vector, and the roofline time they imply.

Pipes are the Tensor, FMA and XU pipes (ops) and DRAM, L2 and shared memory (bytes); each pipe's cycles are its
demand over its per-SM throughput (DRAM and L2 bandwidth shared evenly by the SMs). The busiest SM is the one
with the most task cycles scheduled on it (lowest index on ties). ``theoretical_time_us`` is the slowest pipe's
cycles on the busiest SM over the clock, summed over a kernel's launches: the roofline time of the SM-level view,
against which the estimator learns efficiency = theoretical / measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from types import MappingProxyType

import numpy as np

from servesim.compiled import jit, pairwise_sum
from servesim.decompose import PIPES, Launch, decompose, occupancy, pipe_rate_vector
from servesim.decompose.gemm import (
    full_tile_demand,
    gemm_tiling,
    scaled_mm_tiling,
    tile_coords,
    tile_demand,
    total_demand,
)
from servesim.decompose.launch import LaunchConfig, cold_bytes, dram_fraction
from servesim.errors import ServesimError
from servesim.hardware import GpuSpec
from servesim.kernels.types import Gemm, Kernel, ScaledMM
from servesim.scheduler import Partition, schedule

_PIPE_UNITS = {"tensor": "ops", "fma": "ops", "xu": "ops", "dram": "bytes", "l2": "bytes", "smem": "bytes"}
DEMAND_FEATURES = tuple(
    name
    for p in PIPES
    for name in (f"sm_{p}_{_PIPE_UNITS[p]}", f"sm_{p}_cycles", f"gpu_{p}_{_PIPE_UNITS[p]}", f"gpu_{p}_cycles")
)
SCHEDULE_FEATURES = ("num_tasks", "num_ctas", "ctas_per_sm", "waves", "sm_tasks_max", "sm_tasks_mean",
                     "sm_busy_cycles_max", "sm_busy_cycles_mean", "imbalance")
SPEC_FEATURES = ("spec_sm_count", "spec_clock_mhz", "spec_tensor_per_sm_cycle", "spec_fma_per_sm_cycle",
                 "spec_xu_per_sm_cycle", "spec_dram_gbps", "spec_l2_gbps", "spec_l2_mib", "spec_smem_per_sm_kib")
FEATURE_NAMES = (*DEMAND_FEATURES, *SCHEDULE_FEATURES, *SPEC_FEATURES, "theoretical_time_us")
#: Features that add up over a kernel's launches.
_ADDITIVE = (*DEMAND_FEATURES, "num_tasks", "num_ctas", "waves", "sm_tasks_max", "sm_tasks_mean",
             "sm_busy_cycles_max", "sm_busy_cycles_mean", "theoretical_time_us")


@dataclass(frozen=True, eq=False)
class FeatureMatrix:
    """Features of a batch of kernels of one category: ``values[i, j]`` is feature ``names[j]`` of kernel i."""

    names: tuple[str, ...]
    values: np.ndarray

    def column(self, name: str) -> np.ndarray:
        return self.values[:, self.names.index(name)]

    def as_dict(self) -> dict[str, np.ndarray]:
        return {n: self.values[:, i] for i, n in enumerate(self.names)}

    def select(self, names: Sequence[str]) -> FeatureMatrix:
        """The columns ``names``, in that order (this matrix itself, uncopied, when that is all of them)."""
        names = tuple(names)
        if names == self.names:
            return self
        return FeatureMatrix(names, self.values[:, [self.names.index(n) for n in names]])


@lru_cache(maxsize=256)
def spec_vector(gpu: GpuSpec, tensor_dtype: str) -> MappingProxyType[str, float]:
    """The GPU's specification features (memoised, read-only)."""
    return MappingProxyType({
        "spec_sm_count": gpu.sm_count,
        "spec_clock_mhz": gpu.sustained_clock_mhz,
        "spec_tensor_per_sm_cycle": gpu.tensor_flops_per_sm_per_cycle.get(tensor_dtype, 0.0),
        "spec_fma_per_sm_cycle": gpu.fma_flops_per_sm_per_cycle,
        "spec_xu_per_sm_cycle": gpu.xu_ops_per_sm_per_cycle,
        "spec_dram_gbps": gpu.dram_bandwidth_gbps,
        "spec_l2_gbps": gpu.l2_bandwidth_gbps,
        "spec_l2_mib": gpu.l2_cache_mib,
        "spec_smem_per_sm_kib": gpu.smem_per_sm_kib,
    })


def _demand_columns(sm: np.ndarray, total: np.ndarray, rates: np.ndarray, sm_count: int) -> np.ndarray:
    """Each pipe's busiest-SM and GPU demand and cycles, in :data:`DEMAND_FEATURES` order down the first axis, from
    the busiest SM's and the GPU's demand (a row per pipe of :data:`PIPES`; for a batch of kernels, a column per
    kernel) and the pipes' rates (:func:`pipe_rate_vector`)."""
    per_pipe = rates.reshape(len(PIPES), *(1,) * (sm.ndim - 1))
    columns = np.empty((len(PIPES), 4, *sm.shape[1:]))
    columns[:, 0], columns[:, 1], columns[:, 2], columns[:, 3] = sm, sm / per_pipe, total, total / (per_pipe * sm_count)
    return columns.reshape(-1, *sm.shape[1:])


#: The busiest SM's cycles of each pipe among :func:`_demand_columns`' rows (the second of each pipe's four).
_SM_CYCLE_ROWS = slice(1, len(DEMAND_FEATURES), 4)


def _roofline_us(demand: np.ndarray, gpu: GpuSpec) -> np.ndarray:
    """The slowest pipe's busiest-SM cycles over the clock, from :func:`_demand_columns`."""
    return demand[_SM_CYCLE_ROWS].max(axis=0) / gpu.sustained_clock_mhz


#: Each feature's column in FEATURE_NAMES order.
_COLUMN = {name: i for i, name in enumerate(FEATURE_NAMES)}
_ADDITIVE_COLUMNS = np.array([_COLUMN[name] for name in _ADDITIVE])
_SPEC_COLUMNS = slice(_COLUMN[SPEC_FEATURES[0]], _COLUMN[SPEC_FEATURES[-1]] + 1)


def launch_features(launch: Launch, partition: Partition, gpu: GpuSpec) -> np.ndarray:
    """Features of one scheduled launch, a vector in :data:`FEATURE_NAMES` order: the spec features and the
    imbalance, which :func:`combine` gives the whole kernel, are left at 0."""
    tasks = launch.tasks
    rates = pipe_rate_vector(gpu, launch.tensor_dtype)
    sm, total, tasks_max, busy_max, busy_sum = _per_sm_reduction(
        tasks.demand_by_pipe, partition.sm_of_task, tasks.duration_cycles, gpu.sm_count)
    demand = _demand_columns(sm, total, rates, gpu.sm_count)
    feats = np.zeros(len(FEATURE_NAMES))
    feats[:len(DEMAND_FEATURES)] = demand
    feats[_COLUMN["num_tasks"]:_COLUMN["imbalance"]] = (
        tasks.size, launch.grid_ctas, partition.ctas_per_sm,
        np.ceil(launch.grid_ctas / (gpu.sm_count * partition.ctas_per_sm)),
        tasks_max, tasks.size / gpu.sm_count, busy_max, busy_sum / gpu.sm_count,
    )
    feats[_COLUMN["theoretical_time_us"]] = _roofline_us(demand, gpu)
    return feats


@jit
def _per_sm_reduction(demand_by_pipe: np.ndarray, sm_of_task: np.ndarray, duration_cycles: np.ndarray,
                      sm_count: int) -> tuple[np.ndarray, np.ndarray, int, float, float]:
    """Each pipe's demand on the busiest SM (the most task cycles, lowest index on ties; summed in task order) and
    on the GPU, the most tasks on one SM, and the busiest SM's and all SMs' cycles."""
    busy = np.zeros(sm_count)
    tasks_on = np.zeros(sm_count, dtype=np.int64)
    for task, sm in enumerate(sm_of_task):
        busy[sm] += duration_cycles[task]
        tasks_on[sm] += 1
    busiest = np.argmax(busy)
    pipes, n = demand_by_pipe.shape
    on_busiest = np.zeros(pipes)
    total = np.empty(pipes)
    for pipe in range(pipes):
        row = np.ascontiguousarray(demand_by_pipe[pipe])
        first = True
        for task in range(n):
            if sm_of_task[task] == busiest:
                on_busiest[pipe] = row[task] if first else on_busiest[pipe] + row[task]
                first = False
        total[pipe] = pairwise_sum(row, 0, n)
    return on_busiest, total, tasks_on.max(), busy.max(), pairwise_sum(busy, 0, sm_count)


def _sums_in_order(rows: np.ndarray) -> np.ndarray:
    """Each row's sum, element after element."""
    return np.add.accumulate(rows, axis=1)[:, -1] if rows.shape[1] else np.zeros(len(rows))


def combine(per_launch: Sequence[np.ndarray], gpu: GpuSpec, tensor_dtype: str) -> np.ndarray:
    """A kernel's features from its launches' (:func:`launch_features`): additive features summed launch after
    launch, occupancy the lowest, the imbalance of the sums, spec filled in."""
    feats = per_launch[0].copy()
    for launch in per_launch[1:]:
        feats[_ADDITIVE_COLUMNS] += launch[_ADDITIVE_COLUMNS]
    feats[_COLUMN["ctas_per_sm"]] = min(launch[_COLUMN["ctas_per_sm"]] for launch in per_launch)
    busy_mean = feats[_COLUMN["sm_busy_cycles_mean"]]
    feats[_COLUMN["imbalance"]] = feats[_COLUMN["sm_busy_cycles_max"]] / busy_mean if busy_mean else 1.0
    spec = spec_vector(gpu, tensor_dtype)
    feats[_SPEC_COLUMNS] = [spec[name] for name in SPEC_FEATURES]
    return feats


@lru_cache(maxsize=65536)
def _kernel_features_cached(kernel: Kernel, gpu: GpuSpec) -> np.ndarray:
    # The features are memoised here, so the launches (task arrays of up to millions of rows) are not kept in
    # decompose's own cache: thousands of distinct attention kernels would hold gigabytes. Read-only: shared.
    launches = decompose.__wrapped__(kernel, gpu)
    per_launch = [launch_features(launch, schedule(launch, gpu), gpu) for launch in launches]
    feats = combine(per_launch, gpu, kernel.dtype if kernel.category in _TENSOR_CATEGORIES else "")
    feats.flags.writeable = False
    return feats


_TENSOR_CATEGORIES = ("gemm", "fp4_mm", "scaled_mm", "attn_prefill", "attn_decode", "moe", "moe_marlin", "moe_trtllm",
                      "index_logits")


def _gemm_family_features(kernels: Sequence[Gemm | ScaledMM], gpu: GpuSpec) -> np.ndarray:
    """Closed form for GEMM-family batches: every tile lasts equally long, so the round-robin and static
    persistent schedules put tile j on SM j mod sm_count and SM 0 is the busiest; its tiles are summed wave by
    wave, vectorised over the batch."""
    first = kernels[0]
    m, n, k = (np.array([getattr(x, a) for x in kernels], dtype=np.int64) for a in ("m", "n", "k"))
    if isinstance(first, ScaledMM):
        t = scaled_mm_tiling(m, n, k, gpu, first)
    else:
        t = gemm_tiling(m, n, k, gpu, first.dtype, first.out_dtype)
    sm_count = gpu.sm_count
    rates = pipe_rate_vector(gpu, first.dtype)
    tasks = t.num_tasks(m, n)
    totals = total_demand(t, m, n, k, first.bias)
    share = dram_fraction(np.array([cold_bytes(x) for x in kernels]), totals["l2"])
    totals["xu"] = np.zeros(len(m))
    totals["dram"] = totals["l2"] * share
    # SM 0 runs tasks 0, S, 2S, ...: every wave of every kernel at once, kernels down the rows.
    j = np.arange(int(-(-tasks.max() // sm_count)))[None, :] * sm_count
    valid = j < tasks[:, None]
    by_row = replace(t, **{f.name: getattr(t, f.name)[:, None] for f in fields(t)
                           if np.ndim(getattr(t, f.name)) == 1})
    _, _, _, rows, cols, depth, last = tile_coords(np.where(valid, j, 0), m[:, None], n[:, None], k[:, None], by_row)
    demand = tile_demand(by_row, rows, cols, depth, last, first.bias)
    sm = {p: np.zeros(len(m)) for p in PIPES}
    # Summed in wave order: a pairwise sum would round a kernel's waves differently with the batch's longest kernel
    # (the zero-padded columns), and a kernel's features would depend on the kernels computed with it.
    sm.update({p: _sums_in_order(np.where(valid, v, 0.0)) for p, v in demand.items()})
    sm["dram"] = sm["l2"] * share
    demand = _demand_columns(np.stack([sm[p] for p in PIPES]), np.stack([totals[p] for p in PIPES]), rates, sm_count)
    feats: dict[str, np.ndarray] = dict(zip(DEMAND_FEATURES, demand))
    issued = full_tile_demand(t, np.ones_like(m))
    issued["dram"] = issued["l2"] * share
    tile_cycles = np.max(np.vstack([issued.get(p, np.zeros(len(m))) / rate for p, rate in zip(PIPES, rates)]), axis=0)
    threads = np.broadcast_to(np.asarray(t.threads), m.shape)
    ctas_per_sm = np.zeros(len(m))
    # One occupancy per distinct (threads, shared memory) tile: both fit in 32 bits, so one integer keys them.
    keys = threads.astype(np.int64) << 32 | np.asarray(t.smem_bytes, dtype=np.int64)
    for key in np.unique(keys).tolist():
        ctas_per_sm[keys == key] = occupancy(LaunchConfig(key >> 32, t.registers, key & 0xFFFFFFFF), gpu).ctas_per_sm
    grid = np.where(t.persistent, np.minimum(tasks, sm_count * ctas_per_sm), tasks)
    per_sm_max = -(-tasks // sm_count)
    busy_max = per_sm_max * tile_cycles
    busy_mean = tasks * tile_cycles / sm_count
    feats.update(
        num_tasks=tasks, num_ctas=grid, ctas_per_sm=ctas_per_sm, waves=np.ceil(grid / (sm_count * ctas_per_sm)),
        sm_tasks_max=per_sm_max, sm_tasks_mean=tasks / sm_count, sm_busy_cycles_max=busy_max,
        sm_busy_cycles_mean=busy_mean, imbalance=busy_max / busy_mean,
    )
    feats.update({name: np.full(len(m), value) for name, value in spec_vector(gpu, first.dtype).items()})
    feats["theoretical_time_us"] = _roofline_us(demand, gpu)
    return np.column_stack([np.asarray(feats[name], dtype=np.float64) for name in FEATURE_NAMES])


def _gemm_group_key(kernel: Kernel) -> tuple:
    if isinstance(kernel, ScaledMM):
        return (kernel.dtype, kernel.out_dtype, kernel.bias, kernel.scale, kernel.block_n, kernel.block_k,
                kernel.library)
    return (kernel.dtype, kernel.out_dtype, kernel.bias)


def kernel_features(kernels: Sequence[Kernel], gpu: GpuSpec) -> FeatureMatrix:
    """Features of a batch of kernels of one category on ``gpu``: rows follow ``kernels``, columns
    :data:`FEATURE_NAMES`. GEMM-family batches use the vectorised closed form; others decompose and schedule each
    distinct kernel once (memoised)."""
    if not kernels:
        return FeatureMatrix(FEATURE_NAMES, np.zeros((0, len(FEATURE_NAMES))))
    categories = {k.category for k in kernels}
    if len(categories) > 1:
        raise ServesimError(f"kernel_features takes one category at a time, got {', '.join(sorted(categories))}")
    values = np.empty((len(kernels), len(FEATURE_NAMES)))
    if categories <= {"gemm", "fp4_mm", "scaled_mm"}:
        groups: dict[tuple, list[int]] = {}
        for i, kernel in enumerate(kernels):
            groups.setdefault(_gemm_group_key(kernel), []).append(i)
        for rows in groups.values():
            values[rows] = _gemm_family_features([kernels[i] for i in rows], gpu)
    else:
        for i, kernel in enumerate(kernels):
            values[i] = _kernel_features_cached(kernel, gpu)
    return FeatureMatrix(FEATURE_NAMES, values)


def clear_feature_cache() -> None:
    """Forget the memoised features of decomposed kernels (a benchmark starts cold with it)."""
    _kernel_features_cached.cache_clear()


def features_of(kernel: Kernel, gpu: GpuSpec) -> dict[str, float]:
    """One kernel's features through decomposition and scheduling (the explain path)."""
    return dict(zip(FEATURE_NAMES, _kernel_features_cached(kernel, gpu).tolist()))


def roofline_time_us(kernel: Kernel, gpu: GpuSpec) -> float:
    """The slowest pipe's cycles on the busiest SM over the clock, in µs (summed over the kernel's launches)."""
    return features_of(kernel, gpu)["theoretical_time_us"]


def pipe_times_us(features: dict[str, float], gpu: GpuSpec) -> dict[str, float]:
    """Each pipe's busiest-SM time alone, in µs."""
    return {p: features[f"sm_{p}_cycles"] / gpu.sustained_clock_mhz for p in PIPES}


__all__ = ["FEATURE_NAMES", "FeatureMatrix", "clear_feature_cache", "features_of", "kernel_features",
           "launch_features", "pipe_times_us", "roofline_time_us", "spec_vector"]
