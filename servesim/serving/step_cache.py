"""Step times for the simulator: the exact batch mapped to representative ones, so that memoisation hits.

Decode contexts change every step and prompt lengths every request, so a cache keyed by the exact batch would
almost never hit. The simulator asks :class:`StepTimeModel` about representative batches instead:

- the ``n`` decodes all at their mean context, rounded to the nearest value with :data:`DECODE_BITS`
  significant bits (steps of at most 1/16 of the value: 1024, 1088, 1152, …). ``n`` stays exact, since CUDA-graph
  padding and GEMM shapes depend on it;
- with prompt chunks in the step, the time is interpolated linearly between the batch with every chunk rounded
  down and the one with every chunk rounded up to :data:`PREFILL_BITS` significant bits (prefill time is close to
  linear in tokens between neighbouring grid points), cached prefixes and the decodes' mean context rounded to that
  grid too.

Lengths up to :data:`EXACT_BELOW` stay exact. docs/serving.md gives the measured error of this approximation.
"""

from __future__ import annotations

from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.serving.state import Step
from servesim.serving.step_time import StepTime, StepTimeModel

EXACT_BELOW = 64
DECODE_BITS = 4
PREFILL_BITS = 3


def _grid_step(tokens: int, bits: int) -> int:
    return 1 << max(0, tokens.bit_length() - bits)


def round_length(tokens: int, bits: int = DECODE_BITS) -> int:
    """``tokens`` rounded to the nearest value with ``bits`` significant bits (exact up to :data:`EXACT_BELOW`)."""
    if tokens <= EXACT_BELOW:
        return tokens
    step = _grid_step(tokens, bits)
    return (tokens + step // 2) // step * step


def grid_bounds(tokens: int, bits: int = PREFILL_BITS) -> tuple[int, int]:
    """The grid values around ``tokens`` (equal when it is on the grid or at most :data:`EXACT_BELOW`)."""
    if tokens <= EXACT_BELOW:
        return tokens, tokens
    step = _grid_step(tokens, bits)
    low = tokens // step * step
    return low, low if low == tokens else low + step


def _decodes(step: Step, bits: int) -> tuple[int, ...]:
    n = step.num_decodes
    return (round_length(step.decode_context_tokens // n, bits),) * n if n else ()


def step_time_us(step_model: StepTimeModel, step: Step) -> tuple[float, tuple[float, ...]]:
    """``(host overhead, per-stage GPU time)`` of ``step``, µs, from representative batches (memoised by the
    model)."""
    if not step.prefills:
        time = step_model.step_time_us(BatchSpec(decodes=_decodes(step, DECODE_BITS)))
        return time.overhead_us, time.stage_us
    decodes = _decodes(step, PREFILL_BITS)
    cached = [round_length(p.cached_tokens, PREFILL_BITS) for p in step.prefills]
    bounds = [grid_bounds(p.new_tokens) for p in step.prefills]
    low = step_model.step_time_us(BatchSpec(tuple(PrefillChunk(lo, c) for (lo, _), c in zip(bounds, cached)), decodes))
    low_tokens = sum(lo for lo, _ in bounds)
    span = sum(hi for _, hi in bounds) - low_tokens
    if span == 0:
        return low.overhead_us, low.stage_us
    high = step_model.step_time_us(BatchSpec(tuple(PrefillChunk(hi, c) for (_, hi), c in zip(bounds, cached)), decodes))
    w = (sum(p.new_tokens for p in step.prefills) - low_tokens) / span
    stages = tuple(a + w * (b - a) for a, b in zip(low.stage_us, high.stage_us))
    return low.overhead_us + w * (high.overhead_us - low.overhead_us), stages
