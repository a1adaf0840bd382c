"""Random workloads for the simulator's property tests (tests/test_serving_simulator.py,
tests/test_compiled_loop.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import strategies as st

from servesim.workloads import Workload
from servesim.workloads.prefix import UNIQUE, PromptSegments


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


#: Segment ids that prompts share, two of them also naming answers (a later prompt then quotes an earlier answer),
#: and token counts few enough that equal segments recur, the answers' among them.
_SHARED_IDS = (UNIQUE, 0, 1, 2, 100, 101)
_SEGMENT_TOKENS = (16, 40, 64, 150, 700, 1500)
_OUTPUT_TOKENS = (16, 40, 64, 150, 400)


def prefix_workload_specs(max_requests: int, max_concurrency: int):
    """(requests, arrivals within 0.3 s, concurrency or None) for :func:`make_prefix_workload`: each request one to
    three segments (id, tokens), its output tokens and its answer's id. The arrivals are close enough for the
    requests to hold more KV at once than a small pool has, which preempts and evicts."""
    request = st.tuples(st.lists(st.tuples(st.sampled_from(_SHARED_IDS), st.sampled_from(_SEGMENT_TOKENS)),
                                 min_size=1, max_size=3),
                        st.sampled_from(_OUTPUT_TOKENS), st.sampled_from((UNIQUE, 100, 101)))
    return st.integers(1, max_requests).flatmap(lambda n: st.tuples(
        st.lists(request, min_size=n, max_size=n),
        st.lists(st.floats(0, 0.3), min_size=n, max_size=n),
        st.one_of(st.none(), st.integers(1, max_concurrency)),
    ))


def make_prefix_workload(requests, arrivals, concurrency) -> Workload:
    """A workload whose prompts are the requests' segments (see :func:`prefix_workload_specs`)."""
    segments = [segment for prompt, _, _ in requests for segment in prompt]
    prefixes = PromptSegments(np.cumsum([0] + [len(prompt) for prompt, _, _ in requests]),
                              [segment_id for segment_id, _ in segments], [tokens for _, tokens in segments],
                              [answer for _, _, answer in requests])
    workload = make_workload(prefixes.prompt_tokens(), [output for _, output, _ in requests], arrivals, concurrency)
    return dataclasses.replace(workload, prefixes=prefixes)
