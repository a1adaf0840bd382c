"""Where a capacity search's time goes, option by option.

    .venv/bin/python benchmarks/bench_planner.py --model llama3-70b --gpus H100 [other `servesim plan` options]

Runs ``servesim plan ARGS --jobs 1 --json`` in this process (the plan's JSON is discarded) with the parts of the
step-time model timed: the attention of batches not seen before (``StepTimeModel.layer_attentions_us``), of which
the decomposition, SM placement and features of kernels not seen before, and the time of steps outside attention
(``StepTimeModel._predict_rest_us``). No step times are read from earlier plans (``SERVESIM_CACHE_DIR`` is set
empty: servesim/planner/step_store.py). Then it searches every option again with the step-time models the first
pass filled, so that nearly every step time is known: that second, warm pass is the simulation alone, of which the
compiled event loop of one replica (``servesim.serving.compiled_loop``, without its hand-backs to Python), the
decode stretches the Python loop runs without the scheduler (``servesim.serving.fast_forward``: several replicas,
data parallelism) and the runs that stopped early (a bracketing load whose SLO failure
became certain) are timed apart. Prints a row per option and the total.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import servesim.features as features
import servesim.planner.plan as plan
import servesim.planner.search as search_module
import servesim.serving.compiled_loop as compiled_loop
import servesim.serving.simulator as simulator
from servesim.cli import main as servesim_main
from servesim.cli.output import Column, render_table
from servesim.planner.search import OptionResult, OptionTask, Probe, search_capacity
from servesim.serving.step_time import StepTimeModel

_seconds: dict[str, float] = {}


def _timed(part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _seconds[part] = _seconds.get(part, 0.0) + time.perf_counter() - start
    return timed


def _timed_if_stopped(probe: Callable[..., Probe]) -> Callable[..., Probe]:
    """``probe`` whose time counts (as ``stopped``) when its run ended early, a failed SLO being certain."""
    def timed(*args: Any, **kwargs: Any) -> Probe:
        start = time.perf_counter()
        result = probe(*args, **kwargs)
        if result.stopped_by is not None:
            _seconds["stopped"] = _seconds.get("stopped", 0.0) + time.perf_counter() - start
        return result
    return timed


def main(plan_args: list[str]) -> None:
    StepTimeModel.layer_attentions_us = _timed("attention", StepTimeModel.layer_attentions_us)
    os.environ["SERVESIM_CACHE_DIR"] = ""  # every step time predicted here, none read from earlier plans
    StepTimeModel._predict_rest_us = _timed("rest", StepTimeModel._predict_rest_us)
    cached_features = features._kernel_features_cached
    features._kernel_features_cached = _timed("features", cached_features)
    searched: list[tuple[OptionTask, StepTimeModel, OptionResult, dict[str, float], int]] = []

    def search(task: OptionTask, steps: StepTimeModel) -> OptionResult:
        _seconds.clear()
        misses = cached_features.cache_info().misses
        start = time.perf_counter()
        result = search_capacity(task, steps)
        parts = dict(_seconds, cold=time.perf_counter() - start)
        searched.append((task, steps, result, parts, cached_features.cache_info().misses - misses))
        return result

    plan.search_capacity = search
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            servesim_main(["plan", *plan_args, "--jobs", "1", "--json"], standalone_mode=False)
    finally:
        plan.search_capacity = search_capacity
    simulator.fast_forward = _timed("fast_forward", simulator.fast_forward)
    compiled_loop._core_loop = _timed("core", compiled_loop._core_loop)
    search_module._probe = _timed_if_stopped(search_module._probe)
    rows = []
    for task, steps, result, parts, kernels in searched:
        _seconds.clear()
        start = time.perf_counter()
        search_capacity(task, steps)
        rows.append({
            "option": task.label, "probes": len(result.probes), "kernels": kernels, "cold_s": parts["cold"],
            "attention_s": parts.get("attention", 0.0), "features_s": parts.get("features", 0.0),
            "rest_s": parts.get("rest", 0.0), "warm_s": time.perf_counter() - start,
            "core_s": _seconds.get("core", 0.0), "fast_forward_s": _seconds.get("fast_forward", 0.0),
            "stopped_s": _seconds.get("stopped", 0.0),
        })
    numeric = [key for key in rows[0] if key != "option"] if rows else []
    rows.append({"option": "total", **{key: sum(row[key] for row in rows) for key in numeric}})
    columns = [Column("option", "option", align="<"), Column("probes", "probes", "d"),
               Column("kernels", "kernels decomposed", ",d"), Column("cold_s", "search s", ".2f"),
               Column("attention_s", "new attention batches s", ".2f"),
               Column("features_s", "of which kernel features s", ".2f"),
               Column("rest_s", "outside attention s", ".2f"), Column("warm_s", "warm re-search s", ".2f"),
               Column("core_s", "of which compiled loop s", ".2f"),
               Column("fast_forward_s", "of which fast-forward s", ".2f"),
               Column("stopped_s", "of which runs stopped early s", ".2f")]
    print(render_table(rows, columns, "capacity searches, one process"))


if __name__ == "__main__":
    main(sys.argv[1:])
