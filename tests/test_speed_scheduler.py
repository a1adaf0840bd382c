"""The vLLM scheduler summarises its steps inline, for speed: the same summary as make_step's, every step."""

from __future__ import annotations

import pytest

from servesim.hardware import get_gpu
from servesim.models import get_model
from servesim.models.parallel import Parallelism
from servesim.serving import scheduler_vllm
from servesim.serving.deployment import build_deployment
from servesim.serving.simulator import simulate
from servesim.serving.state import schedule_requests
from servesim.workloads import build_workload

#: Leaves a few thousand KV tokens beside llama3-8b's weights, so that requests are preempted.
SMALL_MEMORY = 0.235


@pytest.mark.parametrize(("workload", "memory_fraction"), [
    ("splitwise-conv", 0.9),  # chunked prompts beside decodes
    ("splitwise-conv", SMALL_MEMORY),  # preemptions
    ("shared-prefix:4,8:1024:64:64", 0.9),  # prefix-cache hits at admission
])
def test_vllm_steps_summarised_as_make_step_would(monkeypatch, workload, memory_fraction):
    schedule = scheduler_vllm.VllmScheduler.schedule
    steps = []

    def checked(self):
        step = schedule(self)
        if step is not None:
            assert all(req.in_flight for req in step.requests)
            assert set(step.admitted) <= set(step.requests)
            decodes, contexts, longest, prefills = schedule_requests(list(step.requests), list(step.new_tokens))
            assert (step.num_decodes, step.decode_context_tokens, step.decode_max_context, step.prefills) == (
                decodes, contexts, longest, tuple(prefills))
            steps.append(step)
        return step

    monkeypatch.setattr(scheduler_vllm.VllmScheduler, "schedule", checked)
    deployment = build_deployment(get_model("llama3-8b"), get_gpu("H100"), Parallelism(1, 1), "vllm",
                                  estimator="roofline", memory_fraction=memory_fraction)
    # The Python loop (the compiled one serves this replica by default, tests/test_compiled_loop.py).
    result = simulate(deployment, build_workload(workload, 200, seed=1, qps=40), fast_forward_decodes=False)
    assert steps and any(step.prefills and step.num_decodes for step in steps)
    if memory_fraction == SMALL_MEMORY:
        assert result.preemptions.sum() > 0
    if workload.startswith("shared-prefix"):
        assert result.cached_tokens.sum() > 0
