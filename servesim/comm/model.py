"""Collective latency: alpha-beta physics times a random-forest correction learned from measurements.

The forest predicts ``log(measured / analytical)`` from the message size, the group and what its links physically
are (NVLink bandwidth, full connectivity, in-switch reduction, NVLink domain size, hosts the group spans, PCIe
peer traffic through the CPU, network), the analytical terms themselves, the engine release a custom all-reduce
was timed with and the timing harness, so a GPU never measured is predicted from its interconnect figures.
Figures that only name a product (architecture, PCIe bandwidth of an NVLink server) are left out: the forest would
use them to copy a look-alike system (an A100 taken for the PCIe Gen4 L40S) rather than to generalise.

Two forests, one per timing harness. The kernel-timed one (nccl-tests style, what users get) learns from the
kernel-timed rows and from those Python-timed Vidur rows whose analytical time is at least
:data:`SHARED_ANALYTICAL_US`, where Python's per-call overhead is a small part of the time: they are the only
measurements of PCIe rings beyond a pair in servers with working peer-to-peer (Vidur's pairwise-NVLink boxes).
The Python-timed forest learns from Vidur's rows alone and predicts only them. Engine releases are predicted as
:func:`~servesim.comm.measurements.prediction_releases` says. For one configuration the prediction is a curve
over a fixed grid of message sizes, made non-decreasing and interpolated in log-log space: latency never falls
as messages grow.

The forests are fitted with scikit-learn by ``tools/fit_comm_forests.py`` (the ``train`` extra) and shipped as plain
arrays in :data:`FORESTS_FILE`, stamped with the measurement table's digest and :data:`MODEL_VERSION`: predicting
needs numpy only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from servesim.comm.analytical import IMPLEMENTATIONS, LAUNCH_US, OPS, alpha_beta_us, analytical_time_us
from servesim.comm.forest import PortableForest
from servesim.comm.measurements import ENGINE_CODES, MeasurementTable, load_table, prediction_releases
from servesim.comm.systems import HARNESSES, MEASURED_SYSTEMS
from servesim.comm.topology import GroupTopology, group_topology
from servesim.errors import ServesimError

#: Bump when features, targets or forest settings change: the shipped forests must then be refitted.
MODEL_VERSION = "comm-3"
#: The fitted forests, one per timing harness, that :func:`default_model` loads (``tools/fit_comm_forests.py``
#: rewrites it).
FORESTS_FILE = Path(__file__).with_name("comm_forests.npz")
#: Message-size grid of the prediction curves: 2^6 B to 2^32 B in quarter octaves.
GRID_LOG2_BYTES = np.arange(6.0, 32.0 + 1e-9, 0.25)
#: Triangular weights over ±half an octave of the grid, applied to the forest's correction along a curve. The
#: correction is piecewise constant in the message size, stepping about halfway between measured sizes; averaged,
#: the steps become ramps, so a size between two measured ones gets an interpolated correction rather than its
#: neighbour's (latency is smooth in the size).
SMOOTHING_WEIGHTS = np.array([1.0, 2.0, 3.0, 2.0, 1.0]) / 9.0
#: Python-timed rows also teach the kernel-timed forest where their analytical time is at least this (µs): ten
#: times what a Python call costs (the engines' eager custom all-reduce of the smallest messages, host-bound,
#: takes 20-30 µs on the H100, H200, B200 and B300 servers).
SHARED_ANALYTICAL_US = 300.0


def feature_matrix(op: str, implementation: str, engine: str, engine_release: float, message_bytes: np.ndarray,
                   topo: GroupTopology, harness: str = HARNESSES[0]) -> tuple[np.ndarray, np.ndarray]:
    """(features rows x 21, analytical time µs) of one configuration over many message sizes."""
    size = np.asarray(message_bytes, dtype=float)
    latency, bandwidth, algorithm = alpha_beta_us(op, implementation, size, topo)
    analytical = LAUNCH_US[implementation] + latency + bandwidth
    constant = np.ones_like(size)
    columns = [
        OPS.index(op) * constant,
        IMPLEMENTATIONS.index(implementation) * constant,
        ENGINE_CODES.index(engine if implementation != "nccl" else "") * constant,
        (engine_release if implementation != "nccl" else 0.0) * constant,
        HARNESSES.index(harness) * constant,
        np.log2(size),
        topo.group_size * constant,
        topo.nodes * constant,
        np.log2(topo.link_bandwidth_gbps) * constant,
        float(topo.nvlink) * constant,
        float(topo.fully_connected) * constant,
        float(topo.nvlink_sharp) * constant,
        np.log2(topo.domain_gpus) * constant,
        np.log2(topo.hosts) * constant,
        float(topo.p2p_via_cpu) * constant,
        np.log2(1.0 + topo.inter_node_bandwidth_gbps) * constant,
        np.log2(analytical),
        np.log2(latency),
        np.log2(bandwidth),
        np.log2(bandwidth / latency),
        algorithm.astype(float),
    ]
    return np.column_stack(columns), analytical


def _configurations(table: MeasurementTable):
    """Yield (row indices, op, implementation, engine, engine release, topology, harness) per measured
    configuration."""
    keys = np.column_stack([table.system, table.op, table.implementation, table.engine, table.engine_release,
                            table.group_size, table.nodes])
    unique, inverse = np.unique(keys, axis=0, return_inverse=True)
    for index, (system, op, impl, engine, release, group_size, nodes) in enumerate(unique):
        measured = MEASURED_SYSTEMS[table.systems[int(system)]]
        topo = group_topology(measured.interconnect, int(group_size), int(nodes))
        rows = np.flatnonzero(inverse.ravel() == index)
        yield rows, OPS[int(op)], IMPLEMENTATIONS[int(impl)], ENGINE_CODES[int(engine)], release, topo, measured.harness


def training_arrays(table: MeasurementTable) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per timing harness measured in ``table``: (features, log of measured/analytical) of the rows it learns
    from (see the module docstring for the Python-timed rows the kernel-timed forest shares)."""
    arrays: dict[str, tuple[list, list]] = {}

    def add(harness: str, x: np.ndarray, y: np.ndarray) -> None:
        features, targets = arrays.setdefault(harness, ([], []))
        features.append(x)
        targets.append(y)

    for rows, op, impl, engine, release, topo, harness in _configurations(table):
        x, analytical = feature_matrix(op, impl, engine, release, table.message_bytes[rows], topo, harness)
        y = np.log(table.latency_us[rows] / analytical)
        add(harness, x, y)
        if harness != HARNESSES[0]:
            shared = analytical >= SHARED_ANALYTICAL_US
            add(HARNESSES[0], x[shared], y[shared])
    return {harness: (np.vstack(x), np.concatenate(y)) for harness, (x, y) in arrays.items()}


def _isotonic_increasing(values: np.ndarray) -> np.ndarray:
    """Least-squares non-decreasing fit (pool adjacent violators): a violating run becomes its mean.

    Written out because the curves are a few dozen points and importing scikit-learn for it costs a second and a
    half of every process's start.
    """
    means: list[float] = []
    counts: list[int] = []
    for value in values:
        means.append(float(value))
        counts.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            count = counts[-2] + counts[-1]
            means[-2] = (means[-2] * counts[-2] + means[-1] * counts[-1]) / count
            counts[-2] = count
            means.pop()
            counts.pop()
    return np.repeat(means, counts)


@dataclass(frozen=True, eq=False)
class CommModel:
    """A fitted correction forest per timing harness, the engine releases predictions are made for, and the
    prediction curves computed so far."""

    forests: dict[str, PortableForest]
    releases: dict[str, float]
    _curves: dict = field(default_factory=dict, repr=False)

    def curve_us(self, op: str, implementation: str, engine: str, topo: GroupTopology,
                 harness: str = HARNESSES[0], engine_release: float | None = None) -> np.ndarray:
        """Non-decreasing latency (µs) over :data:`GRID_LOG2_BYTES` for one configuration.

        ``engine_release`` None means the release in :attr:`releases`. A harness with no forest of its own is
        predicted as kernel-timed (nccl-tests). The forest's correction is smoothed (:data:`SMOOTHING_WEIGHTS`)
        and the log-latencies are fitted with an isotonic (pool-adjacent-violators) regression rather than a
        running maximum, so one noisy grid point is averaged away instead of lifting every larger size.
        """
        engine = engine if implementation != "nccl" else ""
        release = self.releases.get(engine, 0.0) if engine_release is None else engine_release
        harness = harness if harness in self.forests else HARNESSES[0]
        key = (op, implementation, engine, release, topo, harness)
        if key not in self._curves:
            x, analytical = feature_matrix(op, implementation, engine, release, 2.0**GRID_LOG2_BYTES, topo, harness)
            log_latency = np.log(analytical) + _smooth(self.forests[harness].predict(x))
            self._curves[key] = np.exp(_isotonic_increasing(log_latency))
        return self._curves[key]

    def time_us(self, op: str, implementation: str, engine: str, message_bytes: np.ndarray,
                topo: GroupTopology, harness: str = HARNESSES[0], engine_release: float | None = None) -> np.ndarray:
        """Latency (µs) per message size: the curve interpolated in log-log space, scaled like the analytical
        time beyond the grid's largest size."""
        size = np.asarray(message_bytes, dtype=float)
        curve = self.curve_us(op, implementation, engine, topo, harness, engine_release)
        log2_size = np.log2(np.maximum(size, 1.0))
        inside = np.exp2(np.interp(log2_size, GRID_LOG2_BYTES, np.log2(curve)))
        largest = 2.0 ** GRID_LOG2_BYTES[-1]
        analytical_end = analytical_time_us(op, implementation, np.array([largest]), topo)
        beyond = curve[-1] * analytical_time_us(op, implementation, np.maximum(size, largest), topo) / analytical_end
        return np.where(log2_size > GRID_LOG2_BYTES[-1], beyond, inside)

    def predict_table(self, table: MeasurementTable) -> np.ndarray:
        """Predicted latency (µs) of every row of ``table``, each at its own engine release (for evaluation)."""
        predicted = np.empty(len(table))
        for rows, op, impl, engine, release, topo, harness in _configurations(table):
            predicted[rows] = self.time_us(op, impl, engine, table.message_bytes[rows], topo, harness, release)
        return predicted


def _smooth(correction: np.ndarray) -> np.ndarray:
    """:data:`SMOOTHING_WEIGHTS` applied along a curve, its end values repeated beyond its ends."""
    half = len(SMOOTHING_WEIGHTS) // 2
    padded = np.concatenate([np.full(half, correction[0]), correction, np.full(half, correction[-1])])
    return np.convolve(padded, SMOOTHING_WEIGHTS, mode="valid")


def forests_arrays(forests: dict[str, PortableForest], digest: str) -> dict[str, np.ndarray]:
    """Arrays of :data:`FORESTS_FILE`: each harness's forest (keys prefixed ``h<harness index>_``), stamped with
    the digest of the table they were fitted on and :data:`MODEL_VERSION`."""
    arrays = {"digest": np.array(digest), "model_version": np.array(MODEL_VERSION)}
    for harness, forest in forests.items():
        arrays.update(forest.arrays(f"h{HARNESSES.index(harness)}_"))
    return arrays


def load_forests(path: Path, table: MeasurementTable) -> dict[str, PortableForest]:
    """The forests in ``path`` for every harness measured in ``table``; an error when they were fitted on another
    table or model version."""
    harnesses = sorted({MEASURED_SYSTEMS[name].harness for name in table.systems}, key=HARNESSES.index)
    rebuild = "rebuild it with 'python tools/fit_comm_forests.py' (needs the train extra)"
    try:
        with np.load(path, allow_pickle=False) as data:
            stamp = (str(data["digest"]), str(data["model_version"]))
            if stamp != (table.digest, MODEL_VERSION):
                raise ServesimError(f"{path} was fitted on measurement table {stamp[0]} for model {stamp[1]}, not "
                                    f"{table.digest} for {MODEL_VERSION}: {rebuild}")
            return {harness: PortableForest.from_arrays(data, f"h{HARNESSES.index(harness)}_")
                    for harness in harnesses}
    except (OSError, KeyError, ValueError) as exc:
        raise ServesimError(f"cannot read the communication model's forests from {path} ({exc}): {rebuild}") from None


@functools.cache
def default_model() -> CommModel:
    """The model fitted on every shipped measurement, as shipped in :data:`FORESTS_FILE`."""
    table = load_table()
    return CommModel(load_forests(FORESTS_FILE, table), prediction_releases(table))
