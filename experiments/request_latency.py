"""The per-request latency outside the engine, read from inference-perf runs of vLLM with async scheduling.

Under async scheduling a request that reaches the engine during step n is scheduled into step n + 2 and its first
token leaves with that step: 2 to 3 steps after it arrived, 2.5 on average for arrivals spread over the step. What
the client measures beyond that is time no engine step holds (HTTP, hand-offs between the API server and the
engine, the token's way back). Per stage this prints the median TTFT less 2.5 per-token times, the per-token time
being ``(E2E − TTFT) / (output_len − 1)`` of the means (every request generates output_len tokens with
ignore_eos), and their mean over the stages whose requests all succeeded. servesim's vLLM 0.15.1
``request_latency_us`` is that mean (servesim/serving/overhead.py; docs/validation-results.md).

    python experiments/request_latency.py RUN_FOLDER...

where each RUN_FOLDER is an inference-perf report folder (``config.yaml`` and ``stage_<i>_lifecycle_metrics.json``),
for example every ``default_args/*/results`` of https://github.com/inference-sim/training.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml


def stage_offsets_ms(folder: Path) -> list[tuple[str, float, float]]:
    """(stage, per-token ms, median TTFT − 2.5 per-token times in ms) of each stage whose requests all succeeded."""
    config = yaml.safe_load((folder / "config.yaml").read_text())
    output = config["data"]["shared_prefix"]["output_len"]
    rows = []
    for path in sorted(folder.glob("stage_*_lifecycle_metrics.json")):
        metrics = json.loads(path.read_text())
        if metrics["failures"]["count"]:
            continue
        latency = metrics["successes"]["latency"]
        ttft = latency["time_to_first_token"]
        per_token_ms = (latency["request_latency"]["mean"] - ttft["mean"]) / (output - 1) * 1e3
        rows.append((path.name.split("_lifecycle")[0], per_token_ms, ttft["median"] * 1e3 - 2.5 * per_token_ms))
    return rows


def main(folders: list[str]) -> None:
    offsets = []
    print(f"{'run':<52} {'stage':<8} {'per token ms':>12} {'median TTFT - 2.5 steps ms':>27}")
    for name in folders:
        folder = Path(name)
        label = folder.parent.name if folder.name == "results" else folder.name
        for stage, per_token_ms, offset_ms in stage_offsets_ms(folder):
            offsets.append(offset_ms)
            print(f"{label:<52} {stage:<8} {per_token_ms:>12.2f} {offset_ms:>27.1f}")
    if offsets:
        print(f"mean over {len(offsets)} stages: {sum(offsets) / len(offsets):.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
