"""The shipped measurement table ``comm_measurements.npz``: every timing the communication model learns from.

Derived from aiconfigurator-core and Vidur by ``scripts/derive_comm_table.py`` (see ``servesim/data/comm.py`` for
the sources and units) so that the installed tool needs neither at run time. Plain arrays, no pickles.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from importlib import resources

import numpy as np

from servesim.comm.analytical import IMPLEMENTATIONS, OPS
from servesim.comm.systems import MEASURED_SYSTEMS

TABLE_FILE = "comm_measurements.npz"
#: Engine codes of a row: NCCL rows belong to no engine.
ENGINE_CODES = ("", "vllm", "sglang")
_INT_COLUMNS = ("system", "op", "implementation", "engine", "group_size", "nodes")


@dataclass(frozen=True, eq=False)
class MeasurementTable:
    """Column arrays, one entry per measured (configuration, message size); codes index the name tuples."""

    systems: tuple[str, ...]
    system: np.ndarray
    op: np.ndarray
    implementation: np.ndarray
    engine: np.ndarray
    group_size: np.ndarray
    nodes: np.ndarray
    message_bytes: np.ndarray
    latency_us: np.ndarray
    sources: tuple[str, ...]
    digest: str

    def __len__(self) -> int:
        return len(self.latency_us)

    def subset(self, mask: np.ndarray) -> "MeasurementTable":
        columns = {name: getattr(self, name)[mask] for name in (*_INT_COLUMNS, "message_bytes", "latency_us")}
        return MeasurementTable(systems=self.systems, sources=self.sources, digest=self.digest, **columns)


def table_from_frame(frame) -> dict[str, np.ndarray]:
    """Arrays to save as the npz from a tidy frame of ``servesim.data.comm.read_comm_measurements``."""
    unknown = sorted(set(frame["system"]) - set(MEASURED_SYSTEMS))
    if unknown:
        raise ValueError(f"measured systems without an interconnect description: {unknown}")
    systems = tuple(sorted(set(frame["system"])))
    return {
        "systems": np.array(systems),
        "system": frame["system"].map(systems.index).to_numpy(np.int16),
        "op": frame["op"].map(OPS.index).to_numpy(np.int8),
        "implementation": frame["implementation"].map(IMPLEMENTATIONS.index).to_numpy(np.int8),
        "engine": frame["engine"].map(ENGINE_CODES.index).to_numpy(np.int8),
        "group_size": frame["group_size"].to_numpy(np.int16),
        "nodes": frame["nodes"].to_numpy(np.int16),
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


def describe(table: MeasurementTable) -> str:
    """One JSON line naming the table's systems, sources and size (for docs and ``eval`` output)."""
    return json.dumps({"rows": len(table), "systems": list(table.systems), "sources": list(table.sources)})
