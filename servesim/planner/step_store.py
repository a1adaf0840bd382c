"""Step times kept between plans and simulations: each option's step-time model (and ``servesim simulate``'s)
starts from the memos that earlier plans and simulations of the same deployment left on disk, and leaves its own
for the next.

About half of a capacity search's time goes into predicting step times (the kernels of batches not met before:
docs/performance.md). Those depend on the deployment's timing identity (model, GPU, layout, engine release,
dtypes), the estimator and servesim's own code and data, never on the workload, the SLOs, the prices or the
target, so a plan that repeats an earlier one's GPUs and layouts, with the same or other SLOs, loads, traffic or
prices, predicts only the steps the earlier plans never met. Its results are the same as with nothing kept: the
stored values are the ones the model would compute.

Kept are the step-time model's memos keyed by counts (:data:`MEMOS`) and the compiled event loop's table of
step-time parts (``loop_table``: a run that starts from it hands nothing back to Python for the steps it holds),
one compressed ``.npz`` of plain integer and float arrays per deployment (no pickles); batches and kernels are
not. The files live in ``$SERVESIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/servesim``, else
``~/.cache/servesim``, in a folder named after a fingerprint of servesim's files (each one's path, size and
modification time) and of the Python, numpy and numba versions, so that any change to the code, the estimator's
weights or the catalogues starts afresh; the first plan to write a new folder keeps the :data:`KEEP_OTHERS` most
recently written folders of other fingerprints (two checkouts, or two versions in turn, then keep each other's)
and removes the rest. ``SERVESIM_CACHE_DIR=`` (empty) keeps nothing. A file that cannot be read is ignored and
one that cannot be written is skipped: either only costs time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

import servesim
from servesim.serving.compiled_loop import table_rows, table_with
from servesim.serving.step_cache import DecodeSpan
from servesim.serving.step_time import StepTimeModel

#: Bumped when the files' layout or the meaning of a memo changes.
FORMAT = 2
#: The step-time model's memos kept, each a dict keyed by a tuple of integers (or one integer).
MEMOS = ("decode_spans", "mixed_attention", "rest_times", "mixed_bodies")
#: Folders of other code fingerprints kept when a new one is made, the most recently written first.
KEEP_OTHERS = 3
#: GPU specification fields that do not enter step times (a price change keeps the stored times).
_NOT_TIMING = frozenset({"price_usd_per_gpu_hour", "price_date", "sources"})


def store_dir() -> Path | None:
    """The folder of this code's stored step times, or None when ``SERVESIM_CACHE_DIR`` is set empty."""
    root = os.environ.get("SERVESIM_CACHE_DIR")
    if root is None:
        root = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "servesim")
    return Path(root) / f"step-times-{code_fingerprint()}" if root else None


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A digest of every file of the servesim package (path, size, modification time) and of the Python, numpy
    and numba versions: whatever a step time depends on besides the deployment."""
    import numba

    package = Path(servesim.__file__).parent
    entries = []
    for folder, subfolders, files in os.walk(package):
        subfolders[:] = sorted(name for name in subfolders if name != "__pycache__")
        for name in sorted(files):
            stat = os.stat(os.path.join(folder, name))
            entries.append((os.path.relpath(os.path.join(folder, name), package), stat.st_size, stat.st_mtime_ns))
    return _digest((FORMAT, sys.version, np.__version__, numba.__version__, entries))[:16]


def timing_key(steps: StepTimeModel) -> str:
    """What the model's step times depend on besides the code, as a file name: the deployment's timing identity,
    the host-overhead constants and the estimator."""
    deployment = steps.deployment
    gpu = tuple((field.name, getattr(deployment.gpu, field.name)) for field in dataclasses.fields(deployment.gpu)
                if field.name not in _NOT_TIMING)
    return _digest((deployment.model, gpu, deployment.par, deployment.release, deployment.dtype,
                    deployment.kv_cache_dtype, deployment.mxfp4_moe_backend, deployment.moe_backend, steps.overhead,
                    steps.estimator.name, steps.estimator.label))[:32]


def _digest(value: object) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()


def load_memos(steps: StepTimeModel) -> None:
    """Add the stored memos of ``steps``'s deployment to its own (nothing when none are stored)."""
    folder = store_dir()
    if folder is None:
        return
    memos = read_memos(folder / f"{timing_key(steps)}.npz")
    for name in MEMOS:
        getattr(steps, name).update(memos.get(name, {}))
    stored = memos.get("loop_table")
    if stored is not None and len(stored[0]):
        steps.loop_table = table_with(steps.loop_table, *stored)


def _memo_entries(steps: StepTimeModel) -> int:
    """How many entries the kept memos of ``steps`` hold: a run that added none has nothing to store."""
    return sum(len(getattr(steps, name)) for name in MEMOS) + (steps.loop_table[2] if steps.loop_table else 0)


@contextlib.contextmanager
def kept_step_times(steps: StepTimeModel) -> Iterator[StepTimeModel]:
    """``steps`` with the stored memos of its deployment added (:func:`load_memos`) for the ``with`` block, which
    stores them again with those the block added (:func:`save_memos`) when it ends without an error and added
    some."""
    load_memos(steps)
    known = _memo_entries(steps)
    yield steps
    if _memo_entries(steps) > known:
        save_memos(steps)


def save_memos(steps: StepTimeModel) -> None:
    """Store ``steps``'s memos with those already stored for its deployment (another process may have added some
    since this one loaded them), replacing the file in one step."""
    folder = store_dir()
    if folder is None:
        return
    path = folder / f"{timing_key(steps)}.npz"
    try:
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            _remove_other_versions(folder)
        memos = read_memos(path)
        for name in MEMOS:
            memos[name] = {**memos.get(name, {}), **getattr(steps, name)}
        if steps.loop_table is not None:
            stored = memos.get("loop_table")
            memos["loop_table"] = table_rows(steps.loop_table if stored is None else
                                             table_with(steps.loop_table, *stored))
        _write_replacing(path, encode(memos))
    except OSError:
        pass  # a store that cannot be written only costs the next plan the time


def _write_replacing(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` beside ``path`` and rename the file over it, so that no reader sees half a file."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, suffix=".npz")
    try:
        with os.fdopen(descriptor, "wb") as file:
            np.savez_compressed(file, **arrays)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _remove_other_versions(folder: Path) -> None:
    """Remove the folders of other fingerprints but the :data:`KEEP_OTHERS` most recently written."""
    others = [other for other in folder.parent.glob("step-times-*") if other != folder]
    others.sort(key=_modified_s, reverse=True)
    for other in others[KEEP_OTHERS:]:
        shutil.rmtree(other, ignore_errors=True)


def _modified_s(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def read_memos(path: Path) -> dict:
    """The memos stored at ``path``; empty when there is no such file or it cannot be read."""
    try:
        with np.load(path, allow_pickle=False) as arrays:
            return decode({name: arrays[name] for name in arrays.files})
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile):
        return {}


def encode(memos: dict) -> dict[str, np.ndarray]:
    """The memos as arrays: per memo, its keys (one row each) and its values' columns; the loop table's rows
    (``loop_table``: keys and values, as :func:`~servesim.serving.compiled_loop.table_rows` gives them) as they
    are."""
    spans = memos.get("decode_spans", {})
    mixed = memos.get("mixed_attention", {})
    rest = memos.get("rest_times", {})
    bodies = memos.get("mixed_bodies", {})
    loop_keys, loop_values = memos.get("loop_table", (np.zeros((0, 7), dtype=np.int64), np.zeros((0, 0))))
    return {
        "loop_table_keys": loop_keys,
        "loop_table_values": loop_values,
        "decode_spans_keys": _int_rows(list(spans), 3),
        "decode_spans_span": np.array([s.span for s in spans.values()], dtype=np.int64),
        "decode_spans_times": _float_rows([(s.overhead_us, s.overhead_delta_us, *s.stage_us, *s.stage_delta_us)
                                           for s in spans.values()]),
        "mixed_attention_keys": _int_rows(list(mixed), 6),
        "mixed_attention_us": np.array([us for us, _ in mixed.values()], dtype=np.float64),
        "mixed_attention_kernels": np.array([n for _, n in mixed.values()], dtype=np.float64),
        "rest_times_keys": _int_rows(list(rest), 3),
        "rest_times_us": _float_rows(list(rest.values())),
        "mixed_bodies_keys": np.array(list(bodies), dtype=np.int64),
        "mixed_bodies_us": _float_rows(list(bodies.values())),
    }


def decode(arrays: dict[str, np.ndarray]) -> dict:
    """The inverse of :func:`encode`: the same keys and values, as the step-time model makes them."""
    times = arrays["decode_spans_times"].tolist()
    stages = (len(times[0]) - 2) // 2 if times else 0
    spans = {tuple(key): DecodeSpan(key[1], span, row[0], tuple(row[2:2 + stages]), row[1], tuple(row[2 + stages:]))
             for key, span, row in zip(arrays["decode_spans_keys"].tolist(), arrays["decode_spans_span"].tolist(),
                                       times)}
    mixed = {tuple(key): (us, n) for key, us, n in zip(arrays["mixed_attention_keys"].tolist(),
                                                        arrays["mixed_attention_us"].tolist(),
                                                        arrays["mixed_attention_kernels"].tolist())}
    rest = {(tokens, requests, bool(decode_only)): tuple(row)
            for (tokens, requests, decode_only), row in zip(arrays["rest_times_keys"].tolist(),
                                                            arrays["rest_times_us"].tolist())}
    bodies = {tokens: tuple(row) for tokens, row in zip(arrays["mixed_bodies_keys"].tolist(),
                                                        arrays["mixed_bodies_us"].tolist())}
    return {"decode_spans": spans, "mixed_attention": mixed, "rest_times": rest, "mixed_bodies": bodies,
            "loop_table": (arrays["loop_table_keys"], arrays["loop_table_values"])}


def _int_rows(keys: list[tuple[int, ...]], width: int) -> np.ndarray:
    return np.array(keys, dtype=np.int64).reshape(len(keys), width)


def _float_rows(rows: list[tuple[float, ...]]) -> np.ndarray:
    return np.array(rows, dtype=np.float64).reshape(len(rows), len(rows[0]) if rows else 0)
