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
    n = len(duration_cycles)
    if n == 0 or (duration_cycles[0] > 0 and np.all(duration_cycles == duration_cycles[0])):
        return np.arange(n) % sm_count  # equal work: a closed form (an all-empty grid is not, see below)
    first = min(n, sm_count * ctas_per_sm)
    # Slot j is the j-th slot filled: slot round j // sm_count on SM j % sm_count, so that ordering slots that free
    # at once by j orders them by round, then SM.
    later = duration_cycles[first:]
    has_work = later != 0
    taken_sm = _slots_taken(duration_cycles[:first], later[has_work]) % sm_count
    # An empty CTA (the blocks of a varlen grid past a short sequence) frees its slot again at once, leaving the
    # slots as they were: it lands on the slot the next CTA with work takes (after the last one, the first to free),
    # the one numbered by how many CTAs with work come before it.
    sm_of_task = np.empty(n, dtype=np.int64)
    sm_of_task[:first] = np.arange(first) % sm_count
    sm_of_task[first:] = taken_sm[np.cumsum(has_work) - has_work]
    return sm_of_task


def _slots_taken(first_cycles: np.ndarray, later_cycles: np.ndarray) -> np.ndarray:
    """The slot each task of ``later_cycles`` takes, in turn the one that frees first (ties: lowest slot), with slot
    j busy for ``first_cycles[j]`` at the start; and last, the slot that frees first after them all.

    A heap would take the tasks one at a time. Here they go a batch at a time: with the slots sorted by when they
    free, the next tasks take them in that order for as long as each slot frees strictly before every slot the
    batch has refilled so far (the first always does). Finish times are the same additions a heap makes, so the
    slots are the heap's, task for task; a batch is typically a wave of slots."""
    finish = first_cycles.copy()
    taken = np.empty(len(later_cycles) + 1, dtype=np.int64)
    start = 0
    while start < len(later_cycles):
        order = np.argsort(finish, kind="stable")
        frees = finish[order]
        size = min(len(order), len(later_cycles) - start)
        refilled = frees[:size] + later_cycles[start:start + size]
        in_turn = frees[1:size] < np.minimum.accumulate(refilled[:size - 1])
        if not in_turn.all():
            size = 1 + int(np.argmin(in_turn))
        taken[start:start + size] = order[:size]
        finish[order[:size]] = refilled[:size]
        start += size
    taken[-1] = np.argmin(finish)
    return taken


def min_heap(duration_cycles: np.ndarray, grid_ctas: int) -> np.ndarray:
    """CTA of each task under longest-first least-loaded assignment (ties: lowest CTA index): a CTA's load is when
    it would free, so the tasks, longest first, each take the CTA that frees first. Empty tasks come last and add
    nothing: they all go to the CTA least loaded after the others."""
    order = np.argsort(-duration_cycles, kind="stable")
    durations = duration_cycles[order]
    with_work = np.count_nonzero(durations)
    taken = _slots_taken(np.zeros(max(grid_ctas, 1)), durations[:with_work])
    cta = np.empty(len(order), dtype=np.int64)
    cta[order[:with_work]] = taken[:-1]
    cta[order[with_work:]] = taken[-1]
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
