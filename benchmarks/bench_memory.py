"""Peak memory and wall time of long ``servesim simulate`` runs (docs/performance.md, "Memory").

    .venv/bin/python benchmarks/bench_memory.py [--requests 200000,1000000] [--model qwen3-8b]
        [--workload splitwise-conv] [--qps 20]

Runs ``servesim simulate --model MODEL --workload WORKLOAD --qps QPS -n N --json`` once per size, each in its own
process, and prints a row per size: the process's peak resident set size (``ru_maxrss`` of that child, read with
``os.wait4``), its wall time, and what it simulated (output tokens, steps, ITL p99). The ``-n 1000000`` run takes
about ten minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from servesim.cli.output import Column, render_table
from servesim.workloads import build_workload

CLI = "import sys; from servesim.cli import main; sys.argv[0] = 'servesim'; sys.exit(main())"
COLUMNS = (
    Column("requests", "requests", ",d"),
    Column("output_tokens", "output tokens", ",d"),
    Column("steps", "steps", ",d"),
    Column("peak_rss_mb", "peak RSS (MB)", ",.0f"),
    Column("wall_s", "wall (s)", ",.0f"),
    Column("itl_p99_ms", "ITL p99 (ms)", ",.2f"),
)


def measure(args: list[str]) -> tuple[dict, float, float]:
    """(the run's JSON, its peak RSS in MB, its wall time in s) of ``servesim ARGS`` in a child process."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", CLI, *args], stdout=subprocess.PIPE)
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    wall_s = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"servesim {' '.join(args)} failed")
    return json.loads(output), usage.ru_maxrss / 1024, wall_s  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="200000,1000000", help="Comma-separated request counts.")
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument("--workload", default="splitwise-conv")
    parser.add_argument("--qps", default="20")
    args = parser.parse_args()
    rows = []
    for requests in (int(n) for n in args.requests.split(",")):
        command = ["simulate", "--model", args.model, "--workload", args.workload, "--qps", args.qps,
                   "-n", str(requests), "--json"]
        payload, peak_rss_mb, wall_s = measure(command)
        summary = payload["summary"]
        rows.append({
            "requests": summary["requests"],
            "output_tokens": int(build_workload(args.workload, requests, qps=float(args.qps)).output_tokens.sum()),
            "steps": summary["steps"], "peak_rss_mb": peak_rss_mb, "wall_s": wall_s,
            "itl_p99_ms": summary["itl_p99_ms"],
        })
        print(f"servesim {' '.join(command)}: {peak_rss_mb:,.0f} MB, {wall_s:,.0f} s", file=sys.stderr)
    print(render_table(rows, COLUMNS, title=f"servesim simulate --model {args.model} --workload {args.workload} "
                                            f"--qps {args.qps} -n N"))


if __name__ == "__main__":
    main()
