"""The shipped measurement table ``comm_measurements.npz``: every timing the communication model learns from.

Derived from aiconfigurator-core and Vidur by ``tools/derive_comm_table.py`` (see ``servesim/data/comm.py`` for
the sources and units) so that the installed tool needs neither at run time. Plain arrays, no pickles.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import numpy as np

from servesim.comm.analytical import IMPLEMENTATIONS, OPS
from servesim.comm.systems import MEASURED_SYSTEMS

TABLE_FILE = "comm_measurements.npz"
#: Engine codes of a row: NCCL rows belong to no engine.
ENGINE_CODES = ("", "vllm", "sglang")
_INT_COLUMNS = ("system", "op", "implementation", "engine", "group_size", "nodes")
_COLUMNS = (*_INT_COLUMNS, "engine_release", "newest", "message_bytes", "latency_us")


def release_number(version: str) -> float:
    """An engine release as one increasing number: '0.24.0' -> 2400, '0.5.14' -> 514 ('' -> 0, NCCL rows)."""
    parts = [int(p) for p in re.findall(r"\d+", version)[:3]] + [0, 0, 0]
    return float(parts[0] * 10000 + parts[1] * 100 + parts[2])


@dataclass(frozen=True, eq=False)
class MeasurementTable:
    """Column arrays, one entry per measured (configuration, engine release, message size); codes index the name
    tuples. ``engine_release`` is :func:`release_number` of the engine release a custom all-reduce row was timed
    with (0 for NCCL rows); ``newest`` marks the rows of the newest release measured on their system, the ones
    accuracy is reported on (older releases only train)."""

    systems: tuple[str, ...]
    system: np.ndarray
    op: np.ndarray
    implementation: np.ndarray
    engine: np.ndarray
    group_size: np.ndarray
    nodes: np.ndarray
    engine_release: np.ndarray
    newest: np.ndarray
    message_bytes: np.ndarray
    latency_us: np.ndarray
    sources: tuple[str, ...]
    digest: str

    def __len__(self) -> int:
        return len(self.latency_us)

    def subset(self, mask: np.ndarray) -> "MeasurementTable":
        columns = {name: getattr(self, name)[mask] for name in _COLUMNS}
        return MeasurementTable(systems=self.systems, sources=self.sources, digest=self.digest, **columns)


def prediction_releases(table: MeasurementTable) -> dict[str, float]:
    """Per engine, the release predictions are made for: the newest one measured on at least half of the systems
    that have that engine's tables (vLLM 0.24.0 and SGLang 0.5.14 in the shipped table; vLLM 0.27.0 was measured
    on the GB300 alone)."""
    releases = {"": 0.0}
    for code, engine in enumerate(ENGINE_CODES):
        rows = table.engine == code
        if not engine or not rows.any():
            continue
        pairs = np.unique(np.column_stack([table.engine_release[rows], table.system[rows]]), axis=0)
        candidates, systems_measured = np.unique(pairs[:, 0], return_counts=True)
        widespread = candidates[systems_measured * 2 >= len(np.unique(pairs[:, 1]))]
        releases[engine] = float(widespread.max())
    return releases


def table_from_frame(frame) -> dict[str, np.ndarray]:
    """Arrays to save as the npz from a tidy frame of ``servesim.data.comm.read_comm_measurements``."""
    unknown = sorted(set(frame["system"]) - set(MEASURED_SYSTEMS))
    if unknown:
        raise ValueError(f"measured systems without an interconnect description: {unknown}")
    systems = tuple(sorted(set(frame["system"])))
    release = frame["version"].map(release_number)
    newest = release == release.groupby([frame["system"], frame["engine"]]).transform("max")
    return {
        "systems": np.array(systems),
        "system": frame["system"].map(systems.index).to_numpy(np.int16),
        "op": frame["op"].map(OPS.index).to_numpy(np.int8),
        "implementation": frame["implementation"].map(IMPLEMENTATIONS.index).to_numpy(np.int8),
        "engine": frame["engine"].map(ENGINE_CODES.index).to_numpy(np.int8),
        "group_size": frame["group_size"].to_numpy(np.int16),
        "nodes": frame["nodes"].to_numpy(np.int16),
        "engine_release": release.to_numpy(np.float64),
        "newest": newest.to_numpy(bool),
        "message_bytes": frame["message_bytes"].to_numpy(np.float64),
        "latency_us": frame["latency_us"].to_numpy(np.float64),
        "sources": np.array(sorted(set(frame["source"]))),
    }


@functools.cache
def load_table() -> MeasurementTable:
    """The shipped table (read once per process)."""
    raw = resources.files("servesim.comm").joinpath(TABLE_FILE).read_bytes()
    import io

    with np.load(io.BytesIO(raw), allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    return MeasurementTable(
        systems=tuple(str(s) for s in arrays.pop("systems")),
        sources=tuple(str(s) for s in arrays.pop("sources")),
        digest=hashlib.sha256(raw).hexdigest()[:16],
        **arrays,
    )
