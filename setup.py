"""Build step: servesim's compiled loops are compiled while the package is built, into the numba cache that ships
beside its modules, so that the first command after ``pip install .`` loads them instead of compiling them.

numba keys a cached loop by its source file's contents, the numba and Python versions and the CPU, all of which
the build shares with the installation it builds for. Where one differs (another numba in the environment, a
wheel moved to another CPU), the first run compiles as an editable install's does (docs/performance.md). An
editable install, or ``SERVESIM_BUILD_COMPILE=0``, skips the step; a failure to compile only says so.
"""

from __future__ import annotations

import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyCompilingLoops(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode or os.environ.get("SERVESIM_BUILD_COMPILE") == "0":
            return
        env = {key: value for key, value in os.environ.items() if key != "NUMBA_CACHE_DIR"}
        # The package as built first, then what the build's own PYTHONPATH holds (pip's isolated build environment).
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.abspath(self.build_lib), env.get("PYTHONPATH")]))
        print("servesim: compiling its loops into the package (about 10 s on 2 cores)", file=sys.stderr)
        code = "from servesim import precompile; precompile.compile_cold_loops()"
        compiled = subprocess.run([sys.executable, "-c", code], env=env, cwd=self.build_lib)
        if compiled.returncode != 0:
            print("servesim: the loops did not compile at build time; the first command will compile them",
                  file=sys.stderr)
        for folder, _, files in os.walk(self.build_lib):  # the compile's lock file has no use in the package
            if "servesim-compile.lock" in files:
                os.remove(os.path.join(folder, "servesim-compile.lock"))


setup(cmdclass={"build_py": BuildPyCompilingLoops})
