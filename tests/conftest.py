"""Test-wide settings."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _step_store(tmp_path_factory):
    """Commands that keep step times (servesim/planner/step_store.py) keep them in a folder of the test run's own,
    not the user's cache, unless a test or the environment names one."""
    if "SERVESIM_CACHE_DIR" in os.environ:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SERVESIM_CACHE_DIR", str(tmp_path_factory.mktemp("step-store")))
        yield
