"""A Chrome trace (chrome://tracing, Perfetto) of a simulation: one track per replica with every step as a slice,
and counters for batch size and KV occupancy."""

from __future__ import annotations

import json
from pathlib import Path

from servesim.serving.metrics import SimulationResult


def chrome_trace(result: SimulationResult) -> dict:
    """The trace as a JSON-ready dict (``traceEvents``, times in µs)."""
    steps = result.steps
    events = []
    for replica, start, end, reqs, tokens, prefill, decodes, kv in zip(
        steps.replica.tolist(), steps.start_s.tolist(), steps.end_s.tolist(), steps.num_requests.tolist(),
        steps.num_tokens.tolist(), steps.prefill_tokens.tolist(), steps.num_decodes.tolist(),
        steps.kv_used_tokens.tolist(),
    ):
        name = "decode" if not prefill else ("prefill" if not decodes else "mixed")
        ts = start * 1e6
        events.append({"name": name, "ph": "X", "pid": replica, "tid": 0, "ts": ts, "dur": (end - start) * 1e6,
                       "args": {"requests": reqs, "tokens": tokens, "prefill_tokens": prefill, "decodes": decodes}})
        events.append({"name": "batch", "ph": "C", "pid": replica, "ts": ts, "args": {"requests": reqs}})
        events.append({"name": "kv occupancy", "ph": "C", "pid": replica, "ts": ts,
                       "args": {"fraction": kv / steps.kv_capacity_tokens}})
    for replica in sorted(set(steps.replica.tolist())):
        events.append({"name": "process_name", "ph": "M", "pid": replica, "args": {"name": f"replica {replica}"}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(result: SimulationResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(chrome_trace(result)), encoding="utf-8")
