"""Random workloads for the simulator's property tests (tests/test_serving_simulator.py,
tests/test_compiled_loop.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from servesim.workloads import Workload


def make_workload(prompts, outputs, arrivals=None, concurrency=None) -> Workload:
    """A workload of these prompt and output lengths, arriving at ``arrivals`` (sorted; all at 0 when None), a
    closed loop of ``concurrency`` clients when given."""
    arrivals = np.zeros(len(prompts)) if arrivals is None else np.sort(arrivals)
    mode = "closed" if concurrency else "open"
    return Workload("test", np.array(prompts), np.array(outputs), arrivals, arrival_mode=mode, concurrency=concurrency)


def workload_specs(max_requests: int, max_output: int, max_concurrency: int):
    """(prompts, outputs, arrivals within 2 s, concurrency or None) of 1 to ``max_requests`` requests, prompts of up
    to 3,000 tokens, outputs of up to ``max_output``, for :func:`make_workload`."""
    return st.integers(1, max_requests).flatmap(lambda n: st.tuples(
        st.lists(st.integers(1, 3000), min_size=n, max_size=n),
        st.lists(st.integers(1, max_output), min_size=n, max_size=n),
        st.lists(st.floats(0, 2), min_size=n, max_size=n),
        st.one_of(st.none(), st.integers(1, max_concurrency)),
    ))
