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

from servesim.compiled import jit, stable_argsort
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
    later = np.empty(n - first)  # the later tasks with work, in order
    kept = 0
    for i in range(first, n):
        if duration_cycles[i] != 0:
            later[kept] = duration_cycles[i]
            kept += 1
    taken = _slots_taken(duration_cycles[:first], later[:kept])
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
    j busy for ``first_cycles[j]`` at the start; and last, the slot that frees first after them all.

    A heap takes a task in its depth (log2 of the slots); runs of equal tasks (:func:`_slots_taken_by_runs`) take
    a task in a few steps but each run a pass over the slots, so they win where runs average more than the slots
    over the heap's depth: MinHeap's tasks, sorted by duration, whose heads repeat every tile. The two give the
    same slots."""
    slots, tasks = len(first_cycles), len(later_cycles)
    runs = 1
    for task in range(1, tasks):
        runs += later_cycles[task] != later_cycles[task - 1]
    if tasks * (np.log2(max(slots, 2)) - 1) > runs * slots:
        return _slots_taken_by_runs(first_cycles, later_cycles)
    return _slots_taken_by_heap(first_cycles, later_cycles)


@jit
def _slots_taken_by_heap(first_cycles: np.ndarray, later_cycles: np.ndarray) -> np.ndarray:
    """:func:`_slots_taken` with a binary heap of (free time, slot) pairs: a task costs the heap's depth."""
    free_s = first_cycles.copy()  # the heap's free times, and the slots beside them
    slot_at = np.arange(len(free_s))
    for position in range(len(free_s) // 2 - 1, -1, -1):
        _sift_down(free_s, slot_at, position, free_s[position], slot_at[position])
    taken = np.empty(len(later_cycles) + 1, dtype=np.int64)
    for i in range(len(later_cycles)):
        slot = slot_at[0]
        taken[i] = slot
        _sift_down(free_s, slot_at, 0, free_s[0] + later_cycles[i], slot)
    taken[-1] = slot_at[0]
    return taken


@jit
def _sift_down(free_s: np.ndarray, slot_at: np.ndarray, position: int, free: float, slot: int) -> None:
    """Put the pair (``free``, ``slot``) at ``position`` of the heap and move it down to where it belongs."""
    size = len(free_s)
    while True:
        child = 2 * position + 1
        if child >= size:
            break
        child_free, child_slot = free_s[child], slot_at[child]
        other = child + 1
        if other < size and (free_s[other] < child_free
                             or (free_s[other] == child_free and slot_at[other] < child_slot)):
            child, child_free, child_slot = other, free_s[other], slot_at[other]
        if child_free < free or (child_free == free and child_slot < slot):
            free_s[position], slot_at[position] = child_free, child_slot
            position = child
        else:
            break
    free_s[position], slot_at[position] = free, slot


@jit
def _slots_taken_by_runs(first_cycles: np.ndarray, later_cycles: np.ndarray) -> np.ndarray:
    """:func:`_slots_taken` a run of equal tasks at a time: with the slots sorted by (free time, slot), a run's
    tasks take the earlier of the next sorted slot and the first slot the run has refilled (refilled slots queue in
    the order they were taken, which is their order again: each frees one task later than it was taken, and the
    taken ones free ever later), and the queue and the slots not taken are merged back in order when the run
    ends: a run costs its tasks plus one pass over the slots."""
    slots = len(first_cycles)
    sorted_slot = stable_argsort(first_cycles, False)  # stable: equal free times by slot
    sorted_free = np.empty(slots)
    for i in range(slots):
        sorted_free[i] = first_cycles[sorted_slot[i]]
    queue_free, queue_slot = np.empty(slots), np.empty(slots, dtype=np.int64)  # a ring of refilled slots
    merged_free, merged_slot = np.empty(slots), np.empty(slots, dtype=np.int64)
    taken = np.empty(len(later_cycles) + 1, dtype=np.int64)
    start = 0
    while start < len(later_cycles):
        cycles = later_cycles[start]
        end = start + 1
        while end < len(later_cycles) and later_cycles[end] == cycles:
            end += 1
        next_sorted = head = queued = 0
        for task in range(start, end):
            free, slot, head, queued, next_sorted = _take_earliest(queue_free, queue_slot, head, queued, sorted_free,
                                                                   sorted_slot, next_sorted)
            taken[task] = slot
            # Queue it at the back; a refill rounded to the same free time as the slot before it goes in slot order.
            refilled = free + cycles
            position = (head + queued) % slots
            queued += 1
            while position != head:
                before = (position - 1) % slots
                if queue_free[before] != refilled or queue_slot[before] < slot:
                    break
                queue_free[position], queue_slot[position] = queue_free[before], queue_slot[before]
                position = before
            queue_free[position], queue_slot[position] = refilled, slot
        for merged in range(slots):
            merged_free[merged], merged_slot[merged], head, queued, next_sorted = _take_earliest(
                queue_free, queue_slot, head, queued, sorted_free, sorted_slot, next_sorted)
        sorted_free, merged_free = merged_free, sorted_free
        sorted_slot, merged_slot = merged_slot, sorted_slot
        start = end
    taken[-1] = sorted_slot[0]
    return taken


@jit
def _take_earliest(queue_free: np.ndarray, queue_slot: np.ndarray, head: int, queued: int, sorted_free: np.ndarray,
                   sorted_slot: np.ndarray, next_sorted: int) -> tuple[float, int, int, int, int]:
    """Take the earlier of the refilled queue's head and the next sorted slot (:func:`_slots_taken_by_runs`): its
    free time and slot, then the queue's head and length and the sorted position after taking it."""
    if queued and (next_sorted == len(sorted_free) or _before(queue_free[head], queue_slot[head],
                                                             sorted_free[next_sorted], sorted_slot[next_sorted])):
        return queue_free[head], queue_slot[head], (head + 1) % len(queue_free), queued - 1, next_sorted
    return sorted_free[next_sorted], sorted_slot[next_sorted], head, queued, next_sorted + 1


@jit
def _before(free: float, slot: int, other_free: float, other_slot: int) -> bool:
    """Whether a slot that frees at ``free`` comes before the other (the earlier, then the lower slot)."""
    return free < other_free or (free == other_free and slot < other_slot)


def min_heap(duration_cycles: np.ndarray, grid_ctas: int, repeats: int = 1) -> np.ndarray:
    """CTA of each task under longest-first least-loaded assignment (ties: lowest CTA index): a CTA's load is when
    it would free, so the tasks, longest first, each take the CTA that frees first. Empty tasks come last and add
    nothing: they all go to the CTA least loaded after the others. ``repeats``: the tasks are that many copies of
    one block (attention's heads), whose order is then sorted once."""
    return _min_heap(np.asarray(duration_cycles, dtype=np.float64), grid_ctas, repeats)


@jit
def _min_heap(duration_cycles: np.ndarray, grid_ctas: int, repeats: int) -> np.ndarray:
    order = _longest_first(duration_cycles, repeats)
    durations = np.empty(len(order))
    with_work = 0
    for i in range(len(order)):
        durations[i] = duration_cycles[order[i]]
        with_work += durations[i] != 0
    # Every CTA is empty at first, so the first wave of tasks takes CTA i for task i (ties: lowest CTA).
    first = min(with_work, grid_ctas)
    loads = np.zeros(max(grid_ctas, 1))
    for i in range(first):
        loads[i] = durations[i]
    taken = _slots_taken(loads, durations[first:with_work])
    cta = np.empty(len(order), dtype=np.int64)
    for i in range(len(order)):
        cta[order[i]] = i if i < first else taken[min(i, with_work) - first]
    return cta


@jit
def _longest_first(duration_cycles: np.ndarray, repeats: int) -> np.ndarray:
    """Task indices by decreasing duration, ties in launch order (a stable sort). For ``repeats`` copies of one
    block the block is sorted alone: equal durations then come copy after copy, each copy's in block order."""
    block = len(duration_cycles) // repeats
    block_order = stable_argsort(duration_cycles[:block], True)
    if repeats == 1:
        return block_order
    order = np.empty(len(duration_cycles), dtype=np.int64)
    i = run_start = 0
    while run_start < block:
        run_end = run_start + 1
        value = duration_cycles[block_order[run_start]]
        while run_end < block and duration_cycles[block_order[run_end]] == value:
            run_end += 1
        for repeat in range(repeats):
            for j in range(run_start, run_end):
                order[i] = block_order[j] + repeat * block
                i += 1
        run_start = run_end
    return order


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
        sm = min_heap(durations, launch.grid_ctas, launch.tasks.repeats) % gpu.sm_count
    elif launch.policy == STATIC_PERSISTENT:
        sm = static_persistent(len(durations), launch.grid_ctas) % gpu.sm_count
    else:
        raise ValueError(f"unknown scheduling policy {launch.policy!r}")
    return Partition(sm, gpu.sm_count, ctas_per_sm)


__all__ = ["Partition", "min_heap", "round_robin", "schedule", "static_persistent"]
