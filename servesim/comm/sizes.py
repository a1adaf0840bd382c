"""Message sizes as people type them: '16MiB', '1.5 MB', '4096', '64k'."""

from __future__ import annotations

import re

from servesim.errors import ServesimError

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> float:
    """Bytes in ``text``: a number with an optional unit B, kB/MB/GB (powers of 1000) or KiB/MiB/GiB (of 1024)."""
    match = _PATTERN.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ServesimError(f"cannot read the size {text!r}; give bytes such as 4096, 64KiB, 16MiB or 1.5GB")
    size = float(match.group(1)) * _UNITS[unit]
    if size <= 0:
        raise ServesimError(f"size {text!r} is not positive; give a message size of at least 1 byte")
    return size
