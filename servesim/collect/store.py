"""Reading and writing a collection directory: the manifest, the per-category CSVs (appended row by row, so an
interrupted run keeps what it measured) and :func:`load_collection`, the reader the estimator trains from."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from servesim.data.aiconfigurator import tidy
from servesim.collect.schema import (
    CPU_LABEL,
    FORMAT_VERSION,
    MANIFEST_FILE,
    CategorySchema,
    Shape,
    get_schema,
)
from servesim.errors import ServesimError


def source_name(directory: Path) -> str:
    """The ``source`` of every row of a collection: the command and the manifest that describes the run."""
    return f"servesim collect {Path(directory).name}/{MANIFEST_FILE}"


def read_manifest(directory: Path) -> dict:
    """The collection's manifest; raises ServesimError for a missing directory or a missing or broken manifest."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ServesimError(f"collection directory {directory} does not exist; pass the --out folder of a "
                            "'servesim collect' run")
    path = directory / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ServesimError(f"{directory} has no {MANIFEST_FILE}; is it the output of 'servesim collect'?") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ServesimError(f"{path} is not a readable JSON manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION or "device" not in manifest:
        raise ServesimError(f"{path} is not a {FORMAT_VERSION} manifest; was it written by 'servesim collect'?")
    return manifest


def write_manifest(directory: Path, manifest: Mapping) -> None:
    """Write the manifest atomically (a reader never sees half a file)."""
    path = Path(directory) / MANIFEST_FILE
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)


def append_rows(path: Path, columns: Iterable[str], rows: Iterable[Mapping]) -> None:
    """Append ``rows`` to the CSV at ``path``, writing the header first when the file is new."""
    columns = list(columns)
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
        if new:
            writer.writeheader()
        writer.writerows(rows)


def read_checked_csv(path: Path, columns: Iterable[str]) -> pd.DataFrame:
    """The CSV as strings, checked to have ``columns``; raises ServesimError for anything unreadable."""
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ServesimError(f"{path} is not a readable CSV ({reason}); re-run 'servesim collect' into a new "
                            "--out folder") from None
    missing = [c for c in columns if c not in raw.columns]
    if missing:
        raise ServesimError(f"{path} lacks the columns {', '.join(missing)}; it was not written by 'servesim collect'")
    return raw


def numeric_column(raw: pd.DataFrame, column: str, path: Path, integer: bool) -> pd.Series:
    """``raw[column]`` as int64 or float64, non-negative (``latency_us``: positive); a ServesimError names the first
    bad row."""
    values = pd.to_numeric(raw[column], errors="coerce")
    bad = values.isna() | (values <= 0 if column == "latency_us" else values < 0)
    if integer:
        bad |= values.fillna(0) % 1 != 0
    if bad.any():
        row = int(bad.to_numpy().argmax())
        kind = "a positive number" if column == "latency_us" else "a non-negative integer"
        raise ServesimError(f"{path}, data row {row + 1}: {column} {raw[column].iloc[row]!r} is not {kind}")
    return values.astype("int64") if integer else values.astype("float64")


def measured_keys(directory: Path, schema: CategorySchema) -> set[tuple[str, Shape]]:
    """(kernel_source, shape) of every row already in ``schema``'s file, for resuming a run."""
    path = Path(directory) / schema.file
    if not path.exists():
        return set()
    raw = read_checked_csv(path, schema.columns)
    raw = raw[raw["dtype"] == schema.row_dtype]
    shape_values = [numeric_column(raw, c, path, integer=True) for c in schema.shape_columns]
    values = zip(*shape_values, *(raw[c] for c in schema.label_columns))
    return {(source, Shape(schema.name, tuple(v))) for source, v in zip(raw["kernel_source"], values)}


def load_collection(directory: Path, category: str, allow_cpu: bool = False) -> pd.DataFrame:
    """The measurements of one kernel category in a ``servesim collect`` directory, in the columns (and dtypes)
    of the aiconfigurator-core loaders: gpu, system, backend, backend_version, kernel_source, the category's
    shape columns (int64), its dtype columns, latency_us (float64), source; strings as categoricals.

    ``category`` is an estimator category: gemm (the BF16 rows of gemm.csv), scaled_mm (its FP8 rows),
    context_attention, generation_attention, rmsnorm, silu_mul, rope, residual_add. A category the run did not
    measure gives an empty frame with those columns. Raises ServesimError for a missing directory, a broken
    manifest or file, and for a ``--device cpu`` collection unless ``allow_cpu``: CPU timings are not GPU
    measurements.
    """
    schema = get_schema(category)
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest["device"] == "cpu" and not allow_cpu:
        raise ServesimError(
            f"{directory} holds CPU timings (servesim collect --device cpu), not GPU measurements; they are not "
            "training data (pass allow_cpu=True to read them anyway)"
        )
    label = CPU_LABEL if manifest["device"] == "cpu" else manifest.get("gpu")
    path = directory / schema.file
    if not path.exists():
        raw = pd.DataFrame({c: pd.Series(dtype=str) for c in schema.columns})
    else:
        raw = read_checked_csv(path, schema.columns)
    frame = raw[list(schema.columns)].copy()
    wrong_gpu = frame["gpu"] != label
    if wrong_gpu.any():
        raise ServesimError(
            f"{path} has rows for GPU {frame['gpu'][wrong_gpu].iloc[0]!r} but its manifest says {label!r}; "
            "one collection holds one device's measurements"
        )
    for column in schema.shape_columns:
        frame[column] = numeric_column(raw, column, path, integer=True)
    frame["latency_us"] = numeric_column(raw, "latency_us", path, integer=False)
    frame = frame[frame["dtype"] == schema.row_dtype].reset_index(drop=True)
    return tidy(frame, [*schema.shape_columns, *schema.label_columns])

