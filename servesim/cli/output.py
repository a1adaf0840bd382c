"""Rendering results for people (aligned tables) and for tools (JSON, CSV).

Every command that prints rows goes through :func:`emit` so that ``--json`` and ``--csv`` behave the same everywhere.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click


@dataclass(frozen=True)
class Column:
    """A table column: the row key, its header, and how to format a value for the terminal."""

    key: str
    header: str
    fmt: str = ""  # format spec such as ",.1f"; "" prints str(value)
    align: str = ">"  # ">" right (numbers), "<" left (text)


def format_cell(value: Any, column: Column) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if column.fmt and isinstance(value, (int, float)):
        return format(value, column.fmt)
    return str(value)


def render_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], title: str | None = None) -> str:
    """An aligned plain-text table with a header rule."""
    cells = [[format_cell(row.get(c.key), c) for c in columns] for row in rows]
    widths = [max([len(c.header), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = []
    if title:
        lines.append(title)
    lines.append("  ".join(f"{c.header:{c.align}{w}}" for c, w in zip(columns, widths)).rstrip())
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(f"{cell:{c.align}{w}}" for cell, c, w in zip(r, columns, widths)).rstrip() for r in cells)
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def to_json(payload: Any) -> str:
    return json.dumps(_jsonable(payload), indent=2)


def to_csv(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(keys), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _jsonable(row.get(k)) for k in keys})
    return buffer.getvalue()


def emit(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[Column],
    output_format: str,
    title: str | None = None,
    notes: Sequence[str] = (),
    json_payload: Any = None,
) -> None:
    """Print ``rows`` as a table (with ``title`` and ``notes``), JSON or CSV.

    JSON prints ``json_payload`` when given (commands with more than rows to say), else the rows. CSV always has
    one line per row with every column key.
    """
    if output_format == "json":
        click.echo(to_json(rows if json_payload is None else json_payload))
    elif output_format == "csv":
        click.echo(to_csv(rows, [c.key for c in columns]), nl=False)
    else:
        click.echo(render_table(rows, columns, title))
        for note in notes:
            click.echo(note)


def estimator_option(func):
    """Add ``--estimator``: the kernel time estimator, a name from :data:`servesim.estimator.base.ESTIMATORS`,
    checked as the command line is parsed with servesim's one-line error, which suggests the nearest name."""
    from servesim.estimator.base import DEFAULT_ESTIMATOR, ESTIMATORS, check_estimator_name

    return click.option("--estimator", default=DEFAULT_ESTIMATOR, show_default=True,
                        callback=lambda ctx, param, name: check_estimator_name(name),
                        help=f"Kernel time estimator: {' or '.join(sorted(ESTIMATORS))}.")(func)


def output_format_options(func):
    """Add the ``--json`` and ``--csv`` flags, at most one of them, as one ``output_format`` parameter: "table" (the
    default), "json" or "csv"."""

    @functools.wraps(func)
    def command(*args: Any, json_output: bool, csv_output: bool, **kwargs: Any) -> Any:
        if json_output and csv_output:
            raise click.UsageError("--json and --csv are alternatives; give one of them")
        output_format = "json" if json_output else "csv" if csv_output else "table"
        return func(*args, output_format=output_format, **kwargs)

    command = click.option("--csv", "csv_output", is_flag=True,
                           help="Print comma-separated values, one line per row.")(command)
    return click.option("--json", "json_output", is_flag=True, help="Print JSON for tools.")(command)
