"""Step times for the simulator: the exact batch mapped to representative ones, so that memoisation hits.

Decode contexts change every step and prompt lengths every request, so a cache keyed by the exact batch would
almost never hit. The simulator asks :class:`StepTimeModel` about representative batches instead:

- the ``n`` decodes at their mean context, but for the longest, which keeps its distance above the mean rounded
  to :data:`SPREAD_BITS` significant bits (:func:`representative_decodes`); the time interpolated linearly in the
  mean between the grid values of :data:`DECODE_BITS` significant bits around it (steps of at most 1/8 of the
  value: 1024, 1152, 1280, …; attention reads keys in proportion to the context). In a decode-only step ``n``
  stays exact, since CUDA-graph padding and GEMM shapes depend on it;
- with prompt chunks in the step, its two parts (servesim/serving/step_time.py) are interpolated apart. The time
  outside attention, a function of the step's tokens and requests only, bilinearly between those counts on grids
  of :data:`PREFILL_BITS` and :data:`COUNT_BITS` significant bits (:func:`rest_token_bounds`). One layer's
  attention with the chunks replaced by as many equal ones doing the same attention work (:func:`equal_chunks`):
  bilinearly between their new tokens rounded down or up to :data:`CHUNK_BITS` significant bits and the number of
  decodes rounded down or up to :data:`COUNT_BITS` significant bits, cached tokens and the decodes' mean context
  rounded to the prefill grid. A new prompt length then costs attention kernels only, and steps with several
  prompts share them. The chunks' grid is coarser than the rest's: attention kernels have no tile multiples to
  stay on, and each new batch costs the decomposition and features of its kernels, most of a capacity search's
  time (docs/serving.md measures the error).

Lengths up to :data:`EXACT_BELOW` and decode counts up to :data:`EXACT_COUNT_BELOW` stay exact. docs/serving.md
gives the measured error of this approximation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servesim.compiled import inner
from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.serving.state import Step
from servesim.serving.step_time import StepTimeModel

EXACT_BELOW = 64
DECODE_BITS = 3
PREFILL_BITS = 3
CHUNK_BITS = 2
EXACT_COUNT_BELOW = 2
COUNT_BITS = 2
SPREAD_BITS = 2


@inner
def grid_step(tokens: int, bits: int) -> int:
    """The spacing of the grid of ``bits`` significant bits at ``tokens`` (up to 2**53)."""
    shift = math.frexp(tokens)[1] - bits  # frexp's exponent is a positive integer's bit length
    return 1 << (shift if shift > 0 else 0)


@inner
def round_to_grid(value: int, bits: int) -> int:
    """``value`` rounded to the nearest value with ``bits`` significant bits."""
    step = grid_step(value, bits)
    return (value + step // 2) // step * step


@inner
def round_length(tokens: int, bits: int) -> int:
    """``tokens`` rounded to the nearest value with ``bits`` significant bits (exact up to :data:`EXACT_BELOW`)."""
    return tokens if tokens <= EXACT_BELOW else round_to_grid(tokens, bits)


@inner
def grid_bounds(tokens: float, bits: int = PREFILL_BITS, exact_below: int = EXACT_BELOW) -> tuple[int, int]:
    """The grid values around ``tokens`` (equal when it is on the grid; every integer below ``exact_below`` is)."""
    whole = int(tokens)
    step = 1 if whole < exact_below else grid_step(whole, bits)
    low = whole // step * step
    return low, low if low == tokens else low + step


@inner
def decode_spread(context: int, max_context: int) -> int:
    """How far the longest decode's context is above the mean ``context``, rounded to :data:`SPREAD_BITS`
    significant bits. While a batch only decodes, both grow by one token a step and the spread stays."""
    return round_to_grid(max_context - context, SPREAD_BITS)


def representative_decodes(num_decodes: int, context: int, spread: int) -> tuple[int, ...]:
    """Contexts of ``num_decodes`` decodes with mean ``context`` whose longest is ``spread`` above it: that one,
    and the others equal (at no less than 0, which a rounded-up spread over a short mean can call for).

    The longest decode matters on its own: the decode kernels give each KV head of a request one CTA (FA2 and FA3
    split the keys only when the grid would leave SMs idle, by a rule on the longest request), so its CTAs can
    outlast the rest of the grid. With every decode at the mean context, the mlp estimator's decode steps came out
    4–8 % short on average (up to 22 %) at the loads a capacity search probes (docs/serving.md)."""
    if num_decodes == 1 or not spread:
        return (context,) * num_decodes
    others = max(0, round(context - spread / (num_decodes - 1)))
    return (others,) * (num_decodes - 1) + (context + spread,)


@dataclass(frozen=True)
class DecodeSpan:
    """Times of ``n`` decodes at the two grid contexts around a mean context, with the longest a set spread above
    it, to interpolate between: every mean context from ``low_context`` up to the next grid value shares one."""

    low_context: int
    span: int  # to the next grid value; 0 for exact contexts
    overhead_us: float
    stage_us: tuple[float, ...]
    overhead_delta_us: float
    stage_delta_us: tuple[float, ...]

    def covers(self, context: int) -> bool:
        """Whether mean context ``context`` shares this span."""
        return self.low_context <= context < self.low_context + self.span or context == self.low_context

    def at(self, context: int) -> tuple[float, tuple[float, ...]]:
        """``(host overhead, per-stage GPU time)``, µs, at mean context ``context``."""
        if context == self.low_context:
            return self.overhead_us, self.stage_us
        w = (context - self.low_context) / self.span
        return (self.overhead_us + w * self.overhead_delta_us,
                tuple([a + w * d for a, d in zip(self.stage_us, self.stage_delta_us)]))


def decode_span(step_model: StepTimeModel, num_decodes: int, low: int, spread: int) -> DecodeSpan:
    """The :class:`DecodeSpan` of ``num_decodes`` decodes at mean contexts from grid context ``low``, the longest
    ``spread`` (:func:`decode_spread`) above the mean."""
    low_batch = BatchSpec(decodes=representative_decodes(num_decodes, low, spread))
    if low < EXACT_BELOW:  # every context there is on the grid
        at_low = step_model.step_time_us(low_batch)
        return DecodeSpan(low, 0, at_low.overhead_us, at_low.stage_us, 0.0, (0.0,) * len(at_low.stage_us))
    span = grid_step(low, DECODE_BITS)
    high_batch = BatchSpec(decodes=representative_decodes(num_decodes, low + span, spread))
    step_model.layer_attentions_us((low_batch, high_batch))  # both ends' attention kernels in one estimator call
    at_low, at_high = step_model.step_time_us(low_batch), step_model.step_time_us(high_batch)
    return DecodeSpan(low, span, at_low.overhead_us, at_low.stage_us, at_high.overhead_us - at_low.overhead_us,
                      tuple(b - a for a, b in zip(at_low.stage_us, at_high.stage_us)))


def decode_span_at(step_model: StepTimeModel, num_decodes: int, context: int, max_context: int) -> DecodeSpan:
    """The :class:`DecodeSpan` covering ``num_decodes`` decodes at mean context ``context``, the longest
    ``max_context``, memoised on the step model by what it depends on: the count, the grid context at or below
    ``context`` and the rounded spread."""
    key = num_decodes, grid_bounds(context, DECODE_BITS)[0], decode_spread(context, max_context)
    span = step_model.decode_spans.get(key)
    if span is None:
        span = step_model.decode_spans[key] = decode_span(step_model, *key)
    return span


def decode_step_time_us(step_model: StepTimeModel, num_decodes: int, context_tokens: int,
                        max_context: int) -> tuple[float, tuple[float, ...]]:
    """``(host overhead, per-stage GPU time)``, µs, of a step of ``num_decodes`` decodes holding
    ``context_tokens`` in total, the longest ``max_context``."""
    context = context_tokens // num_decodes
    return decode_span_at(step_model, num_decodes, context, max_context).at(context)


def step_time_us(step_model: StepTimeModel, step: Step) -> tuple[float, tuple[float, ...]]:
    """``(host overhead, per-stage GPU time)`` of ``step``, µs, from representative batches (memoised by the
    model)."""
    if not step.prefills:
        return decode_step_time_us(step_model, step.num_decodes, step.decode_context_tokens,
                                   step.decode_max_context)
    decodes = step.num_decodes
    requests = decodes + len(step.prefills)
    tokens = decodes + sum(p.new_tokens for p in step.prefills)
    plan = step_model.graph_plan(tokens, False)
    # Dense kernels see the tokens padded to a captured size (grid values above EXACT_BELOW are captured sizes).
    token_bounds = rest_token_bounds(step_model, plan.padded_tokens, plan.mode)
    request_bounds = grid_bounds(requests, COUNT_BITS, EXACT_COUNT_BELOW)
    # A grid request count above a grid token count cannot be; the requests part of the rest (LM head, sampling)
    # is then taken at as many requests as tokens.
    rest_us = _bilinear(lambda t, r: step_model.rest_time_us(t, min(r, t), False), token_bounds,
                        weight(plan.padded_tokens, token_bounds), request_bounds, weight(requests, request_bounds))

    mean_context = step.decode_context_tokens // decodes if decodes else 0
    context = round_length(mean_context, PREFILL_BITS)
    spread = decode_spread(mean_context, step.decode_max_context) if decodes else 0
    new_tokens, cached_tokens = equal_chunks(step.prefills)
    chunk_bounds = grid_bounds(new_tokens, CHUNK_BITS)
    count_bounds = grid_bounds(decodes, COUNT_BITS, EXACT_COUNT_BELOW)
    chunk_weight, count_weight = weight(new_tokens, chunk_bounds), weight(decodes, count_bounds)
    shape = (len(step.prefills), round_length(round(cached_tokens), PREFILL_BITS), context, spread)
    corners = [shape + (chunk_tokens, count) for count in count_bounds[:2 if count_weight else 1]
               for chunk_tokens in chunk_bounds[:2 if chunk_weight else 1]]
    memoise_mixed_attention(step_model, corners)
    memo = step_model.mixed_attention
    (attention_us,) = _bilinear(lambda chunk_tokens, count: memo[shape + (chunk_tokens, count)][:1], chunk_bounds,
                                chunk_weight, count_bounds, count_weight)
    time = step_model.compose(rest_us, attention_us, memo[corners[0]][1], requests, plan.mode)
    return time.overhead_us, time.stage_us


def memoise_mixed_attention(step_model: StepTimeModel, corners: list[tuple[int, ...]]) -> None:
    """Puts one layer's attention time and kernel count of each representative batch ``corners`` (keys of
    ``step_model.mixed_attention``: :func:`mixed_batch`'s arguments) in that memo, those it lacks predicted in one
    estimator call."""
    memo = step_model.mixed_attention
    missing = [corner for corner in dict.fromkeys(corners) if corner not in memo]
    if missing:
        memo.update(zip(missing, step_model.layer_attentions_us([mixed_batch(*corner) for corner in missing])))


def mixed_batch(prefills: int, cached: int, context: int, spread: int, chunk_tokens: int, count: int) -> BatchSpec:
    """The representative batch of a mixed step: ``prefills`` equal chunks of ``chunk_tokens`` new tokens after
    ``cached`` ones, and ``count`` decodes at mean context ``context``, the longest ``spread`` above it."""
    return BatchSpec((PrefillChunk(chunk_tokens, cached),) * prefills, representative_decodes(count, context, spread))


def rest_token_bounds(step_model: StepTimeModel, tokens: int, mode: str) -> tuple[int, int]:
    """The token counts to interpolate a mixed step's time outside attention between, for ``tokens`` (padded).

    Around :func:`grid_bounds`, with two corrections. GEMM times jump just past multiples of their tile size, which
    grid values are, so the lower bound is the first count past the grid value (padded as the engine pads it). And
    an eager step lasts at least its launches' CPU time, so the time jumps where CUDA graphs end (vLLM:
    from 512 to 513 tokens): the bounds move in to the first or last count of the step's graph mode."""
    low, high = grid_bounds(tokens)
    if low < tokens:
        low = step_model.graph_plan(low + 1, False).padded_tokens

    def same(t: int) -> bool:
        return step_model.graph_plan(t, False).mode == mode

    return (low if same(low) else _last_in_mode(tokens, low, same),
            high if same(high) else _last_in_mode(tokens, high, same))


def _last_in_mode(inside: int, outside: int, same: Callable[[int], bool]) -> int:
    """The count nearest ``outside`` on the way from ``inside`` that is still in ``inside``'s graph mode, by
    bisection (the mode changes once between them)."""
    while abs(outside - inside) > 1:
        middle = (inside + outside) // 2
        inside, outside = (middle, outside) if same(middle) else (inside, middle)
    return inside


def equal_chunks(prefills: tuple[PrefillChunk, ...]) -> tuple[float, float]:
    """New and cached tokens of equal chunks that stand for ``prefills`` in attention: as many chunks, with the
    same causal attention work (each chunk's queries attend to its cached keys and, causally, to each other:
    Σ new × cached + new² / 2), split between the two terms as the chunks split it."""
    if len(prefills) == 1:
        return prefills[0].new_tokens, prefills[0].cached_tokens
    new = math.sqrt(sum(p.new_tokens ** 2 for p in prefills) / len(prefills))
    return new, sum(p.new_tokens * p.cached_tokens for p in prefills) / (len(prefills) * new)


@inner
def weight(value: float, bounds: tuple[int, int]) -> float:
    """Where ``value`` lies between ``bounds``, 0 to 1 (0 when they are equal)."""
    low, high = bounds
    return (value - low) / (high - low) if high > low else 0.0


def _bilinear(at: Callable[[Any, Any], tuple[float, ...]], x_bounds: tuple, x_weight: float, y_bounds: tuple,
              y_weight: float) -> tuple[float, ...]:
    """``at`` interpolated bilinearly between the corners of ``x_bounds`` × ``y_bounds``, first along x (a corner
    is only asked for when its weight is not 0)."""
    (x_low, x_high), (y_low, y_high) = x_bounds, y_bounds
    low = at(x_low, y_low)
    if x_weight:
        low = _lerp(low, at(x_high, y_low), x_weight)
    if not y_weight:
        return low
    high = at(x_low, y_high)
    if x_weight:
        high = _lerp(high, at(x_high, y_high), x_weight)
    return _lerp(low, high, y_weight)


def _lerp(low: tuple[float, ...], high: tuple[float, ...], weight: float) -> tuple[float, ...]:
    return tuple([a + weight * (b - a) for a, b in zip(low, high)])
