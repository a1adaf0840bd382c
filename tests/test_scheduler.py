"""SM scheduling: every task placed exactly once, round-robin and MinHeap behaving as the hardware and the
persistent kernels do."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.decompose import decompose
from servesim.hardware import get_gpu
from servesim.kernels.types import AttentionPrefill, Gemm
from servesim.scheduler import _slots_taken_by_heap, _slots_taken_by_runs, min_heap, round_robin, schedule

H100, A100 = get_gpu("H100-SXM"), get_gpu("A100-SXM-80GB")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 1e6), max_size=300), st.integers(1, 16), st.integers(1, 4))
def test_round_robin_places_every_task_once_on_a_real_sm(durations, sm_count, ctas_per_sm):
    sm = round_robin(np.array(durations), sm_count, ctas_per_sm)
    assert len(sm) == len(durations) and (len(sm) == 0 or (sm.min() >= 0 and sm.max() < sm_count))


def _earliest_free_slot_one_task_at_a_time(durations: np.ndarray, sm_count: int, ctas_per_sm: int) -> list[int]:
    """The definition of the hardware scheduler: the first CTAs fill one slot per SM per round, then each CTA
    takes the slot that frees first (ties: earliest round, then lowest SM)."""
    slots = [(0.0, j // sm_count, j % sm_count) for j in range(sm_count * ctas_per_sm)]
    sm = []
    for j, duration in enumerate(durations.tolist()):
        k = j if j < len(slots) else min(range(len(slots)), key=lambda i: slots[i])
        finish, slot, s = slots[k]
        sm.append(s)
        slots[k] = (finish + duration, slot, s)
    return sm


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0, 3.25, 40.0]), max_size=120), st.integers(1, 12),
       st.integers(1, 3))
def test_round_robin_gives_each_cta_the_slot_that_frees_first(durations, sm_count, ctas_per_sm):
    d = np.array(durations)
    assert round_robin(d, sm_count, ctas_per_sm).tolist() == _earliest_free_slot_one_task_at_a_time(
        d, sm_count, ctas_per_sm)


def test_round_robin_first_rounds_one_cta_per_sm_then_freed_slots():
    sm = round_robin(np.array([5.0, 1.0, 9.0, 2.0, 1.0, 1.0]), sm_count=3, ctas_per_sm=1)
    # tasks 0..2 on SMs 0..2; SM 1 frees at t=1, 3 and 4, each time before SM 0 (t=5), so it takes tasks 3..5
    assert sm.tolist() == [0, 1, 2, 1, 1, 1]


def test_equal_tasks_round_robin_is_modulo_sm_count():
    assert round_robin(np.full(10, 7.0), 4, 2).tolist() == [j % 4 for j in range(10)]


def test_min_heap_balances_longest_first():
    cta = min_heap(np.array([1.0, 8.0, 3.0, 4.0, 4.0]), 2)
    loads = np.bincount(cta, weights=[1.0, 8.0, 3.0, 4.0, 4.0], minlength=2)
    # longest first: 8 -> CTA 0, 4 and 4 -> CTA 1, 3 -> CTA 0 (tie, lowest index), 1 -> CTA 1
    assert loads.tolist() == [11.0, 9.0]
    assert cta[1] == 0  # the longest unit goes to the first CTA


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.1, 100), min_size=1, max_size=200), st.integers(1, 20))
def test_min_heap_covers_every_task_once_within_lpt_bound(durations, ctas):
    d = np.array(durations)
    cta = min_heap(d, ctas)
    loads = np.bincount(cta, weights=d, minlength=ctas)
    assert len(cta) == len(d) and cta.max() < ctas
    assert loads.max() <= d.sum() / ctas + d.max() + 1e-9  # list scheduling bound


def _least_loaded_one_task_at_a_time(durations: np.ndarray, ctas: int) -> list[int]:
    """The definition of MinHeap: longest first, each task to the least-loaded CTA, lowest index on ties."""
    loads = [0.0] * ctas
    cta = [0] * len(durations)
    for j in np.argsort(-durations, kind="stable"):
        c = min(range(ctas), key=lambda k: (loads[k], k))
        cta[j] = c
        loads[c] += float(durations[j])
    return cta


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1e-3, 0.5, 3.25, 7.0, 1e20]), max_size=200), st.integers(1, 40))
def test_min_heap_assigns_runs_of_equal_tasks_exactly_as_one_at_a_time(durations, ctas):
    d = np.array(durations)
    assert min_heap(d, ctas).tolist() == _least_loaded_one_task_at_a_time(d, ctas)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1e-3, 0.5, 3.25, 7.0]), max_size=60), st.integers(1, 8), st.integers(1, 40))
def test_min_heap_of_repeated_blocks_sorts_one_block_to_the_same_assignment(block, repeats, ctas):
    d = np.tile(np.array(block), repeats)
    assert min_heap(d, ctas, repeats).tolist() == _least_loaded_one_task_at_a_time(d, ctas)


def _slot_that_frees_first_one_task_at_a_time(first: np.ndarray, later: np.ndarray) -> list[int]:
    """The definition of both schedulers' core: each task to the slot that frees first, lowest slot on ties."""
    free = first.tolist()
    taken = []
    for cycles in later.tolist():
        slot = min(range(len(free)), key=lambda j: (free[j], j))
        taken.append(slot)
        free[slot] += cycles
    return taken + [min(range(len(free)), key=lambda j: (free[j], j))]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.5, 7.0, 1e20, 1e20 + 2 ** 17]), min_size=1, max_size=40),
       st.lists(st.tuples(st.sampled_from([1e-3, 0.5, 1.0, 3.25, 1e20]), st.integers(1, 60)), max_size=8))
def test_heap_and_runs_of_equal_tasks_take_the_slots_the_definition_gives(first, runs):
    # 1e20 + 0.5 rounds back to 1e20, so refilled slots tie with slots not yet taken
    later = np.array([cycles for cycles, count in runs for _ in range(count)], dtype=np.float64)
    first = np.array(first)
    expected = _slot_that_frees_first_one_task_at_a_time(first, later)
    assert _slots_taken_by_heap(first, later).tolist() == expected
    assert _slots_taken_by_runs(first, later).tolist() == expected


def test_partitions_cover_every_task_exactly_once():
    prefill = dict(query_lens=(500, 3000), kv_lens=(500, 3000), num_heads=32, num_kv_heads=8, head_dim=128)
    runs = [(Gemm(m=1000, n=3000, k=1000), (H100, A100)), (AttentionPrefill(**prefill, backend="fa2"), (H100, A100)),
            (AttentionPrefill(**prefill, backend="flashinfer"), (H100, A100)),
            (AttentionPrefill(**prefill, backend="fa3"), (H100,))]  # FA3 is Hopper-only
    for kernel, gpus in runs:
        for gpu in gpus:
            for launch in decompose(kernel, gpu):
                part = schedule(launch, gpu)
                assert part.tasks_per_sm().sum() == launch.tasks.size
                assert part.per_sm(launch.tasks.demand["tensor"]).sum() == launch.tasks.demand["tensor"].sum()


def test_causal_prefill_busiest_sm_works_above_the_mean():
    kernel = AttentionPrefill(query_lens=(4096,), kv_lens=(4096,), num_heads=8, num_kv_heads=8, head_dim=128,
                              backend="fa2")
    (launch,) = decompose(kernel, A100)
    busy = schedule(launch, A100).per_sm(launch.tasks.duration_cycles)
    assert busy.max() > 1.05 * busy.mean()
