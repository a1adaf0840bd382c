"""Loading request traces from CSV or JSONL files.

Recognised without help (by their column names):

- servesim's own ``--out`` files: ``arrival_s, prompt_tokens, output_tokens``;
- Vidur's processed traces: ``arrived_at, num_prefill_tokens, num_decode_tokens`` (``arrived_at`` optional);
- the Azure LLM inference trace: ``TIMESTAMP, ContextTokens, GeneratedTokens`` (timestamps as date-times).

Any other CSV/JSONL loads with a column mapping ``{"prompt": ..., "output": ..., "arrival": ...}`` (arrival
optional). Arrival columns hold seconds, or date-times (ISO 8601) that become seconds since the first request.

pandas is imported when a trace is read, not with the package, so that the command line starts quickly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from servesim.errors import ServesimError

if TYPE_CHECKING:
    import pandas as pd

FIELDS = ("prompt", "output", "arrival")

#: format name → column of each field
FORMATS: dict[str, dict[str, str]] = {
    "servesim": {"prompt": "prompt_tokens", "output": "output_tokens", "arrival": "arrival_s"},
    "vidur": {"prompt": "num_prefill_tokens", "output": "num_decode_tokens", "arrival": "arrived_at"},
    "azure": {"prompt": "ContextTokens", "output": "GeneratedTokens", "arrival": "TIMESTAMP"},
}

_MAPPING_EXAMPLE = "prompt=input_len,output=output_len,arrival=timestamp"


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests read from a file, in arrival order; ``arrival_s`` is None when the file has no arrival times."""

    name: str
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    arrival_s: np.ndarray | None

    def __len__(self) -> int:
        return len(self.prompt_tokens)


def parse_columns(text: str) -> dict[str, str]:
    """Read a column mapping written ``prompt=COL,output=COL[,arrival=COL]``."""
    mapping = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        field, sep, column = (s.strip() for s in item.partition("="))
        if not sep or field not in FIELDS or not column:
            raise ServesimError(f"cannot read column mapping {text!r}: write FIELD=COLUMN pairs with FIELD one of "
                                f"{', '.join(FIELDS)}, e.g. {_MAPPING_EXAMPLE}")
        mapping[field] = column
    return mapping


def _read_rows(path: Path) -> tuple[pd.DataFrame, np.ndarray]:
    """The file's rows as text/JSON values, and the file line number of each row."""
    import pandas as pd

    if path.name.lower().endswith((".jsonl", ".ndjson")):
        records, lines = [], []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ServesimError(f"{path} line {number}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise ServesimError(f"{path} line {number}: expected a JSON object with one request's fields")
            records.append(record)
            lines.append(number)
        return pd.DataFrame.from_records(records), np.array(lines, dtype=np.int64)
    try:
        frame = pd.read_csv(path, dtype=str, skip_blank_lines=False)
    except pd.errors.EmptyDataError:
        raise ServesimError(f"{path} is empty; a trace needs a header row and one row per request") from None
    except pd.errors.ParserError as exc:
        raise ServesimError(f"{path}: malformed CSV ({str(exc).strip().splitlines()[-1]})") from None
    return frame, np.arange(len(frame), dtype=np.int64) + 2  # line 1 is the header


def _resolve_columns(columns: Mapping[str, str] | None, available: list[str], path: Path) -> dict[str, str]:
    if columns is None:
        for fmt in FORMATS.values():
            if fmt["prompt"] in available and fmt["output"] in available:
                return {field: col for field, col in fmt.items() if col in available}
        known = "; ".join(f"{name}: {', '.join(fmt.values())}" for name, fmt in FORMATS.items())
        raise ServesimError(f"{path} has columns {', '.join(map(str, available)) or '(none)'}, not a known trace "
                            f"format ({known}); give a column mapping, e.g. {_MAPPING_EXAMPLE}")
    unknown = set(columns) - set(FIELDS)
    if unknown or not {"prompt", "output"} <= set(columns):
        raise ServesimError(f"a column mapping needs prompt and output (arrival optional) and nothing else, "
                            f"e.g. {_MAPPING_EXAMPLE}")
    missing = [col for col in columns.values() if col not in available]
    if missing:
        raise ServesimError(f"{path} has no column {missing[0]!r}; its columns are {', '.join(map(str, available))}")
    return dict(columns)


def _first_bad(bad: np.ndarray, raw: pd.Series, lines: np.ndarray, path: Path, column: str, expected: str):
    """Raise an error naming the first row where ``bad`` is set."""
    import pandas as pd

    if bad.any():
        i = int(np.argmax(bad))
        value = raw.iloc[i]
        shown = "missing" if pd.isna(value) else repr(value) if isinstance(value, str) else str(value)
        raise ServesimError(f"{path} line {lines[i]}: {column} is {shown}; expected {expected}")


def _tokens(raw: pd.Series, lines: np.ndarray, path: Path, column: str, minimum: int) -> np.ndarray:
    import pandas as pd

    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (values % 1 != 0) | (values < minimum)
    _first_bad(bad, raw, lines, path, column, f"a whole number of tokens >= {minimum}")
    return values.astype(np.int64)


def _seconds(raw: pd.Series, lines: np.ndarray, path: Path, column: str) -> np.ndarray:
    """Seconds as numbers, or date-times as seconds since the earliest; decided by the first row."""
    import pandas as pd

    numbers = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    if len(numbers) and np.isfinite(numbers[0]):
        _first_bad(~np.isfinite(numbers), raw, lines, path, column, "a time in seconds")
        return numbers
    stamps = pd.to_datetime(raw, errors="coerce", format="ISO8601")
    _first_bad(stamps.isna().to_numpy(), raw, lines, path, column, "a time in seconds or an ISO 8601 date-time")
    return (stamps - stamps.min()).dt.total_seconds().to_numpy(dtype=np.float64)


def load_trace(path: str | Path, columns: Mapping[str, str] | None = None) -> Trace:
    """Read a trace, in arrival order (rows are sorted by arrival time, stably).

    ``columns`` maps ``prompt``, ``output`` and optionally ``arrival`` to the file's column names; without it the
    format is recognised from the header. Malformed rows raise :class:`ServesimError` naming the file line. An
    output of 0 tokens counts as 1: the prefill always emits the first token.
    """
    path = Path(path)
    if not path.is_file():
        raise ServesimError(f"no trace file {str(path)!r}; give a profile name, a length spec or a CSV/JSONL path")
    frame, lines = _read_rows(path)
    mapping = _resolve_columns(columns, list(frame.columns), path)
    prompt = _tokens(frame[mapping["prompt"]], lines, path, mapping["prompt"], minimum=1)
    output = np.maximum(_tokens(frame[mapping["output"]], lines, path, mapping["output"], minimum=0), 1)
    if not len(prompt):
        raise ServesimError(f"{path} has no requests")
    if "arrival" not in mapping:
        return Trace(path.stem, prompt, output, None)
    arrival = _seconds(frame[mapping["arrival"]], lines, path, mapping["arrival"])
    order = np.argsort(arrival, kind="stable")
    return Trace(path.stem, prompt[order], output[order], arrival[order])
