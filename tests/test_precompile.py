"""On a cold cache the loops are compiled ahead, in parallel, for the argument types the commands call them with."""

import json
import os
import subprocess
import sys

from servesim.precompile import ENTRY_POINTS, balanced_shares

#: Compiles the cold loops, then runs commands that reach every loop (dense and MoE kernels, vLLM and SGLang,
#: the serving fast path and the compiled vLLM loop) and prints the servesim loops numba still had to compile, and
#: the loops left cold.
_SCRIPT = """
import json
from numba.core import event
from click.testing import CliRunner
from servesim import precompile
from servesim.cli import main

precompile.compile_cold_loops()
compiled_late = []

class Listener(event.Listener):
    def on_start(self, ev):
        func = ev.data["dispatcher"].py_func
        if func.__module__.startswith("servesim"):
            compiled_late.append(func.__module__ + "." + func.__name__)

    def on_end(self, ev):
        pass

event.register("numba:compile", Listener())
for command in (
    "latency --model llama3-8b --gpu H100 --batch-size 8 --input-len 32 --output-len 16",
    "latency --model qwen3-30b-a3b --gpu A100 --engine sglang --batch-size 4 --input-len 300 --output-len 8",
    "simulate --model qwen3-8b --gpu H100 --workload chat-shared-prefix --qps 8 -n 200",
    "simulate --model qwen3-8b --gpu H100 --workload splitwise-conv --qps 8 -n 200",
):
    result = CliRunner().invoke(main, command.split())
    assert result.exit_code == 0, result.output
print(json.dumps({"late": compiled_late, "cold": [e.name for e in precompile.cold_entry_points()]}))
"""


def test_commands_compile_nothing_after_the_cold_loops_are_compiled(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "SERVESIM_CACHE_DIR": str(tmp_path / "store")}
    done = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"late": [], "cold": []}


def test_shares_keep_groups_together_and_cover_every_loop_once():
    for workers in (1, 2, 3, 16):
        shares = balanced_shares(ENTRY_POINTS, workers)
        assert 1 <= len(shares) <= workers and all(shares)
        flat = [entry for share in shares for entry in share]
        assert sorted(flat, key=ENTRY_POINTS.index) == list(ENTRY_POINTS)
        for share in shares:
            for group in {entry.group for entry in share}:
                # A whole group, in its listed order: each loop compiles after the loops it shares with the others.
                assert [e for e in share if e.group == group] == [e for e in ENTRY_POINTS if e.group == group]
