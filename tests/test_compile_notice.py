"""The first run after an install compiles servesim's loops and says so on a terminal; a warm run says nothing."""

import io
import os
import pty
import subprocess
import sys

import numpy as np
import pytest

from servesim import compiled

#: The smallest run that compiles: import the compiled loops (where the notice is decided) and call one of them,
#: which compiles and caches it, instead of a whole command that compiles every loop.
COMMAND = [sys.executable, "-c", "import numpy as np; from servesim import compiled; "
           "print(compiled.pairwise_sum(np.arange(5.0), 0, 5))"]


def _run_on_a_terminal(cache_dir) -> tuple[str, str]:
    """Runs the command with stderr on a pseudo-terminal; returns (stdout, what the terminal received)."""
    leader, follower = pty.openpty()
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir)}
    env.pop("SERVESIM_COMPILE_NOTICE", None)
    with subprocess.Popen(COMMAND, stdout=subprocess.PIPE, stderr=follower, env=env, text=True) as proc:
        os.close(follower)
        received = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the follower end closed
                break
            if not chunk:
                break
            received += chunk
        stdout = proc.stdout.read()
    os.close(leader)
    assert proc.returncode == 0, received.decode(errors="replace")
    return stdout, received.decode(errors="replace")


def test_a_cold_cache_is_announced_once_and_a_warm_one_not_at_all(tmp_path):
    stdout, terminal = _run_on_a_terminal(tmp_path)
    assert terminal.count(compiled.COMPILE_NOTICE) == 1
    assert compiled.COMPILE_NOTICE not in stdout
    assert any(tmp_path.rglob("*.nbi"))  # the loops were cached where NUMBA_CACHE_DIR says

    stdout_warm, terminal_warm = _run_on_a_terminal(tmp_path)
    assert compiled.COMPILE_NOTICE not in terminal_warm
    assert stdout_warm == stdout


@pytest.fixture
def fresh_notice(monkeypatch):
    monkeypatch.setattr(compiled, "_announced", False)
    monkeypatch.setattr(compiled, "_MAIN_PID", os.getpid())

    def stderr():  # set inside the test: pytest puts its own stderr back between setup and the test
        stream = io.StringIO()
        monkeypatch.setattr(sys, "stderr", stream)
        return stream
    return stderr


def test_redirected_stderr_gets_no_notice(fresh_notice, monkeypatch):
    stderr = fresh_notice()
    monkeypatch.delenv("SERVESIM_COMPILE_NOTICE", raising=False)
    monkeypatch.setattr(compiled, "cache_is_cold", lambda: True)
    compiled.announce_if_cold()
    assert stderr.getvalue() == ""


def test_the_notice_is_written_once_and_only_by_the_main_process(fresh_notice, monkeypatch):
    stderr = fresh_notice()
    monkeypatch.setenv("SERVESIM_COMPILE_NOTICE", "1")
    monkeypatch.setattr(compiled, "cache_is_cold", lambda: True)
    compiled.announce_if_cold()
    compiled.announce_if_cold()
    compiled._announce()  # a later compile
    assert stderr.getvalue() == compiled.COMPILE_NOTICE + "\n"

    monkeypatch.setattr(compiled, "_announced", False)
    monkeypatch.setattr(compiled, "_MAIN_PID", os.getpid() + 1)  # as in a worker process
    compiled._announce()
    assert stderr.getvalue() == compiled.COMPILE_NOTICE + "\n"


def test_a_warm_cache_is_not_announced(fresh_notice, monkeypatch):
    compiled.pairwise_sum(np.ones(3), 0, 3)  # loads it from the cache, or compiles and caches it
    monkeypatch.setattr(compiled, "_announced", False)
    stderr = fresh_notice()
    monkeypatch.setenv("SERVESIM_COMPILE_NOTICE", "1")
    assert not compiled.cache_is_cold()
    compiled.announce_if_cold()
    assert stderr.getvalue() == ""
