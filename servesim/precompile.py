"""Compiles servesim's loops on several cores at once when the disk cache is cold (as ``pip install .`` builds the
package, or on an editable install's first run).

numba compiles a loop the first time Python calls it, one loop after another on one core: about 20 s of a first
command on the 2-core development machine (docs/performance.md). Nothing but the order of calls makes that serial:
each loop that Python calls (a loop called only from other loops compiles with its caller) can be compiled ahead
of its first call for the argument types of its call sites, in its own process, and numba's disk cache hands the
result to every later process. :func:`compile_cold_loops` does that for the loops whose cache is missing or made
from another version of their source, split over worker processes by their compile time; a file lock in the cache
folder lets one process compile while the others (a plan's workers) wait for it. ``pip install .`` calls it while
it builds the package (setup.py), so that the package ships the cache. A loop called with types not listed here
still compiles at its first call, only not in parallel.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class EntryPoint:
    """A compiled loop that Python calls: its module, name, argument types (``i8``, ``f8``, ``b1`` and C-contiguous
    arrays of them, ``f8[:,:]``; a trailing ``r``: read-only), its compile time in seconds on the 2-core machine
    after the loops of its group listed before it in :data:`ENTRY_POINTS`, which balances the workers, and its
    group."""

    module: str
    name: str
    args: tuple[str, ...]
    compile_s: float
    group: str  # loops that call the same loops: compiled in one process, which compiles those once


#: Every loop that Python code calls, with the argument types of its call sites (a test checks that the common
#: commands compile nothing after these).
ENTRY_POINTS: tuple[EntryPoint, ...] = (
    EntryPoint("servesim.decompose.launch", "task_arrays", ("f8[:,:]", "f8[:,:]", "f8[:]r", "i8", "f8", "b1"), 1.2,
               "tasks"),
    EntryPoint("servesim.decompose.attention", "_prefill_tasks",
               ("i8[:]", "i8[:]", "i8[:]", "i8", "i8", "i8", "b1", "i8", "i8", "f8[:,:]r", "f8[:]r", "f8"), 2.4,
               "tasks"),
    EntryPoint("servesim.decompose.attention", "_decode_tasks",
               ("i8[:]", "i8[:]", "i8", "i8", "i8", "i8", "i8", "f8[:,:]r", "f8[:]r", "f8"), 1.2, "tasks"),
    EntryPoint("servesim.scheduler", "_round_robin", ("f8[:]", "i8", "i8"), 2.7, "scheduler"),
    EntryPoint("servesim.scheduler", "_min_heap", ("f8[:]", "i8", "i8"), 1.2, "scheduler"),
    EntryPoint("servesim.features", "_per_sm_reduction", ("f8[:,:]", "i8[:]", "f8[:]", "i8"), 1.4, "features"),
    EntryPoint("servesim.serving.fast_forward", "_relaunch_loop",
               ("i8", "i8[:,:]", "f8[:,:]", "i8[:,:]", "f8[:]", "i8[:]", "f8[:,:]", "f8[:,:]", "f8", "b1"), 0.5,
               "serving"),
    EntryPoint("servesim.serving.compiled_loop", "_core_loop",
               ("i8[:]", "f8[:]", "i8[:]", "i8[:]", "f8[:]", "i8[:]", "i8[:,:]", "f8[:,:]", "i8[:,:]", "i8[:,:]",
                "i8[:,:]", "i8[:,:]", "f8[:]", "i8[:,:]", "f8[:]", "i8[:,:]", "i8[:,:]", "f8[:,:]", "i8[:,:]",
                "i8[:]", "f8[:]", "i8[:,:]", "f8[:]", "f8[:,:]", "f8[:]", "i8[:]", "f8[:]", "i8[:]", "f8[:]",
                "i8[:,:]", "i8[:,:]", "i8[:,:]", "i8[:,:]", "i8[:]", "i8[:]"), 17.5, "core"),
    EntryPoint("servesim.serving.compiled_cache", "_refile_children", ("i8[:,:]", "i8[:,:]", "i8[:,:]"), 0.3,
               "core"),
    EntryPoint("servesim.serving.compiled_loop", "_refile", ("i8[:,:]", "f8[:,:]", "i8[:,:]", "f8[:,:]"), 0.3, "core"),
    EntryPoint("servesim.serving.compiled_loop", "_store", ("i8[:,:]", "f8[:,:]", "i8[:]", "f8[:]"), 0.3, "core"),
    EntryPoint("servesim.serving.compiled_loop", "_refile_gaps", ("f8[:]", "i8[:]", "f8[:]", "i8[:]"), 0.3, "core"),
)

_LOCK_NAME = "servesim-compile.lock"


def _numba_type(name: str):
    from numba import types

    scalars = {"i8": types.int64, "f8": types.float64, "b1": types.boolean}
    if name in scalars:
        return scalars[name]
    base, dims = name.split("[")
    return types.Array(scalars[base], dims.count(":"), "C", readonly=name.endswith("r"))


def _dispatcher(entry: EntryPoint):
    return getattr(importlib.import_module(entry.module), entry.name)


def _signature(entry: EntryPoint) -> tuple:
    return tuple(_numba_type(name) for name in entry.args)


def _is_cold(entry: EntryPoint) -> bool:
    """Whether the loop is missing from the disk cache for its listed types and this machine, or cached for
    another version of its source (numba's own lookup, without loading the code). With numba's JIT disabled
    (``NUMBA_DISABLE_JIT``) the loop is plain Python and nothing is cold."""
    from servesim.compiled import cache_index

    dispatcher = _dispatcher(entry)
    if not hasattr(dispatcher, "compile"):
        return False
    index = cache_index(dispatcher)
    if index is None:
        return True
    try:
        return dispatcher._cache._index_key(_signature(entry), dispatcher.targetctx.codegen()) not in index
    except (AttributeError, OSError):  # the source file's hash is part of the key
        return True


def cold_entry_points() -> list[EntryPoint]:
    return [entry for entry in ENTRY_POINTS if _is_cold(entry)]


def compile_entry_points(entries: Sequence[EntryPoint]) -> None:
    """Compiles (or loads from the disk cache) each loop for its listed argument types."""
    for entry in entries:
        _dispatcher(entry).compile(_signature(entry))


def balanced_shares(entries: Sequence[EntryPoint], workers: int) -> list[list[EntryPoint]]:
    """``entries`` split into at most ``workers`` non-empty shares of about equal compile time, a group's entries
    in one share in their order: the costliest group first, each to the share with the least so far."""
    groups: dict[str, list[EntryPoint]] = {}
    for entry in entries:
        groups.setdefault(entry.group, []).append(entry)
    shares: list[list[EntryPoint]] = [[] for _ in range(max(1, min(workers, len(groups))))]
    loads = [0.0] * len(shares)
    for group in sorted(groups.values(), key=lambda g: -sum(e.compile_s for e in g)):
        least = loads.index(min(loads))
        shares[least].extend(group)
        loads[least] += sum(e.compile_s for e in group)
    return [share for share in shares if share]


def _lock_path() -> str | None:
    from servesim import compiled

    try:
        return os.path.join(os.path.dirname(compiled.pairwise_sum._cache._cache_file._index_path), _LOCK_NAME)
    except AttributeError:
        return None


def _compile_in_processes(shares: list[list[EntryPoint]]) -> None:
    """Each share compiled in its own forked process; whatever a process could not compile is left to the lazy
    compile of its first call."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    started = []
    for share in shares[1:]:
        process = context.Process(target=compile_entry_points, args=(share,))
        try:
            process.start()
            started.append(process)
        except (AssertionError, OSError):  # a daemonic parent, or no more processes: compile here instead
            compile_entry_points(share)
    compile_entry_points(shares[0])
    for process in started:
        process.join()


def compile_cold_loops(jobs: int | None = None) -> None:
    """Compiles the loops of :data:`ENTRY_POINTS` whose cache is cold, on up to ``jobs`` processes (default: the
    CPU count), saying so on a terminal (servesim/compiled.py); on a warm cache it only reads their small index
    files. Another process already compiling (holding the lock) is waited for."""
    if not cold_entry_points():
        return
    from servesim import compiled

    compiled._announce()
    lock_path = _lock_path()
    lock = None
    if lock_path is not None:
        try:
            import fcntl

            lock = open(lock_path, "a")  # noqa: SIM115 - held until the compile is done
            fcntl.flock(lock, fcntl.LOCK_EX)
        except (ImportError, OSError):
            lock = None
    try:
        cold = cold_entry_points()  # what another process compiled while this one waited is warm now
        if not cold:
            return
        workers = jobs or os.cpu_count() or 1
        if workers == 1 or len(cold) == 1 or not _can_fork():
            compile_entry_points(cold)
        else:
            _compile_in_processes(balanced_shares(cold, workers))
    finally:
        if lock is not None:
            lock.close()


def _can_fork() -> bool:
    """Whether worker processes can be forked safely: on Linux. macOS offers ``fork`` but a forked child of a
    process that has started system frameworks may crash, and Windows has none; there the loops compile here."""
    import multiprocessing

    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


__all__ = ["ENTRY_POINTS", "EntryPoint", "balanced_shares", "cold_entry_points", "compile_cold_loops",
           "compile_entry_points"]
