"""What a simulation produces: per-request timings, per-step records, and the benchmark-style metrics over them.

Definitions follow ``vllm bench serve`` (and SGLang's ``bench_serving``, which uses the same ones):

- TTFT: from the moment the client sends the request to its first token. Queueing delay: send to first scheduled.
- TPOT (``tpot_ms``, excluding the first token): ``(E2E − TTFT) / (output − 1)`` per request, then aggregated over
  requests; undefined for one-token outputs, which are left out.
- TPOT including the first token (``tpot_incl_ms``): ``E2E / output`` per request, as tools that divide the whole
  latency by the tokens report it.
- ITL (``itl_ms``): every gap between consecutive tokens of a request as the client receives them, pooled over all
  requests (so a request with more tokens weighs more). With ``--stream-interval N`` the engine sends a request's
  first token, every N-th token after it and its last (:func:`streamed_positions`), and the client times each
  chunk, so a gap spans up to N tokens; with N = 1 the mean is the token-weighted TPOT.
- E2E: send to last token. Duration: first send to last completion; throughputs divide by it.
- Goodput: completed requests per second that meet every given SLO (``ttft_ms``, ``tpot_ms``, ``e2e_ms``).

Every token's time is kept only for runs of at most :data:`TOKEN_TIMES_MAX_TOKENS` output tokens (or when the
caller asks for them); a larger run keeps the gaps between tokens counted by value (:class:`GapCounts`), which
gives the same ITL percentiles and the mean up to float rounding in memory that grows with the steps, not with
the tokens (8 bytes each).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from servesim.errors import ServesimError

PERCENTILES = (50, 90, 99)
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")
#: Runs of up to this many output tokens keep every token's time by default (8 bytes a token, so 32 MB here).
TOKEN_TIMES_MAX_TOKENS = 4_000_000


def streamed_positions(output_tokens: int, stream_interval: int) -> np.ndarray:
    """Which of a request's ``output_tokens`` tokens (0-based) end a chunk the engine streams: the first, every
    ``stream_interval``-th after it and the last. SGLang sends when ``len(output_ids) % interval == 1`` or the
    request finished (``scheduler_output_processor_mixin.py``, 0.5.3 to 0.5.10); vLLM sends the first token, then
    once ``interval`` tokens are unsent, and at the finish (``v1/engine/output_processor.py``, pull request 27869,
    0.12.0 on)."""
    positions = np.arange(0, output_tokens, stream_interval)
    return positions if positions[-1] == output_tokens - 1 else np.append(positions, output_tokens - 1)


def streamed_mask(token_offsets: np.ndarray, stream_interval: int) -> np.ndarray:
    """Over a run's flat token times (request ``i``'s at ``token_offsets[i]:token_offsets[i + 1]``), which end a
    streamed chunk (:func:`streamed_positions` for every request at once)."""
    lengths = np.diff(token_offsets)
    position = np.arange(int(token_offsets[-1])) - np.repeat(token_offsets[:-1], lengths)
    return (position % stream_interval == 0) | (position == np.repeat(lengths, lengths) - 1)


@dataclass(frozen=True, eq=False)
class GapCounts:
    """Inter-token gaps counted by value: ``counts[i]`` gaps of exactly ``values_s[i]`` seconds, values ascending.

    This is the whole multiset of gaps, so its order statistics are exact and :meth:`aggregate_ms` gives the
    percentiles ``np.percentile`` gives of the full gap array (the same interpolation, see
    :func:`counted_percentiles`) and the mean up to float rounding (an exactly rounded sum over the count, where
    numpy's mean of the full array sums pairwise: they can differ in the last digits, within 1e-12 relative as the
    tests hold them). It stays small because every token is
    sampled at the end of a step, so a gap is the difference of two step end times, mostly of two steps a request
    is in one after the other: distinct values number about as many as the steps, not the tokens (fewer than the
    steps in every run measured).
    """

    values_s: np.ndarray
    counts: np.ndarray

    def aggregate_ms(self, name: str) -> dict[str, float]:
        """What :func:`_aggregate` gives of the full gap array in ms: ``{stem}_mean_ms`` and the percentiles."""
        stem = name.removesuffix("_ms")
        total = int(self.counts.sum())
        if not total:
            return {f"{stem}_{k}_ms": float("nan") for k in ("mean", *(f"p{p}" for p in PERCENTILES))}
        values_ms = self.values_s * 1e3  # as _aggregate scales each gap
        out = {f"{stem}_mean_ms": math.fsum((values_ms * self.counts).tolist()) / total}
        for p, v in zip(PERCENTILES, counted_percentiles(values_ms, self.counts, PERCENTILES)):
            out[f"{stem}_p{p}_ms"] = float(v)
        return out


def counted_percentiles(values: np.ndarray, counts: np.ndarray, percentiles: Sequence[float]) -> np.ndarray:
    """``np.percentile`` (default linear method) of the array holding ``counts[i]`` copies of ``values[i]`` (values
    ascending, counts positive), without making it: the two order statistics around ``(n − 1) · p / 100`` and
    numpy's interpolation between them, which starts from the nearer one."""
    total = int(counts.sum())
    virtual = (total - 1) * (np.asarray(percentiles, dtype=np.float64) / 100)
    lower = np.floor(virtual).astype(np.int64)
    ends = np.cumsum(counts)  # one past the sorted position of each value's last copy
    below = values[np.searchsorted(ends, lower, side="right")]
    above = values[np.searchsorted(ends, np.minimum(lower + 1, total - 1), side="right")]
    gamma = virtual - lower
    diff = above - below
    return np.where(gamma >= 0.5, above - diff * (1 - gamma), below + diff * gamma)


@dataclass(frozen=True, eq=False)
class StepRecord:
    """Every engine step (micro-batch) that ran, column-wise: replica by replica, each in its launch order."""

    replica: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    num_requests: np.ndarray
    num_tokens: np.ndarray
    prefill_tokens: np.ndarray  # new prompt tokens (chunks and recomputation)
    num_decodes: np.ndarray
    kv_used_tokens: np.ndarray  # KV in use while the step runs
    kv_capacity_tokens: int  # per replica


@dataclass(frozen=True, eq=False)
class SimulationResult:
    """Outcome of one simulated run. Times are seconds from the first arrival. Token times, when the run kept them
    (see :data:`TOKEN_TIMES_MAX_TOKENS`), are stored flat, request ``i``'s tokens being
    ``token_times_s[token_offsets[i]:token_offsets[i + 1]]``; otherwise ``token_times_s`` is None and ``itl_counts``
    holds the gaps between them."""

    issue_s: np.ndarray  # when the client sent the request
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    replica: np.ndarray
    first_scheduled_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    preemptions: np.ndarray
    cached_tokens: np.ndarray  # prompt tokens served from the prefix cache at the request's (last) admission
    token_offsets: np.ndarray
    token_times_s: np.ndarray | None
    steps: StepRecord
    info: Mapping[str, Any] = field(default_factory=dict)  # what was simulated: model, GPU, engine knobs, ...
    itl_counts: GapCounts | None = None  # the inter-token gaps of a run without token times
    stream_interval: int = 1  # tokens per streamed chunk (--stream-interval): what ITL is measured between

    def __len__(self) -> int:
        return len(self.issue_s)

    @cached_property
    def ttft_s(self) -> np.ndarray:
        return self.first_token_s - self.issue_s

    @cached_property
    def e2e_s(self) -> np.ndarray:
        return self.finish_s - self.issue_s

    @cached_property
    def tpot_s(self) -> np.ndarray:
        """(E2E − TTFT) / (output − 1); NaN for one-token outputs."""
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = (self.finish_s - self.first_token_s) / (self.output_tokens - 1)
        return np.where(self.output_tokens > 1, tpot, np.nan)

    @cached_property
    def itl_s(self) -> np.ndarray:
        """All gaps between the chunks a client receives, pooled (gaps across request boundaries removed)."""
        times, offsets = self._token_times_s(), self.token_offsets
        if self.stream_interval > 1 and len(times):
            kept = streamed_mask(offsets, self.stream_interval)
            times, offsets = times[kept], np.concatenate([[0], np.cumsum(np.add.reduceat(kept, offsets[:-1]))])
        return np.delete(np.diff(times), offsets[1:-1] - 1)

    def _token_times_s(self) -> np.ndarray:
        if self.token_times_s is None:
            raise ServesimError(
                f"this run kept no per-token times (the default above {TOKEN_TIMES_MAX_TOKENS:,} output tokens; it "
                f"had {int(self.token_offsets[-1]):,}); summary() has its ITL mean and percentiles; for the gaps "
                f"themselves simulate it with token_times=True")
        return self.token_times_s

    @cached_property
    def requests(self):
        """Per-request metrics as a pandas DataFrame (ms at the user surface)."""
        import pandas as pd

        return pd.DataFrame({
            "request_id": np.arange(len(self)),
            "replica": self.replica,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "arrival_s": self.issue_s,
            "queue_ms": (self.first_scheduled_s - self.issue_s) * 1e3,
            "ttft_ms": self.ttft_s * 1e3,
            "tpot_ms": self.tpot_s * 1e3,
            "tpot_incl_ms": self.e2e_s / self.output_tokens * 1e3,
            "e2e_ms": self.e2e_s * 1e3,
            "preemptions": self.preemptions,
        })

    def request_itl_ms(self, request_id: int) -> np.ndarray:
        """The inter-token latencies of one request as its client receives the chunks, ms."""
        times = self._token_times_s()[self.token_offsets[request_id]:self.token_offsets[request_id + 1]]
        return np.diff(times[streamed_positions(len(times), self.stream_interval)]) * 1e3

    @cached_property
    def duration_s(self) -> float:
        return float(self.finish_s.max() - self.issue_s.min()) if len(self) else 0.0

    def summary(self) -> dict[str, Any]:
        """Aggregates as benchmark tools print them: latencies in ms (mean, p50, p90, p99), throughputs per s."""
        duration = self.duration_s
        steps = self.steps
        busy = steps.end_s - steps.start_s
        out = {
            "requests": len(self),
            "duration_s": duration,
            "request_throughput_per_s": len(self) / duration if duration else float("nan"),
            "output_throughput_tok_per_s": self.output_tokens.sum() / duration if duration else float("nan"),
            "total_throughput_tok_per_s": (self.output_tokens.sum() + self.prompt_tokens.sum()) / duration
            if duration else float("nan"),
        }
        queue = self.first_scheduled_s - self.issue_s
        for name, values in (("queue_ms", queue), ("ttft_ms", self.ttft_s), ("tpot_ms", self.tpot_s),
                             ("tpot_incl_ms", self.e2e_s / self.output_tokens)):
            out.update(_aggregate(name, values * 1e3))
        out.update(_aggregate("itl_ms", self.itl_s * 1e3) if self.token_times_s is not None
                   else self.itl_counts.aggregate_ms("itl_ms"))
        out.update(_aggregate("e2e_ms", self.e2e_s * 1e3))
        out.update({
            "preemptions": int(self.preemptions.sum()),
            "prefix_cache_hit_ratio": float(self.cached_tokens.sum() / self.prompt_tokens.sum())
            if len(self) else float("nan"),
            "steps": len(steps.start_s),
            "mean_batch_size": _weighted_mean(steps.num_requests, busy),
            "mean_tokens_per_step": float(steps.num_tokens.mean()) if len(steps.num_tokens) else float("nan"),
            "mean_kv_occupancy": _weighted_mean(steps.kv_used_tokens / steps.kv_capacity_tokens, busy),
            "peak_kv_occupancy": float(steps.kv_used_tokens.max() / steps.kv_capacity_tokens)
            if len(steps.kv_used_tokens) else float("nan"),
        })
        return out

    def slo_met(self, slos: Mapping[str, float]) -> np.ndarray:
        """Per request: whether it meets every SLO (keys ``ttft_ms``, ``tpot_ms``, ``e2e_ms``). A one-token request
        has no TPOT and meets a TPOT SLO."""
        unknown = set(slos) - set(SLO_KEYS)
        if unknown:
            raise ServesimError(f"unknown SLO {', '.join(sorted(unknown))}; use {', '.join(SLO_KEYS)} (milliseconds)")
        values = {"ttft_ms": self.ttft_s * 1e3, "tpot_ms": np.nan_to_num(self.tpot_s) * 1e3, "e2e_ms": self.e2e_s * 1e3}
        met = np.ones(len(self), dtype=bool)
        for key, limit in slos.items():
            met &= values[key] <= limit
        return met

    def goodput(self, slos: Mapping[str, float]) -> float:
        """Requests per second that meet every SLO (``vllm bench serve --goodput``)."""
        return float(self.slo_met(slos).sum() / self.duration_s) if self.duration_s else float("nan")

    def timeline(self):
        """Per-step DataFrame: time, batch size, tokens and KV occupancy over the run."""
        import pandas as pd

        s = self.steps
        return pd.DataFrame({
            "replica": s.replica, "start_ms": s.start_s * 1e3, "end_ms": s.end_s * 1e3,
            "num_requests": s.num_requests, "num_tokens": s.num_tokens, "prefill_tokens": s.prefill_tokens,
            "num_decodes": s.num_decodes, "kv_occupancy": s.kv_used_tokens / s.kv_capacity_tokens,
        })


def _aggregate(name: str, values: np.ndarray) -> dict[str, float]:
    values = values[~np.isnan(values)]
    stem = name.removesuffix("_ms")
    if not len(values):
        return {f"{stem}_{k}_ms": float("nan") for k in ("mean", *(f"p{p}" for p in PERCENTILES))}
    out = {f"{stem}_mean_ms": float(values.mean())}
    for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES)):
        out[f"{stem}_p{p}_ms"] = float(v)
    return out


def _weighted_mean(values: np.ndarray, weights: np.ndarray) -> float:
    return float(np.average(values, weights=weights)) if len(values) and weights.sum() > 0 else float("nan")
