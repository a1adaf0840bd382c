"""Step times for the simulator: the exact batch mapped to representative ones, so that memoisation hits.

Decode contexts change every step and prompt lengths every request, so a cache keyed by the exact batch would
almost never hit. The simulator asks :class:`StepTimeModel` about representative batches instead:

- the ``n`` decodes all at their mean context, the time interpolated linearly between the grid values of
  :data:`DECODE_BITS` significant bits around it (steps of at most 1/8 of the value: 1024, 1152, 1280, …;
  attention reads keys in proportion to the context). In a decode-only step ``n`` stays exact, since CUDA-graph
  padding and GEMM shapes depend on it;
- with prompt chunks in the step, its two parts (servesim/serving/step_time.py) are interpolated apart. The time
  outside attention, a function of the step's tokens and requests only, bilinearly between those counts rounded
  down or up to :data:`PREFILL_BITS` and :data:`COUNT_BITS` significant bits. One layer's attention bilinearly
  between the four batches with every chunk rounded down or up to :data:`PREFILL_BITS` significant bits and the
  number of decodes rounded down or up to :data:`COUNT_BITS` significant bits (cached prefixes and the decodes'
  mean context rounded to the prefill grid). Such steps run without full CUDA graphs, and their time is close to linear
  in prompt tokens and in decodes between neighbouring grid points; a new prompt length then costs attention
  kernels only.

Lengths up to :data:`EXACT_BELOW` and decode counts up to :data:`EXACT_COUNT_BELOW` stay exact. docs/serving.md
gives the measured error of this approximation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
    requests = decodes + len(step.prefills)
    tokens = decodes + sum(p.new_tokens for p in step.prefills)
    plan = step_model.graph_plan(tokens, False)
    # Dense kernels see the tokens padded to a captured size (grid values above EXACT_BELOW are captured sizes).
    token_bounds = grid_bounds(plan.padded_tokens)
    request_bounds = grid_bounds(requests, COUNT_BITS, EXACT_COUNT_BELOW)
    # A grid request count above a grid token count cannot be; the requests part of the rest (LM head, sampling)
    # is then taken at as many requests as tokens.
    rest_us = _bilinear(lambda t, r: step_model.rest_time_us(t, min(r, t), False), token_bounds,
                        _weight(plan.padded_tokens, token_bounds), request_bounds, _weight(requests, request_bounds))

    context = round_length(step.decode_context_tokens // decodes, PREFILL_BITS) if decodes else 0
    cached = [round_length(p.cached_tokens, PREFILL_BITS) for p in step.prefills]
    bounds = [grid_bounds(p.new_tokens) for p in step.prefills]
    chunk_bounds = (sum(lo for lo, _ in bounds), sum(hi for _, hi in bounds))
    count_bounds = grid_bounds(decodes, COUNT_BITS, EXACT_COUNT_BELOW)

    def attention(high_tokens: bool, count: int) -> tuple[float, int]:
        # In a canonical order: the time does not depend on the order of the chunks, and the memo then hits.
        chunks = tuple(sorted((PrefillChunk(hi if high_tokens else lo, c) for (lo, hi), c in zip(bounds, cached)),
                              key=lambda chunk: (chunk.new_tokens, chunk.cached_tokens)))
        return step_model.layer_attention_us(BatchSpec(chunks, (context,) * count))

    (attention_us,) = _bilinear(lambda high, count: attention(high, count)[:1], (False, True),
                                _weight(tokens - decodes, chunk_bounds), count_bounds, _weight(decodes, count_bounds))
    time = step_model.compose(rest_us, attention_us, attention(False, count_bounds[0])[1], requests, plan.mode)
    return time.overhead_us, time.stage_us


def _weight(value: int, bounds: tuple[int, int]) -> float:
    """Where ``value`` lies between ``bounds``, 0 to 1 (0 when they are equal)."""
    low, high = bounds
    return (value - low) / (high - low) if high > low else 0.0


def _bilinear(at: Callable[[Any, Any], tuple[float, ...]], x_bounds: tuple, x_weight: float, y_bounds: tuple,
              y_weight: float) -> tuple[float, ...]:
    """``at`` interpolated bilinearly between the corners of ``x_bounds`` × ``y_bounds`` (a corner is only asked
    for when its weight is not 0)."""
    def along_x(y: Any) -> tuple[float, ...]:
        low = at(x_bounds[0], y)
        return _lerp(low, at(x_bounds[1], y), x_weight) if x_weight else low

    low = along_x(y_bounds[0])
    return _lerp(low, along_x(y_bounds[1]), y_weight) if y_weight else low


def _lerp(low: tuple[float, ...], high: tuple[float, ...], weight: float) -> tuple[float, ...]:
    return tuple(a + weight * (b - a) for a, b in zip(low, high))
