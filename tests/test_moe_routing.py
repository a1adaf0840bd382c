"""How a step's tokens spread over an MoE layer's experts: each token picks its experts on its own, so a
decode-sized batch reaches fewer experts than an even spread of its (token, choice) pairs would."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servesim.hardware import get_gpu
from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.kernels.expand import expand, reached_experts
from servesim.kernels.types import FusedMoE
from servesim.models import get_model


@given(st.integers(1, 20_000), st.sampled_from([(2, 8), (4, 32), (4, 128), (8, 128), (8, 256)]))
def test_reached_experts_is_the_expected_occupancy(tokens: int, routing: tuple[int, int]) -> None:
    top_k, experts = routing
    reached = reached_experts(tokens, top_k, experts)
    assert top_k <= reached <= min(experts, tokens * top_k)
    assert abs(reached - experts * (1 - (1 - top_k / experts) ** tokens)) <= 1
    assert reached_experts(tokens + 1, top_k, experts) >= reached


@pytest.mark.parametrize(("tokens", "reached"), [(1, 4), (32, 82), (4096, 128)])
def test_a_decode_batch_reads_fewer_experts_than_a_prefill(tokens: int, reached: int) -> None:
    # gpt-oss-120b routes top-4 over 128 experts: 32 tokens reach about 82 of them, a prefill reaches all.
    model = get_model("gpt-oss-120b")
    batch = BatchSpec(decodes=(1024,) * tokens) if tokens <= 512 else BatchSpec(prefills=(PrefillChunk(tokens, 0),))
    step = expand("vllm", model, get_gpu("H200"), batch, 1, 1, 0, "mxfp4")
    experts = {op for run in step.runs for op in run.ops if isinstance(op, FusedMoE)}
    assert {(op.active_experts(), op.routed_pairs()) for op in experts} == {(reached, step.padded_tokens * 4)}
