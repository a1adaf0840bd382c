"""What one kernel launch consists of: its CTA resources, its tasks and how the tasks are scheduled.

A *task* is the unit of work one CTA processes: a CTA of a classic grid, or one work tile of a persistent kernel.
Per-task demand is *useful* work (sums to the kernel's closed-form FLOPs and bytes); ``duration_cycles`` is what
the task occupies its CTA slot for, which for tiled kernels counts the padded tile (edge tiles and masked causal
blocks issue full MMA tiles), so that the schedule sees what the hardware sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

from servesim.compiled import inner, jit, pairwise_sum
from servesim.errors import ServesimError
from servesim.hardware import GpuSpec
from servesim.kernels.types import AttentionDecode, AttentionPrefill, Gemm, Kernel, ScaledMM
from servesim.limits import MAX_TASKS_PER_LAUNCH

#: Scheduling policies (see servesim.scheduler).
ROUND_ROBIN = "round_robin"  # hardware block scheduler
MIN_HEAP = "min_heap"  # persistent kernel, each work unit to the least-loaded CTA (FlashInfer SM90 plan, FA3)
STATIC_PERSISTENT = "static_persistent"  # persistent kernel, tile t to CTA t mod grid (Hopper GEMM raster)
POLICIES = (ROUND_ROBIN, MIN_HEAP, STATIC_PERSISTENT)

#: Demand fields of a task set, in feature order: Tensor/FMA/XU pipes (ops) and the memory hierarchy (bytes).
PIPES = ("tensor", "fma", "xu", "dram", "l2", "smem")
#: Each pipe's row in a pipe-by-task demand array.
PIPE_ROW = {p: i for i, p in enumerate(PIPES)}
_PIPE_ROW_L2, _PIPE_ROW_DRAM = PIPE_ROW["l2"], PIPE_ROW["dram"]

#: Shared-memory bandwidth per SM: 32 banks x 4 bytes per cycle (CUDA C++ Programming Guide, "Shared Memory",
#: compute capabilities 5.x-12.x).
SMEM_BYTES_PER_SM_PER_CYCLE = 128.0

#: Shared memory the driver reserves per CTA on compute capability 8.0 and later (CUDA Occupancy Calculator).
SMEM_RESERVED_PER_CTA_BYTES = 1024
#: Register allocation: per warp, in units of 256 registers; the register file is split over 4 sub-partitions.
REGISTER_ALLOC_UNIT = 256
SUB_PARTITIONS = 4
MAX_THREADS_PER_CTA = 1024


def check_task_count(kernel: Kernel, tasks: int) -> None:
    """Refuse a launch of more than :data:`MAX_TASKS_PER_LAUNCH` tasks before its arrays are built."""
    if tasks > MAX_TASKS_PER_LAUNCH:
        raise ServesimError(
            f"{kernel.category} {kernel.shape()} would launch {tasks:,} tasks, more than the {MAX_TASKS_PER_LAUNCH:,} "
            "servesim decomposes per launch; give smaller dimensions"
        )


@dataclass(frozen=True)
class LaunchConfig:
    """Per-CTA resources, which bound how many CTAs an SM holds at once."""

    threads_per_cta: int
    registers_per_thread: int
    smem_per_cta_bytes: int


@dataclass(frozen=True)
class Occupancy:
    """Resident CTAs per SM and the resource that limits it."""

    ctas_per_sm: int
    limiter: str  # threads | warps | registers | smem | cta_slots
    by_resource: tuple[tuple[str, int], ...]


@lru_cache(maxsize=4096)
def occupancy(launch: LaunchConfig, gpu: GpuSpec) -> Occupancy:
    """CTAs per SM by the CUDA occupancy rules: the minimum over warps, threads, registers, shared memory and CTA
    slots of what fits. Registers are allocated per warp in 256-register units within each of the 4 SM
    sub-partitions; each CTA's shared memory carries 1 KiB the driver reserves."""
    if launch.threads_per_cta < 1 or launch.threads_per_cta > MAX_THREADS_PER_CTA:
        raise ServesimError(f"a CTA has 1 to {MAX_THREADS_PER_CTA} threads, not {launch.threads_per_cta}")
    if launch.smem_per_cta_bytes > gpu.max_smem_per_cta_kib * 1024:
        raise ServesimError(
            f"{launch.smem_per_cta_bytes} B of shared memory per CTA exceeds {gpu.name}'s "
            f"{gpu.max_smem_per_cta_kib:g} KiB limit; use a smaller tile"
        )
    warps = -(-launch.threads_per_cta // 32)
    regs_per_warp = -(-launch.registers_per_thread * 32 // REGISTER_ALLOC_UNIT) * REGISTER_ALLOC_UNIT
    warps_by_regs = (gpu.registers_per_sm // SUB_PARTITIONS // max(regs_per_warp, 1)) * SUB_PARTITIONS
    smem_cta = launch.smem_per_cta_bytes + SMEM_RESERVED_PER_CTA_BYTES
    by_resource = (
        ("warps", gpu.max_warps_per_sm // warps),
        ("threads", gpu.max_threads_per_sm // launch.threads_per_cta),
        ("registers", warps_by_regs // warps),
        ("smem", int(gpu.smem_per_sm_kib * 1024) // smem_cta),
        ("cta_slots", gpu.max_ctas_per_sm),
    )
    limiter, ctas = min(by_resource, key=lambda item: item[1])
    if ctas < 1:
        raise ServesimError(f"a CTA of this kernel does not fit on one {gpu.name} SM ({limiter}); use a smaller tile")
    return Occupancy(ctas, limiter, by_resource)


@dataclass(frozen=True, eq=False)
class TaskSet:
    """Per-task arrays, one entry per task, in launch order.

    :attr:`dims` gives each task's dimension vector (columns named by ``dim_names``, e.g. rows, cols, k of a GEMM
    tile); ``demand_by_pipe`` each pipe's demand, a row per pipe of :data:`PIPES`, so that features reduce every
    pipe in one call. A launch may run one block of tasks ``repeats`` times (attention runs the same tiles for every
    head): ``block_dims`` then holds one block's dimensions, and the dimension named ``repeat_dim`` numbers the
    repeats. Only a display asks for every task's dimensions, so they are not built otherwise.
    """

    dim_names: tuple[str, ...]
    dim_columns: tuple[np.ndarray, ...]  # one block's dimensions, a column per name
    demand_by_pipe: np.ndarray  # (len(PIPES), n_tasks) float64
    duration_cycles: np.ndarray  # (n_tasks,) float64
    repeats: int = 1
    repeat_dim: str = ""

    @property
    def size(self) -> int:
        return len(self.duration_cycles)

    @cached_property
    def block_dims(self) -> np.ndarray:
        """``(n_tasks // repeats, len(dim_names))`` int64: one block's dimensions (built when a display asks)."""
        return np.asarray(np.column_stack(self.dim_columns), dtype=np.int64).reshape(-1, len(self.dim_names))

    @property
    def dims(self) -> np.ndarray:
        """``(n_tasks, len(dim_names))``: each task's dimensions, in launch order."""
        if self.repeats == 1:
            return self.block_dims
        dims = np.empty((self.repeats, *self.block_dims.shape), dtype=np.int64)
        dims[:] = self.block_dims
        dims[:, :, self.dim_names.index(self.repeat_dim)] = np.arange(self.repeats)[:, None]
        return dims.reshape(-1, len(self.dim_names))

    @property
    def demand(self) -> dict[str, np.ndarray]:
        """Each pipe's per-task demand, keyed by :data:`PIPES`."""
        return dict(zip(PIPES, self.demand_by_pipe))

    def uniform(self) -> bool:
        """Whether every task occupies its slot equally long (then round-robin has a closed form)."""
        d = self.duration_cycles
        return d.size == 0 or bool(np.all(d == d[0]))


@dataclass(frozen=True, eq=False)
class Launch:
    """One kernel launch: what it is, its CTA resources, its tasks and its scheduling policy.

    ``grid_ctas`` is the number of CTAs launched: the task count for a classic grid, the persistent grid for
    persistent kernels (each CTA then loops over several tasks).
    """

    name: str
    config: LaunchConfig
    tasks: TaskSet
    policy: str
    grid_ctas: int
    tensor_dtype: str
    notes: tuple[str, ...] = field(default=())


@lru_cache(maxsize=256)
def pipe_rate_vector(gpu: GpuSpec, tensor_dtype: str) -> np.ndarray:
    """Each pipe's throughput per SM per cycle, in :data:`PIPES` order: ops for Tensor/FMA/XU, bytes for DRAM/L2
    (the GPU's bandwidth shared evenly by its SMs) and shared memory (memoised, read-only: every new kernel
    asks)."""
    tensor = gpu.tensor_flops_per_sm_per_cycle.get(tensor_dtype, 0.0)
    if tensor_dtype and tensor <= 0:
        raise ServesimError(
            f"{gpu.name} has no {tensor_dtype} Tensor-core throughput in the catalogue; "
            f"choose a dtype it supports ({', '.join(sorted(gpu.tensor_flops_per_sm_per_cycle))})"
        )
    clock_hz = gpu.clock_hz()
    by_pipe = {
        "tensor": tensor or 1.0,
        "fma": gpu.fma_flops_per_sm_per_cycle,
        "xu": gpu.xu_ops_per_sm_per_cycle,
        "dram": gpu.dram_bandwidth_gbps * 1e9 / clock_hz / gpu.sm_count,
        "l2": gpu.l2_bandwidth_gbps * 1e9 / clock_hz / gpu.sm_count,
        "smem": SMEM_BYTES_PER_SM_PER_CYCLE,
    }
    vector = np.array([by_pipe[p] for p in PIPES])
    vector.flags.writeable = False
    return vector


def task_set(
    dim_names: tuple[str, ...],
    dims: Sequence[np.ndarray],
    demand: dict[str, np.ndarray] | np.ndarray,
    rates: np.ndarray,
    issued: dict[str, np.ndarray] | np.ndarray | None = None,
    repeats: int = 1,
    repeat_dim: str = "",
    cold_dram_bytes: float | None = None,
) -> TaskSet:
    """Build a :class:`TaskSet` from each task's dimensions (``dims``, a column per name of ``dim_names``) and
    demand. A task's duration is its slowest pipe's cycles at ``rates`` (:func:`pipe_rate_vector`), taken from the
    ``issued`` demand when given (tiled kernels: the full padded tile, which is what the main loop runs) else from
    the useful one. Demand is by pipe name, or a float64 array with a row per pipe of :data:`PIPES`; the one the
    durations come from keeps its DRAM row as :func:`task_arrays` sets it.

    ``dims``, ``demand`` and ``issued`` may describe one block of tasks that the launch repeats ``repeats`` times
    (attention runs the same tiles for every head), numbered in the dimension ``repeat_dim``: durations are then
    worked out once per block. With ``cold_dram_bytes``, each task's DRAM demand is that traffic spread over the
    tasks of every repeat in proportion to their L2 demand (:func:`dram_fraction`)."""
    block = len(dims[0])
    useful = _by_pipe(demand, block)
    timed = useful if issued is None else _by_pipe(issued, block)
    spread = cold_dram_bytes is not None
    every, duration = task_arrays(useful, timed, rates, repeats, float(cold_dram_bytes) if spread else 0.0, spread)
    return TaskSet(dim_names, tuple(dims), every, duration, repeats, repeat_dim)


@jit
def task_arrays(useful: np.ndarray, timed: np.ndarray, rates: np.ndarray, repeats: int, cold_dram_bytes: float,
                spread: bool) -> tuple[np.ndarray, np.ndarray]:
    """:func:`task_set`'s arrays: the useful demand of every repeat (``repeats`` copies of ``useful`` side by side),
    with ``spread`` the DRAM rows of it and of ``timed`` (changed in place) set to their L2 rows times
    :func:`dram_fraction` of ``cold_dram_bytes`` over every repeat's L2 demand, and each task's duration, its
    slowest pipe's ``timed`` cycles."""
    # Element loops rather than slice assignments: numba compiles a slice assignment's shape-mismatch error path
    # (formatting the shapes) for seconds on a first run, for the same result.
    pipes, block = useful.shape
    every = np.empty((pipes, block * repeats))
    for pipe in range(pipes):
        for repeat in range(repeats):
            for task in range(block):
                every[pipe, repeat * block + task] = useful[pipe, task]
    if spread:
        l2, dram = _PIPE_ROW_L2, _PIPE_ROW_DRAM
        share = dram_fraction(cold_dram_bytes, pairwise_sum(every[l2], 0, block * repeats))
        for task in range(block * repeats):
            every[dram, task] = every[l2, task] * share
        for task in range(timed.shape[1]):
            timed[dram, task] = timed[l2, task] * share
    duration = np.empty(block * repeats)
    for task in range(block):
        slowest = timed[0, task] / rates[0]
        for pipe in range(1, pipes):
            slowest = max(slowest, timed[pipe, task] / rates[pipe])
        for repeat in range(repeats):
            duration[repeat * block + task] = slowest
    return every, duration


def cold_bytes(kernel: Gemm | ScaledMM | AttentionPrefill | AttentionDecode) -> float:
    """The part of the kernel's compulsory traffic that comes from DRAM: what L2 does not already hold."""
    return kernel.bytes_moved() * (1.0 - kernel.l2_resident_fraction)


@inner
def dram_fraction(unique_bytes: float | np.ndarray, l2_bytes: float | np.ndarray) -> float | np.ndarray:
    """DRAM bytes per L2 byte when L2 captures all reuse: the kernel's compulsory traffic spread over its tiles'
    loads in proportion (an optimistic bound; the per-category MLP learns what L2 misses add). Element-wise: arrays
    broadcast, and the compiled loops call it with two floats."""
    return np.minimum(unique_bytes / np.maximum(l2_bytes, 1.0), 1.0)


def _by_pipe(demand: dict[str, np.ndarray] | np.ndarray, n: int) -> np.ndarray:
    """Each pipe's demand as a row of a float64 array of ``n`` tasks (a missing pipe or a scalar broadcast); an
    array is already that."""
    if isinstance(demand, np.ndarray):
        return demand
    by_pipe = np.empty((len(PIPES), n))
    for row, p in zip(by_pipe, PIPES):
        row[...] = demand.get(p, 0.0)
    return by_pipe
