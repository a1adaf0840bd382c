"""Step times for the simulator: the exact batch mapped to representative ones, so that memoisation hits.

Decode contexts change every step and prompt lengths every request, so a cache keyed by the exact batch would
almost never hit. The simulator asks :class:`StepTimeModel` about representative batches instead:

- the ``n`` decodes all at their mean context, the time interpolated linearly between the grid values of
  :data:`DECODE_BITS` significant bits around it (steps of at most 1/8 of the value: 1024, 1152, 1280, …;
  attention reads keys in proportion to the context). In a decode-only step ``n`` stays exact, since CUDA-graph
  padding and GEMM shapes depend on it;
- with prompt chunks in the step, the time is interpolated bilinearly between the four batches with every chunk
  rounded down or up to :data:`PREFILL_BITS` significant bits and the number of decodes rounded down or up to
  :data:`COUNT_BITS` significant bits (such steps run outside CUDA graphs, and their time is close to linear in
  prompt tokens and in decodes between neighbouring grid points); cached prefixes and the decodes' mean context
  are rounded to the prefill grid.

Lengths up to :data:`EXACT_BELOW` and decode counts up to :data:`EXACT_COUNT_BELOW` stay exact. docs/serving.md
gives the measured error of this approximation.
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.serving.state import Step
from servesim.serving.step_time import StepTime, StepTimeModel

EXACT_BELOW = 64
DECODE_BITS = 3
PREFILL_BITS = 3
EXACT_COUNT_BELOW = 2
COUNT_BITS = 2


def _grid_step(tokens: int, bits: int) -> int:
    return 1 << max(0, tokens.bit_length() - bits)


def round_length(tokens: int, bits: int) -> int:
    """``tokens`` rounded to the nearest value with ``bits`` significant bits (exact up to :data:`EXACT_BELOW`)."""
    if tokens <= EXACT_BELOW:
        return tokens
    step = _grid_step(tokens, bits)
    return (tokens + step // 2) // step * step


def grid_bounds(tokens: int, bits: int = PREFILL_BITS, exact_below: int = EXACT_BELOW) -> tuple[int, int]:
    """The grid values around ``tokens`` (equal when it is on the grid or at most ``exact_below``)."""
    if tokens <= exact_below:
        return tokens, tokens
    step = _grid_step(tokens, bits)
    low = tokens // step * step
    return low, low if low == tokens else low + step


@dataclass(frozen=True)
class DecodeSpan:
    """Times of ``n`` decodes at the two grid contexts around a mean context, to interpolate between: every mean
    context from ``low_context`` up to the next grid value shares one."""

    low_context: int
    span: int  # to the next grid value; 0 for exact contexts
    overhead_us: float
    stage_us: tuple[float, ...]
    overhead_delta_us: float
    stage_delta_us: tuple[float, ...]

    def at(self, context: int) -> tuple[float, tuple[float, ...]]:
        """``(host overhead, per-stage GPU time)``, µs, at mean context ``context``."""
        w = (context - self.low_context) / self.span if self.span else 0.0
        return (self.overhead_us + w * self.overhead_delta_us,
                tuple(a + w * d for a, d in zip(self.stage_us, self.stage_delta_us)))


def decode_grid_low(context: int) -> int:
    """The grid context at or below ``context`` (itself up to :data:`EXACT_BELOW`)."""
    return grid_bounds(context, DECODE_BITS)[0]


def decode_span(step_model: StepTimeModel, num_decodes: int, context: int) -> DecodeSpan:
    """The :class:`DecodeSpan` of ``num_decodes`` decodes at mean context ``context``."""
    low = decode_grid_low(context)
    at_low = step_model.step_time_us(BatchSpec(decodes=(low,) * num_decodes))
    if context <= EXACT_BELOW:
        return DecodeSpan(low, 0, at_low.overhead_us, at_low.stage_us, 0.0, (0.0,) * len(at_low.stage_us))
    span = _grid_step(context, DECODE_BITS)
    at_high = step_model.step_time_us(BatchSpec(decodes=(low + span,) * num_decodes))
    return DecodeSpan(low, span, at_low.overhead_us, at_low.stage_us, at_high.overhead_us - at_low.overhead_us,
                      tuple(b - a for a, b in zip(at_low.stage_us, at_high.stage_us)))


def decode_step_time_us(step_model: StepTimeModel, num_decodes: int,
                        context_tokens: int) -> tuple[float, tuple[float, ...]]:
    """``(host overhead, per-stage GPU time)``, µs, of a step of ``num_decodes`` decodes holding
    ``context_tokens`` in total."""
    context = context_tokens // num_decodes
    return decode_span(step_model, num_decodes, context).at(context)


def step_time_us(step_model: StepTimeModel, step: Step) -> tuple[float, tuple[float, ...]]:
    """``(host overhead, per-stage GPU time)`` of ``step``, µs, from representative batches (memoised by the
    model)."""
    if not step.prefills:
        return decode_step_time_us(step_model, step.num_decodes, step.decode_context_tokens)
    decodes = step.num_decodes
    context = round_length(step.decode_context_tokens // decodes, PREFILL_BITS) if decodes else 0
    cached = [round_length(p.cached_tokens, PREFILL_BITS) for p in step.prefills]
    bounds = [grid_bounds(p.new_tokens) for p in step.prefills]
    count_bounds = grid_bounds(decodes, COUNT_BITS, EXACT_COUNT_BELOW)
    low_tokens = sum(lo for lo, _ in bounds)
    span = sum(hi for _, hi in bounds) - low_tokens
    w_tokens = (sum(p.new_tokens for p in step.prefills) - low_tokens) / span if span else 0.0
    count_span = count_bounds[1] - count_bounds[0]
    w_count = (decodes - count_bounds[0]) / count_span if count_span else 0.0

    def corner(high_tokens: bool, count: int) -> StepTime:
        # In a canonical order: the time does not depend on the order of the chunks, and the memo then hits.
        chunks = tuple(sorted((PrefillChunk(hi if high_tokens else lo, c) for (lo, hi), c in zip(bounds, cached)),
                              key=lambda chunk: (chunk.new_tokens, chunk.cached_tokens)))
        return step_model.step_time_us(BatchSpec(chunks, (context,) * count))

    def along_tokens(count: int) -> tuple[float, tuple[float, ...]]:
        low = corner(False, count)
        low_times = low.overhead_us, low.stage_us
        if not w_tokens:
            return low_times
        high = corner(True, count)
        return _mix(low_times, (high.overhead_us, high.stage_us), w_tokens)

    low = along_tokens(count_bounds[0])
    if not w_count:
        return low
    return _mix(low, along_tokens(count_bounds[1]), w_count)


def _mix(low: tuple[float, tuple[float, ...]], high: tuple[float, tuple[float, ...]],
         weight: float) -> tuple[float, tuple[float, ...]]:
    """``low`` moved ``weight`` of the way to ``high``, both ``(host overhead, per-stage times)``."""
    return low[0] + weight * (high[0] - low[0]), tuple(a + weight * (b - a) for a, b in zip(low[1], high[1]))
