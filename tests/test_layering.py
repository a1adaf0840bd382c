"""The runtime (plan, simulate, latency, kernel) never loads the lab: training, the collector, the dataset readers
and their heavy dependencies (torch, scikit-learn, pyarrow) stay out of ``servesim plan``'s interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

#: Top-level names the runtime must not load: lab packages of servesim and the ``train`` extra's libraries.
LAB_PREFIXES = ("servesim.training", "servesim.collect", "servesim.data", "sklearn", "pyarrow", "torch")


def _loaded_lab_modules(code: str) -> list[str]:
    """Lab modules in ``sys.modules`` after running ``code`` in a fresh interpreter (entries set to None, imports
    blocked on purpose, are not loaded modules)."""
    probe = (f"{code}\nimport json, sys\nprefixes = {LAB_PREFIXES!r}\n"
             "print(json.dumps(sorted(m for m, module in sys.modules.items() if module is not None "
             "and any(m == p or m.startswith(p + '.') for p in prefixes))))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_runtime_imports_load_no_lab_module() -> None:
    code = "import servesim.cli, servesim.planner.plan, servesim.serving.simulator"
    assert _loaded_lab_modules(code) == []


def test_plan_help_loads_no_lab_module() -> None:
    code = ("from servesim.cli import main\n"
            "try:\n    main(['plan', '--help'])\nexcept SystemExit:\n    pass")
    assert _loaded_lab_modules(code) == []


def test_collective_times_need_no_sklearn() -> None:
    """The communication model predicts from its shipped forests with numpy alone: with scikit-learn unimportable,
    a tensor-parallel all-reduce is still timed."""
    code = ("import sys\nsys.modules['sklearn'] = None\n"
            "from servesim.comm import collective_time_us\nfrom servesim.hardware import get_gpu\n"
            "assert collective_time_us('all_reduce', 2**20, 4, get_gpu('H100')) > 0")
    assert _loaded_lab_modules(code) == []
