"""``pip install .`` compiles the loops into the package (setup.py): after it, no loop is cold, so the first command
loads them instead of compiling (docs/performance.md)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
COLD = "from servesim import precompile; print(len(precompile.cold_entry_points()))"


def _installed(tmp_path: pathlib.Path, build_compile: str) -> pathlib.Path:
    """The package built from a copy of the checkout (``SERVESIM_BUILD_COMPILE`` set as given) and installed into a
    folder of its own."""
    source = tmp_path / "source"
    shutil.copytree(REPO / "servesim", source / "servesim", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    env = {key: value for key, value in os.environ.items() if key != "NUMBA_CACHE_DIR"}
    env["SERVESIM_BUILD_COMPILE"] = build_compile
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "wheel"), str(source)],
                   check=True, env=env, cwd=tmp_path)
    (wheel,) = (tmp_path / "wheel").glob("servesim-*.whl")
    target = tmp_path / "installed"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True, env=env)
    return target


def _cold_loops(target: pathlib.Path) -> int:
    env = {key: value for key, value in os.environ.items() if key != "NUMBA_CACHE_DIR"}
    env["PYTHONPATH"] = str(target)
    done = subprocess.run([sys.executable, "-c", COLD], check=True, env=env, cwd=target, capture_output=True,
                          text=True)
    return int(done.stdout)


def test_the_built_package_carries_every_loop_compiled(tmp_path):
    assert _cold_loops(_installed(tmp_path, "1")) == 0


def test_without_the_build_compile_every_loop_is_left_to_the_first_command(tmp_path):
    from servesim.precompile import ENTRY_POINTS

    assert _cold_loops(_installed(tmp_path, "0")) == len(ENTRY_POINTS)
