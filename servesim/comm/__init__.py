"""Collective latency (all-reduce, all-gather, reduce-scatter, all-to-all, send/recv) on any GPU's interconnect.

Public API, the wire point for step times::

    collective_time_us("all_reduce", message_bytes, group_size, gpu, engine="vllm")   # µs, vectorised over sizes
    allreduce_implementation("vllm", gpu, group_size, message_bytes)                 # "custom_graph" | "nccl" ...
"""

from __future__ import annotations

import re

import numpy as np

from servesim.comm.analytical import IMPLEMENTATIONS, OPS
from servesim.comm.model import default_model
from servesim.comm.selection import check_engine, custom_ar_supported, select_allreduce
from servesim.comm.topology import GroupTopology, Interconnect, group_topology
from servesim.errors import ServesimError, suggest
from servesim.hardware.spec import GpuSpec

__all__ = ["OPS", "IMPLEMENTATIONS", "allreduce_implementation", "collective_time_us", "normalise_op", "topology_of"]

_OP_KEYS = {re.sub(r"[\s_\-/]+", "", op): op for op in OPS} | {"alltoall": "all_to_all", "p2p": "send_recv",
                                                                  "sendrecv": "send_recv"}


def normalise_op(op: str) -> str:
    """'allreduce', 'all-reduce', 'AllReduce' → 'all_reduce'."""
    key = re.sub(r"[\s_\-/]+", "", op).lower()
    if key not in _OP_KEYS:
        raise ServesimError(f"unknown collective {op!r}.{suggest(op, OPS)} Choose one of {', '.join(OPS)}")
    return _OP_KEYS[key]


def topology_of(gpu: GpuSpec, group_size: int, nodes: int | None = None,
                inter_node_bandwidth_gbps: float | None = None) -> GroupTopology:
    """The group of ``group_size`` GPUs of type ``gpu`` (over the fewest servers unless ``nodes`` says)."""
    return group_topology(Interconnect.from_gpu(gpu, inter_node_bandwidth_gbps), group_size, nodes)


def allreduce_implementation(engine: str, gpu: GpuSpec, group_size: int, message_bytes, *, cuda_graph: bool = True,
                             nodes: int | None = None):
    """What ``engine`` runs for an all-reduce of each size: ``custom_graph`` (``custom_eager`` when not
    ``cuda_graph``) or ``nccl``; a str for a scalar size, an object array for an array of sizes."""
    return select_allreduce(check_engine(engine), topology_of(gpu, group_size, nodes), message_bytes, cuda_graph)


def collective_time_us(op: str, message_bytes, group_size: int, gpu: GpuSpec, implementation: str | None = None,
                       engine: str = "vllm", *, cuda_graph: bool = True, nodes: int | None = None,
                       inter_node_bandwidth_gbps: float | None = None):
    """Predicted latency (µs) of one collective over ``group_size`` GPUs, per message size.

    ``message_bytes`` is the whole buffer (an all-reduce's tensor, an all-gather's gathered output).
    ``implementation`` None lets the engine choose as it would (see :func:`allreduce_implementation`); NCCL serves
    every collective but all-reduce. Returns a float for a scalar size, else an array of the same shape.
    """
    op = normalise_op(op)
    check_engine(engine)
    size = np.asarray(message_bytes, dtype=float)
    if np.any(~np.isfinite(size)) or np.any(size <= 0):
        raise ServesimError("message sizes must be positive numbers of bytes")
    topo = topology_of(gpu, group_size, nodes, inter_node_bandwidth_gbps)
    if implementation is None:
        chosen = select_allreduce(engine, topo, size, cuda_graph) if op == "all_reduce" else "nccl"
        chosen = np.broadcast_to(np.asarray(chosen, dtype=object), size.shape)
    else:
        _check_implementation(op, implementation, topo, gpu, engine)
        chosen = np.full(size.shape, implementation, dtype=object)
    model = default_model()
    result = np.empty(size.shape)
    for impl in set(chosen.ravel()):
        mask = chosen == impl
        result[mask] = model.time_us(op, impl, engine, size[mask], topo)
    return float(result) if result.ndim == 0 else result


def _check_implementation(op: str, implementation: str, topo: GroupTopology, gpu: GpuSpec, engine: str) -> None:
    if implementation not in IMPLEMENTATIONS:
        raise ServesimError(f"unknown implementation {implementation!r}; choose one of {', '.join(IMPLEMENTATIONS)}")
    if implementation == "nccl":
        return
    if op != "all_reduce":
        raise ServesimError(f"the engines' custom kernel only does all-reduce, not {op}; use implementation 'nccl'")
    if not custom_ar_supported(topo, engine):
        raise ServesimError(
            f"{engine}'s custom all-reduce needs {topo.group_size} GPUs (2, 4, 6 or 8) fully connected by NVLink in "
            f"one server (one host for vllm), which {gpu.name} does not offer; use implementation 'nccl'"
        )
