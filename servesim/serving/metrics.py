"""What a simulation produces: per-request timings, per-step records, and the benchmark-style metrics over them.

Definitions follow ``vllm bench serve`` (and SGLang's ``bench_serving``, which uses the same ones):

- TTFT: from the moment the client sends the request to its first token. Queueing delay: send to first scheduled.
- TPOT (``tpot_ms``, excluding the first token): ``(E2E − TTFT) / (output − 1)`` per request, then aggregated over
  requests; undefined for one-token outputs, which are left out.
- TPOT including the first token (``tpot_incl_ms``): ``E2E / output`` per request, as tools that divide the whole
  latency by the tokens report it.
- ITL (``itl_ms``): every gap between consecutive tokens of a request, pooled over all requests (so a request with
  more tokens weighs more). Its mean is the token-weighted TPOT.
- E2E: send to last token. Duration: first send to last completion; throughputs divide by it.
- Goodput: completed requests per second that meet every given SLO (``ttft_ms``, ``tpot_ms``, ``e2e_ms``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from servesim.errors import ServesimError

PERCENTILES = (50, 90, 99)
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")


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
    """Outcome of one simulated run. Times are seconds from the first arrival; token times are stored flat, request
    ``i``'s tokens being ``token_times_s[token_offsets[i]:token_offsets[i + 1]]``."""

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
    token_times_s: np.ndarray
    steps: StepRecord
    info: Mapping[str, Any] = field(default_factory=dict)  # what was simulated: model, GPU, engine knobs, ...

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
        """All inter-token gaps, pooled (gaps across request boundaries removed)."""
        gaps = np.diff(self.token_times_s)
        return np.delete(gaps, self.token_offsets[1:-1] - 1)

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
        """The inter-token latencies of one request, ms."""
        times = self.token_times_s[self.token_offsets[request_id]:self.token_offsets[request_id + 1]]
        return np.diff(times) * 1e3

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
                             ("tpot_incl_ms", self.e2e_s / self.output_tokens), ("itl_ms", self.itl_s),
                             ("e2e_ms", self.e2e_s)):
            out.update(_aggregate(name, values * 1e3))
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
