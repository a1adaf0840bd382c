"""User-facing errors.

A :class:`ServesimError` carries a one-line message that says what is wrong and how to fix it. The CLI prints it
without a traceback and exits non-zero; library users can catch it.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from collections.abc import Iterable


class ServesimError(Exception):
    """An error caused by the user's input, with a message fit to print as-is."""


def suggest(name: str, candidates: Iterable[str], limit: int = 3) -> str:
    """Return a ' Did you mean ...?' suffix listing the nearest candidate names, or '' when none is close."""
    pool = list(candidates)
    lowered = {c.lower(): c for c in pool}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=limit, cutoff=0.5)
    if not close:
        close = [lowered[c] for c in lowered if name.lower() in c][:limit]
    else:
        close = [lowered[c] for c in close]
    return f" Did you mean {', '.join(close)}?" if close else ""


def not_utf8(path: Path | str) -> str:
    """The one-line error for a file that is not UTF-8 text, naming the line and byte of the first bad byte."""
    try:
        data = Path(path).read_bytes()
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        return (f"{path} line {line} is not UTF-8 text (byte 0x{data[exc.start]:02x}); save it as UTF-8, e.g. "
                f"iconv -f latin1 -t utf-8")
    except OSError:
        pass
    return f"{path} is not UTF-8 text; save it as UTF-8, e.g. iconv -f latin1 -t utf-8"
