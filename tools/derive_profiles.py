"""Derive the built-in workload profiles (servesim/workloads/profiles/*.json) from Vidur's processed traces.

    python tools/derive_profiles.py [--traces DIR]

DIR defaults to ../shared/data/vidur/traces (Vidur, MIT licence, microsoft/vidur commit 7d47513,
data/processed_traces/). Only compact statistics are committed, never the traces.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from servesim.workloads.profiles import derive_profile_record
from servesim.workloads.traces import load_trace

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = REPO.parent / "shared" / "data" / "vidur" / "traces"
OUT_DIR = REPO / "servesim" / "workloads" / "profiles"

VIDUR = {"repository": "https://github.com/microsoft/vidur", "commit": "7d47513", "license": "MIT"}

#: profile name → (trace file, description, origin of the trace Vidur processed)
PROFILES = {
    "arxiv": (
        "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
        "arXiv paper summarisation: long prompts (mean ~2.6k tokens), short summaries; no arrival times",
        "arXiv summarization dataset (Cohan et al., NAACL 2018), lengths in Llama-2 tokens, filtered by Vidur",
    ),
    "splitwise-conv": (
        "splitwise_conv.csv",
        "Azure LLM conversation service, 1 hour: mixed prompts, medium outputs, ~5.5 req/s, near-Poisson gaps",
        "Azure LLM inference trace 2023, conversation (Splitwise, Patel et al., ISCA 2024)",
    ),
    "splitwise-code": (
        "splitwise_code.csv",
        "Azure LLM coding service, 1 hour: long prompts, very short outputs, ~2.6 req/s, very bursty (gap CV ~13)",
        "Azure LLM inference trace 2023, code (Splitwise, Patel et al., ISCA 2024)",
    ),
}


def to_json(record: dict) -> str:
    """Indented JSON with each list of numbers on one line, so the files stay small and diffable."""
    text = json.dumps(record, indent=1)
    return re.sub(r"\[[-0-9.e,\s]+\]", lambda m: re.sub(r"\s+", "", m.group()).replace(",", ", "), text) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="folder with Vidur's trace CSVs")
    args = parser.parse_args()
    for name, (file_name, description, origin) in PROFILES.items():
        trace = load_trace(args.traces / file_name)
        source = {**VIDUR, "path": f"data/processed_traces/{file_name}", "origin": origin}
        record = {**derive_profile_record(trace, description, source), "name": name}
        out = OUT_DIR / f"{name}.json"
        out.write_text(to_json(record), encoding="utf-8")
        print(f"{out.relative_to(REPO)}: {len(trace)} requests, {out.stat().st_size / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
