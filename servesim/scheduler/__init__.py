"""SynPerf's M(T, S): which SM runs each task.

* Hardware round-robin (classic grids): CTAs are dispatched in launch order, one per SM per round until every SM
  holds ``ctas_per_sm``; afterwards each freed slot takes the next CTA. A task's duration is its theoretical
  cycles. Equal durations make this exactly ``task mod sm_count``, which is used without simulating.
* MinHeap (persistent attention, FlashInfer's SM90 plan and FA3's dynamic tile scheduler): work units, longest
  first, each go to the CTA with the least accumulated work.
* Static persistent (Hopper GEMM tile scheduler): tile t to CTA t mod grid.

Persistent CTAs fit in one wave (grid <= SMs x occupancy), so CTA c lives on SM c mod sm_count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servesim.compiled import jit
from servesim.decompose.launch import MIN_HEAP, ROUND_ROBIN, STATIC_PERSISTENT, Launch, occupancy
from servesim.hardware import GpuSpec


@dataclass(frozen=True, eq=False)
class Partition:
    """The per-SM partition of one launch's tasks."""

    sm_of_task: np.ndarray  # (n_tasks,) int
    sm_count: int
    ctas_per_sm: int

    def tasks_per_sm(self) -> np.ndarray:
        return np.bincount(self.sm_of_task, minlength=self.sm_count)

    def per_sm(self, values: np.ndarray) -> np.ndarray:
        """Sum of a per-task quantity on each SM."""
        return np.bincount(self.sm_of_task, weights=values, minlength=self.sm_count)


def round_robin(duration_cycles: np.ndarray, sm_count: int, ctas_per_sm: int) -> np.ndarray:
    """SM of each task under the hardware block scheduler (ties: earliest slot round first, then lowest SM)."""
    return _round_robin(np.asarray(duration_cycles, dtype=np.float64), sm_count, ctas_per_sm)


@jit
def _round_robin(duration_cycles: np.ndarray, sm_count: int, ctas_per_sm: int) -> np.ndarray:
    n = len(duration_cycles)
    sm_of_task = np.empty(n, dtype=np.int64)
    uniform = n == 0 or duration_cycles[0] > 0
    for i in range(1, n):
        if not uniform:
            break
        uniform = duration_cycles[i] == duration_cycles[0]
    first = n if uniform else min(n, sm_count * ctas_per_sm)
    # Equal work: a closed form (an all-empty grid is not, see below).
    for i in range(first):
        sm_of_task[i] = i % sm_count
    if first == n:
        return sm_of_task
    # Slot j is the j-th slot filled: slot round j // sm_count on SM j % sm_count, so that ordering slots that free
    # at once by j orders them by round, then SM.
    later = duration_cycles[first:]
    taken = _slots_taken(duration_cycles[:first], later[later != 0])
    # An empty CTA (the blocks of a varlen grid past a short sequence) frees its slot again at once, leaving the
    # slots as they were: it lands on the slot the next CTA with work takes (after the last one, the first to free).
    with_work = 0
    for i in range(first, n):
        sm_of_task[i] = taken[with_work] % sm_count
        with_work += duration_cycles[i] != 0
    return sm_of_task


@jit
def _slots_taken(first_cycles: np.ndarray, later_cycles: np.ndarray) -> np.ndarray:
    """The slot each task of ``later_cycles`` takes, in turn the one that frees first (ties: lowest slot), with slot
    j busy for ``first_cycles[j]`` at the start; and last, the slot that frees first after them all. A binary heap
    of the slots ordered by (free time, slot)."""
    finish = first_cycles.copy()
    slots = len(finish)
    heap = np.arange(slots)
    for position in range(slots // 2 - 1, -1, -1):
        _sift_down(heap, finish, position)
    taken = np.empty(len(later_cycles) + 1, dtype=np.int64)
    for i in range(len(later_cycles)):
        slot = heap[0]
        taken[i] = slot
        finish[slot] = finish[slot] + later_cycles[i]
        _sift_down(heap, finish, 0)
    taken[-1] = heap[0]
    return taken


@jit
def _sift_down(heap: np.ndarray, finish: np.ndarray, position: int) -> None:
    """Restore the heap order below ``position`` (the slot there may free later than its children)."""
    slot = heap[position]
    size = len(heap)
    while True:
        child = 2 * position + 1
        if child >= size:
            break
        other = child + 1
        if other < size and (finish[heap[other]], heap[other]) < (finish[heap[child]], heap[child]):
            child = other
        if (finish[heap[child]], heap[child]) < (finish[slot], slot):
            heap[position] = heap[child]
            position = child
        else:
            break
    heap[position] = slot


def min_heap(duration_cycles: np.ndarray, grid_ctas: int) -> np.ndarray:
    """CTA of each task under longest-first least-loaded assignment (ties: lowest CTA index): a CTA's load is when
    it would free, so the tasks, longest first, each take the CTA that frees first. Empty tasks come last and add
    nothing: they all go to the CTA least loaded after the others."""
    return _min_heap(np.asarray(duration_cycles, dtype=np.float64), grid_ctas)


@jit
def _min_heap(duration_cycles: np.ndarray, grid_ctas: int) -> np.ndarray:
    order = np.argsort(-duration_cycles, kind="mergesort")  # stable: ties keep launch order
    durations = duration_cycles[order]
    with_work = 0
    for duration in durations:
        with_work += duration != 0
    taken = _slots_taken(np.zeros(max(grid_ctas, 1)), durations[:with_work])
    cta = np.empty(len(order), dtype=np.int64)
    for i in range(len(order)):
        cta[order[i]] = taken[min(i, with_work)]
    return cta


def static_persistent(n_tasks: int, grid_ctas: int) -> np.ndarray:
    """CTA of each tile under a static persistent raster: tile t to CTA t mod grid."""
    return np.arange(n_tasks) % max(grid_ctas, 1)


def schedule(launch: Launch, gpu: GpuSpec) -> Partition:
    """Partition ``launch``'s tasks over ``gpu``'s SMs by the launch's policy."""
    ctas_per_sm = occupancy(launch.config, gpu).ctas_per_sm
    durations = launch.tasks.duration_cycles
    if launch.policy == ROUND_ROBIN:
        sm = round_robin(durations, gpu.sm_count, ctas_per_sm)
    elif launch.policy == MIN_HEAP:
        sm = min_heap(durations, launch.grid_ctas) % gpu.sm_count
    elif launch.policy == STATIC_PERSISTENT:
        sm = static_persistent(len(durations), launch.grid_ctas) % gpu.sm_count
    else:
        raise ValueError(f"unknown scheduling policy {launch.policy!r}")
    return Partition(sm, gpu.sm_count, ctas_per_sm)


__all__ = ["Partition", "min_heap", "round_robin", "schedule", "static_persistent"]
