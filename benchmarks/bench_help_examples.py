"""How long each example in servesim's help takes (docs/performance.md, "How long the help examples take").

    .venv/bin/python benchmarks/bench_help_examples.py [--timeout 120]

Reads the examples from every command's ``--help`` (the lines that start with ``servesim``, or ``Example:
servesim``), leaving out ``validate``'s and ``collect``'s (they need measured data sets or a CUDA GPU), and runs
each in its own process from a new empty folder with the step store in another (servesim/planner/step_store.py),
numba's cache as the installation has it. Prints one row per example: its wall time, or that it ran past the
timeout.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

import click

from servesim.cli import main as cli
from servesim.cli.output import Column, render_table

CLI = "import sys; from servesim.cli import main; sys.argv[0] = 'servesim'; sys.exit(main())"
#: Commands whose examples need what a development machine may not have.
SKIPPED = ("validate", "collect")
EXAMPLE = re.compile(r"^\s*(?:Example:\s*)?servesim (?P<args>.+?)(?:\s{2,}\(.*\))?\s*$")
COLUMNS = (Column("example", "command", "", "<"), Column("time", "time", "", ">"))


def _commands(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()):
    """Every command below ``group``, with its name path and help text."""
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        sub = click.Context(command, info_name=name, parent=ctx)
        yield (*path, name), command.get_help(sub)
        if isinstance(command, click.Group):
            yield from _commands(command, sub, (*path, name))


def examples() -> list[str]:
    """The help's examples, in command order, each once (``servesim --help`` first)."""
    ctx = click.Context(cli, info_name="servesim")
    found = ["--help"]
    for path, text in _commands(cli, ctx):
        if path[0] in SKIPPED:
            continue
        for line in text.splitlines():
            match = EXAMPLE.match(line)
            if match and match["args"] not in found:
                found.append(match["args"])
    return found


def run(args: str, timeout_s: float) -> str:
    """The example's wall time in its own process, from an empty folder with an empty step store."""
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as store:
        start = time.perf_counter()
        # In a session of its own, so that a timed-out example's worker processes stop with it and do not slow
        # the examples after it.
        with subprocess.Popen([sys.executable, "-c", CLI, *shlex.split(args)], cwd=folder,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                              env={**os.environ, "SERVESIM_CACHE_DIR": store}) as child:
            try:
                returncode = child.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                return f"over {timeout_s:.0f} s (timed out)"
        if returncode:
            raise subprocess.CalledProcessError(returncode, f"servesim {args}")
        return f"{time.perf_counter() - start:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=120.0, help="Seconds before an example is stopped.")
    args = parser.parse_args()
    rows = [{"example": f"servesim {example}", "time": run(example, args.timeout)} for example in examples()]
    print(render_table(rows, COLUMNS))


if __name__ == "__main__":
    main()
