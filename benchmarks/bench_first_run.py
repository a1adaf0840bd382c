"""How long a user waits after ``pip install .``: the install, then the README's plan twice (docs/performance.md).

    .venv/bin/python benchmarks/bench_first_run.py [--command "plan --model llama3-70b --tp 4 --gpus H100,H20"]

For each way of installing, makes a new virtual environment, installs this checkout into it (``pip install .``,
which compiles the loops into the package as it builds it, setup.py; then the same with
``SERVESIM_BUILD_COMPILE=0``, which leaves the compile to the first command, as an editable install does) and
runs the command in an empty folder with the step store empty, then once more. Needs the package index (pip
fetches the dependencies; its wheel cache makes a second run of this benchmark faster to install). Prints one row
per way: wall seconds of the install and of each command.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from servesim.cli.output import Column, render_table

REPO = pathlib.Path(__file__).resolve().parents[1]
COLUMNS = (
    Column("install", "install", "", "<"),
    Column("install_s", "pip install . (s)", ".1f"),
    Column("first_s", "first command (s)", ".1f"),
    Column("second_s", "second command (s)", ".1f"),
)


def _timed(args: list[str], **kwargs) -> float:
    start = time.perf_counter()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
    return time.perf_counter() - start


def measure(label: str, command: str, build_compile: bool) -> dict:
    """The row of one way of installing: a fresh environment, the install, the command twice."""
    with tempfile.TemporaryDirectory() as scratch:
        venv, work, store = (os.path.join(scratch, name) for name in ("venv", "work", "store"))
        os.mkdir(work)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        env = {key: value for key, value in os.environ.items() if key not in ("NUMBA_CACHE_DIR", "PYTHONPATH")}
        env.update(SERVESIM_BUILD_COMPILE="1" if build_compile else "0", SERVESIM_CACHE_DIR=store)
        pip = [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "--quiet"]
        # Built from a copy, so that no build folder of an earlier run is reused.
        source = os.path.join(scratch, "source")
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", source], check=True)
        try:
            install_s = _timed([*pip, source], env=env, cwd=work)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", source], check=True)
        servesim = [os.path.join(venv, "bin", "servesim"), *command.split()]
        return {"install": label, "install_s": install_s, "first_s": _timed(servesim, env=env, cwd=work),
                "second_s": _timed(servesim, env=env, cwd=work)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--command", default="plan --model llama3-70b --tp 4 --gpus H100,H20",
                        help="The servesim arguments to time.")
    args = parser.parse_args()
    rows = [measure("pip install . (loops compiled while building)", args.command, True),
            measure("SERVESIM_BUILD_COMPILE=0 pip install .", args.command, False)]
    print(f"servesim {args.command}, from the checkout's last commit")
    print(render_table(rows, COLUMNS))


if __name__ == "__main__":
    main()
