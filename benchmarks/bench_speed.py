"""Wall time of the commands the "Speed" issue tracks (docs/performance.md, "Speed"), each in its own process.

    .venv/bin/python benchmarks/bench_speed.py [--only simulate-100k,readme-plan,...] [--repeat 1] [--first-run]

Runs each command as ``servesim ARGS --json`` with the step store (servesim/planner/step_store.py) in a fresh
temporary folder, so that runs on different code or machines compare: a plan or a simulate runs once to fill the
store (its time is the "empty store" figure) and then ``--repeat`` times more with it filled; ``latency``, which
does not use the store, runs ``--repeat`` times. numba's cache is whatever the installation has: run any command
once after installing. ``--first-run`` first runs each command as the first one after an install does, with
numba's cache (``NUMBA_CACHE_DIR``) and the step store in new empty folders. Prints one row per command: the
median wall time of the repeats, the empty-store time and the first-run time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from servesim.cli.output import Column, render_table

CLI = "import sys; from servesim.cli import main; sys.argv[0] = 'servesim'; sys.exit(main())"
#: name -> the servesim arguments (``--json`` is added).
COMMANDS = {
    "latency-help": "latency --model llama3-8b --gpu H100 --batch-size 8 --input-len 32 --output-len 128",
    "simulate-100k": "simulate --model qwen3-8b --workload splitwise-conv --qps 20 -n 100000",
    "simulate-help-vllm": "simulate --model llama3-8b --gpu H100 --workload splitwise-conv --qps 4 -n 2000",
    "simulate-help-sglang": "simulate --model llama3-70b --tp 4 --engine sglang --workload fixed:1024:256 "
                            "--concurrency 16",
    "simulate-prefix-sglang": "simulate --model qwen3-8b --gpu H100 --engine sglang --workload chat-shared-prefix "
                              "--qps 8 -n 2000",
    "readme-plan": "plan --model llama3-70b --tp 4 --gpus H100,H20",
    "plan-prefix-vllm": "plan --model llama3.1-70b --tp 4 --gpus H100,H20 --workload chat-shared-prefix",
    "four-gpu-plan": "plan --model llama3-70b --gpus H100,H200,H20,A100 --qps 20 --ttft-p90 2000 --tpot-p99 100",
    "simulate-100k-sglang": "simulate --model qwen3-8b --workload splitwise-conv --qps 20 -n 100000 --engine sglang",
    "four-gpu-plan-sglang": "plan --model llama3-70b --gpus H100,H200,H20,A100 --qps 20 --ttft-p90 2000 "
                            "--tpot-p99 100 --engine sglang",
}
COLUMNS = (
    Column("command", "command", "", "<"),
    Column("wall_s", "wall (s)", ".1f"),
    Column("empty_store_s", "empty store (s)", ".1f"),
    Column("first_run_s", "first run (s)", ".1f"),
)


def wall_s(args: str, store: str, numba_cache: str | None = None) -> float:
    """Seconds ``servesim ARGS --json`` takes in a child process with the step store in ``store`` (and numba's
    cache in ``numba_cache``, when given)."""
    env = {**os.environ, "SERVESIM_CACHE_DIR": store}
    if numba_cache is not None:
        env["NUMBA_CACHE_DIR"] = numba_cache
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", CLI, *args.split(), "--json"], check=True, stdout=subprocess.DEVNULL,
                   env=env)
    return time.perf_counter() - start


def first_run_s(args: str) -> float:
    """Seconds of the command as the first after an install: numba's cache and the step store empty."""
    with tempfile.TemporaryDirectory() as store, tempfile.TemporaryDirectory() as numba_cache:
        return wall_s(args, store, numba_cache)


def measure(args: str, repeat: int, first_run: bool) -> dict:
    """The command's row: median wall time of ``repeat`` runs, after one that fills the store for a plan or a
    simulation."""
    first_s = first_run_s(args) if first_run else None
    with tempfile.TemporaryDirectory() as store:
        empty_s = wall_s(args, store) if args.startswith(("plan", "simulate")) else None
        times = [wall_s(args, store) for _ in range(repeat)]
    return {"command": f"servesim {args}", "wall_s": statistics.median(times),
            "empty_store_s": empty_s, "first_run_s": first_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(COMMANDS), help=f"Comma-separated of {', '.join(COMMANDS)}.")
    parser.add_argument("--repeat", type=int, default=1, help="Timed runs per command (after a plan's first).")
    parser.add_argument("--first-run", action="store_true",
                        help="Also time each command with numba's cache and the step store empty.")
    args = parser.parse_args()
    rows = [measure(COMMANDS[name], args.repeat, args.first_run) for name in args.only.split(",")]
    print(render_table(rows, COLUMNS))


if __name__ == "__main__":
    main()
