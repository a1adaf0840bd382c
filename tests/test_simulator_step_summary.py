"""The vLLM scheduler sums up the step it forms while forming it: the summary must be make_step's, read from the
scheduled requests once scheduling is done, and the finished step's token times those of a plain buffer."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.hardware import get_gpu
from servesim.models import get_model
from servesim.models.parallel import Parallelism
from servesim.serving.deployment import build_deployment
from servesim.serving.scheduler_vllm import VllmScheduler
from servesim.serving.simulator import simulate
from servesim.serving.state import make_step
from servesim.serving.step_time import StepTimeModel
from servesim.workloads import build_workload

FIELDS = ("requests", "new_tokens", "num_decodes", "decode_context_tokens", "decode_max_context", "prefills")
SMALL_MEMORY = 0.235  # a few thousand KV tokens beside llama3-8b's weights: preemptions


@pytest.mark.parametrize("spec, small", [
    ("splitwise-conv", True),
    ("splitwise-code", False),
    ("chat-shared-prefix", False),
    ("shared-prefix:8,16:2048:128:256", True),
])
@pytest.mark.parametrize("fast_forward", [True, False])
def test_scheduled_step_summary_is_make_steps(monkeypatch, spec, small, fast_forward):
    schedule = VllmScheduler.schedule
    checked = []

    def checking(self):
        step = schedule(self)
        if step is not None:
            made = make_step(list(step.requests), list(step.new_tokens))
            assert [getattr(step, f) for f in FIELDS] == [getattr(made, f) for f in FIELDS]
            checked.append(bool(step.prefills) + 2 * bool(step.num_decodes))
        return step

    monkeypatch.setattr(VllmScheduler, "schedule", checking)
    overrides = {"memory_fraction": SMALL_MEMORY, "max_num_batched_tokens": 1024} if small else {}
    dep = build_deployment(get_model("llama3-8b"), get_gpu("H100"), Parallelism(1, 1), "vllm",
                           estimator="roofline", **overrides)
    workload = build_workload(spec, 150, qps=30.0, seed=2)
    result = simulate(dep, workload, step_model=StepTimeModel(dep), fast_forward_decodes=fast_forward)
    assert set(checked) >= {1, 2, 3}  # prefill-only, decode-only and mixed steps were all checked
    if small:
        assert result.preemptions.sum() > 0
    # Token times: each request's are in order and as many as its output.
    np.testing.assert_array_equal(np.diff(result.token_offsets), workload.output_tokens)
    for i in range(len(result)):
        assert (np.diff(result.token_times_s[result.token_offsets[i]:result.token_offsets[i + 1]]) >= 0).all()
