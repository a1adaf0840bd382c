"""Loading request traces from CSV or JSONL files.

Recognised without help (by their column names):

- servesim's own ``--out`` files: ``arrival_s, prompt_tokens, output_tokens`` (with ``segment_ids,
  segment_tokens, output_id`` when the prompts share text);
- Vidur's processed traces: ``arrived_at, num_prefill_tokens, num_decode_tokens`` (``arrived_at`` optional);
- the Azure LLM inference trace: ``TIMESTAMP, ContextTokens, GeneratedTokens`` (timestamps as date-times);
- Mooncake's traces: ``timestamp`` (milliseconds), ``input_length, output_length, hash_ids``.

Any other CSV/JSONL loads with a column mapping ``{"prompt": ..., "output": ..., "arrival": ...}`` (arrival
optional). Arrival columns hold seconds, or date-times (ISO 8601) that become seconds since the first request.

Prompt identity (:mod:`servesim.workloads.prefix`), in any format, from one of (columns of these names, or named in
the mapping):

- ``prompt_id``: the same id, the same whole prompt (and so the same prompt tokens); empty for a prompt of its own;
- ``hash_ids``: Mooncake's block ids, one per block of ``hash_block_tokens`` (512) prompt tokens, the last block
  taking the remainder; a JSON list, or in CSV text such as ``"[1, 2, 3]"`` or ``"1 2 3"``;
- ``segment_ids`` and ``segment_tokens`` (lists as for ``hash_ids``), with ``output_id`` optional: the segments
  themselves, as ``servesim workload --out`` writes them.

pandas is imported when a trace is read, not with the package, so that the command line starts quickly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from servesim.errors import ServesimError, not_utf8
from servesim.limits import MAX_TOKENS
from servesim.workloads.prefix import UNIQUE, PromptSegments

if TYPE_CHECKING:
    import pandas as pd

FIELDS = ("prompt", "output", "arrival")
#: columns that say which prompts share text; found by these names, or named in a column mapping
IDENTITY_FIELDS = ("prompt_id", "hash_ids", "segment_ids", "segment_tokens", "output_id")
#: Mooncake's block size: each of a request's ``hash_ids`` names this many prompt tokens
HASH_BLOCK_TOKENS = 512

#: format name → column of each field
FORMATS: dict[str, dict[str, str]] = {
    "servesim": {"prompt": "prompt_tokens", "output": "output_tokens", "arrival": "arrival_s"},
    "vidur": {"prompt": "num_prefill_tokens", "output": "num_decode_tokens", "arrival": "arrived_at"},
    "azure": {"prompt": "ContextTokens", "output": "GeneratedTokens", "arrival": "TIMESTAMP"},
    "mooncake": {"prompt": "input_length", "output": "output_length", "arrival": "timestamp"},
}
#: seconds per unit of a format's arrival column, where not seconds
_ARRIVAL_UNIT_S = {"mooncake": 1e-3}

_MAPPING_EXAMPLE = "prompt=input_len,output=output_len,arrival=timestamp"


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests read from a file, in arrival order; ``arrival_s`` is None when the file has no arrival times, and
    ``prefixes`` when it says nothing of which prompts share text."""

    name: str
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    arrival_s: np.ndarray | None
    prefixes: PromptSegments | None = None

    def __len__(self) -> int:
        return len(self.prompt_tokens)


def parse_columns(text: str) -> dict[str, str]:
    """Read a column mapping written ``prompt=COL,output=COL[,arrival=COL]``, optionally with ``prompt_id=COL``,
    ``hash_ids=COL`` or ``segment_ids=COL,segment_tokens=COL[,output_id=COL]``."""
    mapping = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        field, sep, column = (s.strip() for s in item.partition("="))
        if not sep or field not in FIELDS + IDENTITY_FIELDS or not column:
            raise ServesimError(f"cannot read column mapping {text!r}: write FIELD=COLUMN pairs with FIELD one of "
                                f"{', '.join(FIELDS + IDENTITY_FIELDS)}, e.g. {_MAPPING_EXAMPLE}")
        mapping[field] = column
    return mapping


def _read_rows(path: Path) -> tuple[pd.DataFrame, np.ndarray]:
    """The file's rows as text/JSON values, and the file line number of each row."""
    try:
        return _read_rows_utf8(path)
    except UnicodeDecodeError:
        raise ServesimError(not_utf8(path)) from None


def _read_rows_utf8(path: Path) -> tuple[pd.DataFrame, np.ndarray]:
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


def _resolve_columns(columns: Mapping[str, str] | None, available: list[str],
                     path: Path) -> tuple[dict[str, str], float]:
    """The column of each field, and the seconds per unit of the arrival column."""
    unit = 1.0
    if columns is None:
        for name, fmt in FORMATS.items():
            if fmt["prompt"] in available and fmt["output"] in available:
                mapping = {field: col for field, col in fmt.items() if col in available}
                unit = _ARRIVAL_UNIT_S.get(name, 1.0)
                break
        else:
            known = "; ".join(f"{name}: {', '.join(fmt.values())}" for name, fmt in FORMATS.items())
            raise ServesimError(f"{path} has columns {', '.join(map(str, available)) or '(none)'}, not a known "
                                f"trace format ({known}); give a column mapping (--columns "
                                f"prompt=COL,output=COL[,arrival=COL]), e.g. --columns {_MAPPING_EXAMPLE}")
    else:
        unknown = set(columns) - set(FIELDS + IDENTITY_FIELDS)
        if unknown or not {"prompt", "output"} <= set(columns):
            raise ServesimError(f"a column mapping needs prompt and output (arrival optional) and nothing else "
                                f"but the prompt identity columns ({', '.join(IDENTITY_FIELDS)}), "
                                f"e.g. {_MAPPING_EXAMPLE}")
        missing = [col for col in columns.values() if col not in available]
        if missing:
            raise ServesimError(f"{path} has no column {missing[0]!r}; its columns are "
                                f"{', '.join(map(str, available))}")
        mapping = dict(columns)
    if not any(field in mapping for field in IDENTITY_FIELDS):
        mapping.update({field: field for field in IDENTITY_FIELDS if field in available})
    given = [field for field in ("prompt_id", "hash_ids", "segment_ids") if field in mapping]
    if len(given) > 1:
        raise ServesimError(f"{path} gives prompt identity as both {given[0]} and {given[1]}; give one of them "
                            f"(map the other's column away with a column mapping)")
    if ("segment_ids" in mapping) != ("segment_tokens" in mapping):
        raise ServesimError(f"{path}: segment_ids and segment_tokens go together; give both or neither")
    if "output_id" in mapping and "segment_ids" not in mapping:
        raise ServesimError(f"{path}: output_id names the outputs that segment_ids quote; give segment_ids and "
                            f"segment_tokens with it")
    return mapping, unit


def _first_bad(bad: np.ndarray, raw: pd.Series, lines: np.ndarray, path: Path, column: str, expected: str):
    """Raise an error naming the first row where ``bad`` is set."""
    import pandas as pd

    if bad.any():
        i = int(np.argmax(bad))
        value = raw.iloc[i]
        missing = pd.api.types.is_scalar(value) and pd.isna(value)  # a JSON list or object is a value too
        shown = "missing" if missing else repr(value) if isinstance(value, str) else str(value)
        raise ServesimError(f"{path} line {lines[i]}: {column} is {shown}; expected {expected}")


def _tokens(raw: pd.Series, lines: np.ndarray, path: Path, column: str, minimum: int) -> np.ndarray:
    import pandas as pd

    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (values % 1 != 0) | (values < minimum) | (values > MAX_TOKENS)
    _first_bad(bad, raw, lines, path, column, f"a whole number of tokens from {minimum} to {MAX_TOKENS:,}")
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


def _id_lists(raw: pd.Series, lines: np.ndarray, path: Path, column: str,
              minimum: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's list of whole numbers (a JSON list, or text like "[1, 2, 3]" or "1 2 3"): per-row counts and
    the values end to end."""
    expected = f"a list of whole numbers >= {minimum}, e.g. [1, 2, 3] or \"1 2 3\""
    rows = []
    for i, value in enumerate(raw.tolist()):
        if isinstance(value, str):
            items = value.replace(",", " ").strip().removeprefix("[").removesuffix("]").split()
        elif isinstance(value, list):
            items = [str(item) for item in value]
        elif isinstance(value, int) and not isinstance(value, bool):
            items = [str(value)]
        else:
            items = None
        if items is not None:
            try:
                numbers = np.array(items, dtype=np.int64) if items else np.zeros(0, np.int64)
            except (ValueError, OverflowError):
                items = None
        if items is None or (len(numbers) and numbers.min() < minimum):
            _first_bad(np.arange(len(raw)) == i, raw, lines, path, column, expected)
        rows.append(numbers)
    counts = np.array([len(row) for row in rows], dtype=np.int64)
    flat = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    return counts, flat


def _row_error(bad: np.ndarray, lines: np.ndarray, path: Path, message: Callable[[int], str]) -> None:
    if bad.any():
        i = int(np.argmax(bad))
        raise ServesimError(f"{path} line {lines[i]}: {message(i)}")


def _prefixes(frame: pd.DataFrame, mapping: dict[str, str], prompt: np.ndarray, output: np.ndarray,
              lines: np.ndarray, path: Path, hash_block_tokens: int) -> PromptSegments | None:
    """The prompts as segments, from whichever identity column the mapping names (None when none)."""
    import pandas as pd

    n = len(prompt)
    if "prompt_id" in mapping:
        column = mapping["prompt_id"]
        raw = frame[column]
        try:
            codes, _ = pd.factorize(raw, use_na_sentinel=True)
        except TypeError:
            bad = np.array([isinstance(v, (list, dict)) for v in raw.tolist()])
            _first_bad(bad, raw, lines, path, column, "a prompt id (text or a number)")
            raise
        codes = codes.astype(np.int64)  # -1 (UNIQUE) where missing
        named = codes >= 0
        first_row = np.full(codes.max(initial=-1) + 1, n, dtype=np.int64)
        np.minimum.at(first_row, codes[named], np.flatnonzero(named))
        first = np.arange(n)
        first[named] = first_row[codes[named]]
        _row_error(prompt != prompt[first], lines, path, lambda i: (
            f"{column} {raw.iloc[i]!r} has {prompt[i]} prompt tokens, but line {lines[first[i]]} gave it "
            f"{prompt[first[i]]}; one prompt id names one prompt, so its length must agree"))
        return PromptSegments(np.arange(n + 1), codes, prompt, np.full(n, UNIQUE))
    if "hash_ids" in mapping:
        column = mapping["hash_ids"]
        counts, ids = _id_lists(frame[column], lines, path, column, minimum=0)
        blocks = -(-prompt // hash_block_tokens)
        _row_error(counts != blocks, lines, path, lambda i: (
            f"{column} has {counts[i]} block ids, but {prompt[i]} prompt tokens make {blocks[i]} blocks of "
            f"{hash_block_tokens} (the last one takes the remainder)"))
        offsets = np.concatenate([[0], np.cumsum(counts)])
        tokens = np.full(len(ids), hash_block_tokens, dtype=np.int64)
        tokens[offsets[1:] - 1] = prompt - hash_block_tokens * (counts - 1)
        return PromptSegments(offsets, ids, tokens, np.full(n, UNIQUE))
    if "segment_ids" in mapping:
        id_column, token_column = mapping["segment_ids"], mapping["segment_tokens"]
        counts, ids = _id_lists(frame[id_column], lines, path, id_column, minimum=UNIQUE)
        token_counts, tokens = _id_lists(frame[token_column], lines, path, token_column, minimum=1)
        _row_error((counts != token_counts) | (counts == 0), lines, path, lambda i: (
            f"{id_column} has {counts[i]} ids and {token_column} {token_counts[i]} lengths; give each segment "
            f"of the prompt (at least one) an id and a length"))
        offsets = np.concatenate([[0], np.cumsum(counts)])
        sums = np.add.reduceat(tokens, offsets[:-1])
        _row_error(sums != prompt, lines, path, lambda i: (
            f"{token_column} add up to {sums[i]} tokens, not the prompt's {prompt[i]}"))
        outputs = np.full(n, UNIQUE, dtype=np.int64)
        if "output_id" in mapping:
            column = mapping["output_id"]
            raw = frame[column]
            values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            missing = raw.isna().to_numpy()
            with np.errstate(invalid="ignore"):
                bad = ~missing & (~np.isfinite(values) | (values % 1 != 0) | (values < UNIQUE))
            _first_bad(bad, raw, lines, path, column, f"a whole number >= {UNIQUE} (or empty)")
            outputs = np.where(missing, UNIQUE, np.nan_to_num(values)).astype(np.int64)
        return PromptSegments(offsets, ids, tokens, outputs)
    return None


def load_trace(path: str | Path, columns: Mapping[str, str] | None = None,
               hash_block_tokens: int = HASH_BLOCK_TOKENS) -> Trace:
    """Read a trace, in arrival order (rows are sorted by arrival time, stably).

    ``columns`` maps ``prompt``, ``output`` and optionally ``arrival`` (and the prompt identity fields
    ``prompt_id``, ``hash_ids``, ``segment_ids``, ``segment_tokens``, ``output_id``) to the file's column names;
    without it the format is recognised from the header, and identity columns by their names.
    ``hash_block_tokens`` is the prompt tokens per ``hash_ids`` entry. Malformed rows raise
    :class:`ServesimError` naming the file line. An output of 0 tokens counts as 1: the prefill always emits the
    first token.
    """
    path = Path(path)
    if not path.is_file():
        raise ServesimError(f"no trace file {str(path)!r}; give a profile name, a length spec or a CSV/JSONL path")
    if hash_block_tokens < 1:
        raise ServesimError(f"the tokens per hash_ids block must be at least 1, not {hash_block_tokens}")
    frame, lines = _read_rows(path)
    mapping, unit_s = _resolve_columns(columns, list(frame.columns), path)
    prompt = _tokens(frame[mapping["prompt"]], lines, path, mapping["prompt"], minimum=1)
    output = np.maximum(_tokens(frame[mapping["output"]], lines, path, mapping["output"], minimum=0), 1)
    if not len(prompt):
        raise ServesimError(f"{path} has no requests")
    prefixes = _prefixes(frame, mapping, prompt, output, lines, path, hash_block_tokens)
    if "arrival" not in mapping:
        return Trace(path.stem, prompt, output, None, prefixes)
    arrival = _seconds(frame[mapping["arrival"]], lines, path, mapping["arrival"]) * unit_s
    order = np.argsort(arrival, kind="stable")
    return Trace(path.stem, prompt[order], output[order], arrival[order],
                 None if prefixes is None else prefixes.take(order))
