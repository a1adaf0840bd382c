"""One GPU's layout sweep: ``servesim plan`` against ``aiconfigurator cli default`` on the same machine.

    .venv/bin/python benchmarks/bench_vs_aiconfigurator.py [--repeats N]

Both search llama3-70b (servesim's preset, written as the ``config.json`` aiconfigurator reads) on H100 SXM under
vLLM for the layouts of one 8-GPU node, with the default SLOs (TTFT 2000 ms, TPOT 100 ms) and the splitwise-conv
workload's mean lengths (1,145 prompt + 214 output tokens):

    servesim plan --model llama3-70b --gpus H100 --json
    aiconfigurator cli default --model-path DIR --total-gpus 8 --system h100_sxm --backend vllm
        --serving-mode agg --ttft 2000 --tpot 100 --isl 1145 --osl 214

servesim runs twice, each time in its own process as a user runs it: first with no step times kept from earlier
plans (an empty ``SERVESIM_CACHE_DIR``, servesim/planner/step_store.py), then again with those the first run
kept; the two JSON documents must be identical. numba's cache should be warm (any earlier ``servesim plan``). Each
command's wall time is the best of ``--repeats`` runs (servesim's first run gets a fresh folder each time). Prints
the times and aiconfigurator's time over servesim's; without aiconfigurator installed it says so and stops.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servesim.cli.output import Column, render_table
from servesim.models.registry import preset_record

SERVESIM_ARGS = ("plan", "--model", "llama3-70b", "--gpus", "H100", "--json")
AICONFIGURATOR_ARGS = ("cli", "default", "--total-gpus", "8", "--system", "h100_sxm", "--backend", "vllm",
                       "--serving-mode", "agg", "--ttft", "2000", "--tpot", "100", "--isl", "1145", "--osl", "214")


def _tool(name: str) -> str | None:
    """The console script ``name`` of this interpreter's environment, else on the PATH."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else shutil.which(name)


def _wall_s(command: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Seconds ``command`` takes, and its standard output; an error when it fails."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return seconds, done.stdout


def _servesim_runs(servesim: str, repeats: int) -> tuple[float, float]:
    """Best wall seconds of a plan with no step times kept, and of the same plan with those it kept."""
    first, again = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "SERVESIM_CACHE_DIR": cache}
            seconds, cold = _wall_s([servesim, *SERVESIM_ARGS], env)
            first.append(seconds)
            seconds, warm = _wall_s([servesim, *SERVESIM_ARGS], env)
            again.append(seconds)
        if json.loads(cold) != json.loads(warm):
            raise SystemExit("the plan with kept step times differs from the one without; the store is wrong")
    return min(first), min(again)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="runs of each command; the fastest counts")
    args = parser.parse_args()
    aiconfigurator, servesim = _tool("aiconfigurator"), _tool("servesim")
    if aiconfigurator is None:
        print("aiconfigurator is not installed (pip install aiconfigurator); nothing to compare")
        return
    if servesim is None:
        raise SystemExit("the servesim command is not installed (pip install -e .)")
    with tempfile.TemporaryDirectory() as model_dir:
        (Path(model_dir) / "config.json").write_text(json.dumps(preset_record("llama3-70b")["config"]))
        theirs = min(_wall_s([aiconfigurator, *AICONFIGURATOR_ARGS[:2], "--model-path", model_dir,
                              *AICONFIGURATOR_ARGS[2:]])[0] for _ in range(args.repeats))
    first, again = _servesim_runs(servesim, args.repeats)
    rows = [
        {"command": "aiconfigurator " + " ".join(AICONFIGURATOR_ARGS[:2]) + " --model-path DIR "
                    + " ".join(AICONFIGURATOR_ARGS[2:]), "wall_s": theirs, "ratio": 1.0},
        {"command": "servesim " + " ".join(SERVESIM_ARGS) + "  (no step times kept)", "wall_s": first,
         "ratio": theirs / first},
        {"command": "servesim " + " ".join(SERVESIM_ARGS) + "  (again, step times kept)", "wall_s": again,
         "ratio": theirs / again},
    ]
    columns = [Column("command", "command", align="<"), Column("wall_s", "wall s", ".1f"),
               Column("ratio", "aiconfigurator s / this", ".2f")]
    print(render_table(rows, columns, f"one GPU's sweep, best of {args.repeats}"))


if __name__ == "__main__":
    main()
