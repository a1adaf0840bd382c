"""Compiled loops for the per-task work of a new kernel: decomposition, SM placement and feature reduction.

A capacity search meets tens of thousands of attention kernels of a few hundred tasks each. In numpy each of them
costs about a hundred small array operations, nearly all fixed call overhead; compiled with numba, the same
arithmetic runs as one loop per stage. The loops compute exactly what the numpy operations they replace computed:
every sum that numpy took pairwise (``ndarray.sum``) is taken in the same order by :func:`pairwise_sum`, and the
others add element after element as ``np.bincount`` and ``np.add.accumulate`` do, so features, and everything
predicted from them, do not depend on which of the two computed them.

Compiled code is cached on disk beside the package (numba's ``cache=True``; or under ``NUMBA_CACHE_DIR``), so only
the first run after an install compiles (servesim/precompile.py, on every core). That run takes seconds longer
(docs/performance.md), so when the cache is cold and stderr is a terminal, one line on stderr says so
(:func:`announce_if_cold`). On a warm run that costs the read of one small index file.
"""

from __future__ import annotations

import os
import sys

import numba
import numpy as np
from numba.core import event as _numba_event
from numba.extending import register_jitable

#: The line shown before the loops compile. The time is what a first run took on 2 cores.
COMPILE_NOTICE = "servesim: compiling its inner loops for this machine (first run only, ~17 s on 2 cores)..."
#: Internal switch, for tests: ``1`` shows the notice even when stderr is not a terminal, ``0`` never shows it.
#: Unset, the notice shows only when stderr is a terminal.
_NOTICE_ENV = "SERVESIM_COMPILE_NOTICE"
#: The process that imported this module first; worker processes forked from it compile too, but stay silent.
_MAIN_PID = os.getpid()
_announced = False


def _notice_wanted(stream) -> bool:
    forced = os.environ.get(_NOTICE_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def _announce() -> None:
    """Writes :data:`COMPILE_NOTICE` on stderr as one whole line, at most once per command and only in its main
    process: a progress bar or the command's output follows on the next line."""
    global _announced
    if _announced or os.getpid() != _MAIN_PID:
        return
    _announced = True
    stream = sys.stderr
    if not _notice_wanted(stream):
        return
    try:
        stream.write(COMPILE_NOTICE + "\n")
        stream.flush()
    except (AttributeError, ValueError, OSError):
        pass


def cache_index(dispatcher) -> dict | None:
    """The disk cache's index of a compiled loop (its cached signatures; empty when the cache was made from another
    version of the source, which numba stamps it with a hash of), or None when there is none to read."""
    try:
        return dispatcher._cache._cache_file._load_index()
    except (AttributeError, OSError, EOFError, ValueError):
        return None


def cache_is_cold() -> bool:
    """Whether the loops of this module are missing from the disk cache or cached for another version of their
    source: a read of a small index file (:func:`cache_index`). A new install, a new ``NUMBA_CACHE_DIR`` or an
    upgrade leaves every module's loops cold at once, so this module stands for all of them (a stale loop elsewhere
    is caught by :class:`_CompileListener`)."""
    return not cache_index(pairwise_sum)


def announce_if_cold() -> None:
    """Says on stderr that the loops are about to compile when their cache is cold. Called when this module is
    first imported, before any loop compiles; worker processes forked later inherit ``_announced`` and stay
    silent."""
    if not _announced and cache_is_cold():
        _announce()


class _CompileListener(_numba_event.Listener):
    """numba fires ``numba:compile`` only when a function is compiled, not when it is loaded from the disk cache,
    so a warm run never calls this; a compile of one of servesim's loops announces itself."""

    def on_start(self, event) -> None:
        dispatcher = event.data.get("dispatcher") if isinstance(event.data, dict) else None
        module = getattr(getattr(dispatcher, "py_func", None), "__module__", None) or ""
        if module.startswith("servesim"):
            _announce()

    def on_end(self, event) -> None:
        pass


_numba_event.register("numba:compile", _CompileListener())


#: Decorator for the compiled loops: no Python objects inside, cached on disk; a division by zero gives inf or NaN as
#: in numpy rather than raising.
jit = numba.njit(cache=True, error_model="numpy")
#: Decorator for a helper that only compiled loops call: compiled into each loop that calls it, once for its
#: arguments' types. numba compiles a ``jit`` function called with constants once per combination of their values
#: (a key's kind and its unused zeros made seven copies of the serving loop's table lookup, 3 s of a first run);
#: this one also needs no Python wrapper and no cache files of its own. Called from Python it runs as plain Python.
inner = register_jitable(error_model="numpy")

@inner
def _heap_less(keys: np.ndarray, rows: np.ndarray, a: int, b: int) -> bool:
    return keys[a] < keys[b] or (keys[a] == keys[b] and rows[a, 0] < rows[b, 0])


@inner
def _heap_swap(keys: np.ndarray, rows: np.ndarray, a: int, b: int) -> None:
    keys[a], keys[b] = keys[b], keys[a]
    for column in range(3):
        rows[a, column], rows[b, column] = rows[b, column], rows[a, column]


@inner
def heap_sift_down(keys: np.ndarray, rows: np.ndarray, size: int, at: int) -> None:
    """Move entry ``at`` of a heap of ``size`` entries down to its place."""
    while True:
        child = 2 * at + 1
        if child >= size:
            break
        if child + 1 < size and _heap_less(keys, rows, child + 1, child):
            child += 1
        if not _heap_less(keys, rows, child, at):
            break
        _heap_swap(keys, rows, at, child)
        at = child


@inner
def heap_push(keys: np.ndarray, rows: np.ndarray, sizes: np.ndarray, which: int, key: float, tie: int, a: int,
              b: int) -> None:
    """``heapq.heappush`` of (``key``, ``tie``, ``a``, ``b``) onto a binary heap in compiled loops: the keys in
    ``keys``, the rest in the first three columns of ``rows`` (ordered by key, then ``tie``), its size in
    ``sizes[which]``."""
    at = sizes[which]
    sizes[which] += 1
    keys[at], rows[at, 0], rows[at, 1], rows[at, 2] = key, tie, a, b
    while at > 0:
        parent = (at - 1) // 2
        if not _heap_less(keys, rows, at, parent):
            break
        _heap_swap(keys, rows, at, parent)
        at = parent


@inner
def heap_pop(keys: np.ndarray, rows: np.ndarray, sizes: np.ndarray, which: int) -> None:
    """Drop the first entry of a :func:`heap_push` heap (read it from slot 0 before)."""
    last = sizes[which] - 1
    sizes[which] = last
    _heap_swap(keys, rows, 0, last)
    heap_sift_down(keys, rows, last, 0)


#: numpy's pairwise summation (``PW_BLOCKSIZE``) sums blocks of up to this many values with 8 partial sums.
_PAIRWISE_BLOCK = 128
#: Enough nesting for any array (each level halves the count).
_PAIRWISE_DEPTH = 64


@jit
def _block_sum(values: np.ndarray, start: int, count: int) -> float:
    """numpy's sum of ``count <= 128`` values: in order below 8, else 8 interleaved partial sums, combined in
    pairs, then the rest in order."""
    if count < 8:
        total = 0.0
        for i in range(start, start + count):
            total += values[i]
        return total
    r0, r1, r2, r3 = values[start], values[start + 1], values[start + 2], values[start + 3]
    r4, r5, r6, r7 = values[start + 4], values[start + 5], values[start + 6], values[start + 7]
    i = 8
    while i < count - count % 8:
        r0 += values[start + i]
        r1 += values[start + i + 1]
        r2 += values[start + i + 2]
        r3 += values[start + i + 3]
        r4 += values[start + i + 4]
        r5 += values[start + i + 5]
        r6 += values[start + i + 6]
        r7 += values[start + i + 7]
        i += 8
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < count:
        total += values[start + i]
        i += 1
    return total


@jit
def pairwise_sum(values: np.ndarray, start: int, count: int) -> float:
    """``values[start:start + count].sum()`` as numpy computes it for a contiguous float64 array: blocks of at
    most 128 (:func:`_block_sum`), larger runs split in two at a multiple of 8 below the middle and the halves'
    sums added. The halving is walked with an explicit stack (numba's disk cache does not take recursion)."""
    starts = np.empty(_PAIRWISE_DEPTH, dtype=np.int64)
    counts = np.empty(_PAIRWISE_DEPTH, dtype=np.int64)
    visits = np.zeros(_PAIRWISE_DEPTH, dtype=np.int64)  # halves of the run already pushed
    sums = np.empty(_PAIRWISE_DEPTH)
    top, done = 0, 0
    starts[0], counts[0] = start, count
    while top >= 0:
        run_start, run_count = starts[top], counts[top]
        if run_count <= _PAIRWISE_BLOCK:
            sums[done] = _block_sum(values, run_start, run_count)
            done += 1
            top -= 1
            continue
        half = run_count // 2
        half -= half % 8
        if visits[top] == 2:  # both halves summed: they are the last two results
            done -= 1
            sums[done - 1] = sums[done - 1] + sums[done]
            top -= 1
            continue
        visits[top] += 1
        child_start = run_start if visits[top] == 1 else run_start + half
        child_count = half if visits[top] == 1 else run_count - half
        top += 1
        starts[top], counts[top], visits[top] = child_start, child_count, 0
    return 0.0 + sums[0]  # numpy's reduction starts from 0.0, which turns a -0.0 sum into 0.0


@jit
def stable_argsort(values: np.ndarray, descending: bool) -> np.ndarray:
    """``np.argsort(values, kind="stable")`` (of ``-values`` when ``descending``) for values without NaN: indices by
    value, equal values in index order, which is the one order a stable sort gives. A bottom-up merge sort, written
    out because numba's own ``argsort`` takes seconds to compile on a first run."""
    n = len(values)
    order = np.arange(n)
    spare = np.empty(n, dtype=np.int64)
    width = 1
    while width < n:
        for start in range(0, n, 2 * width):
            middle, end = min(start + width, n), min(start + 2 * width, n)
            left, right = start, middle
            for out in range(start, end):
                # The right run's head goes first only when strictly before the left's: ties keep index order.
                if right < end and (left == middle or (values[order[right]] > values[order[left]] if descending
                                                       else values[order[right]] < values[order[left]])):
                    spare[out] = order[right]
                    right += 1
                else:
                    spare[out] = order[left]
                    left += 1
        order, spare = spare, order
        width *= 2
    return order


announce_if_cold()

__all__ = ["COMPILE_NOTICE", "announce_if_cold", "cache_index", "cache_is_cold", "heap_pop", "heap_push",
           "heap_sift_down", "inner", "jit", "pairwise_sum", "stable_argsort"]
