"""What a collective sees of the machine: the links between the GPUs of one group.

An :class:`Interconnect` describes a server (NVLink and its reach, PCIe, the network between servers). It comes
from a :class:`~servesim.hardware.GpuSpec` for predictions, or from :data:`MEASURED_SYSTEMS` for the machines the
training measurements were taken on. :func:`group_topology` reduces it to the figures of one communicator group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servesim.errors import ServesimError
from servesim.hardware.spec import GpuSpec

#: Ordinal of each architecture: a feature that lets the forest tell link-latency generations apart.
ARCHITECTURES = ("ampere", "ada", "hopper", "blackwell")

#: Per-GPU network bandwidth between servers (GB/s, one direction) assumed when the spec sheet gives none: one
#: 200 Gb/s HDR NIC per GPU on Ampere servers (DGX A100), one 400 Gb/s NDR NIC per GPU after (DGX H100/B200).
DEFAULT_INTER_NODE_BANDWIDTH_GBPS = {"ampere": 25.0, "ada": 25.0, "hopper": 50.0, "blackwell": 50.0}


@dataclass(frozen=True)
class Interconnect:
    """The links of one server type, bandwidths per GPU in one direction (GB/s).

    ``nvswitch`` means every GPU of the NVLink domain reaches every other at full NVLink bandwidth; NVLink
    without it is a bridge between pairs (A100 PCIe, H100 NVL, A40), so larger groups cross PCIe.
    ``gpus_per_node`` is the NVLink/PCIe domain size (72 for an NVL72 rack).
    """

    architecture: str
    nvlink_unidir_bandwidth_gbps: float
    nvswitch: bool
    pcie_gen: int
    pcie_unidir_bandwidth_gbps: float
    gpus_per_node: int
    inter_node_bandwidth_gbps: float

    @classmethod
    def from_gpu(cls, gpu: GpuSpec, inter_node_bandwidth_gbps: float | None = None) -> "Interconnect":
        if inter_node_bandwidth_gbps is None:
            inter_node_bandwidth_gbps = DEFAULT_INTER_NODE_BANDWIDTH_GBPS.get(gpu.architecture, 25.0)
        return cls(
            architecture=gpu.architecture,
            nvlink_unidir_bandwidth_gbps=gpu.nvlink_unidir_bandwidth_gbps,
            nvswitch=gpu.nvswitch,
            pcie_gen=gpu.pcie_gen,
            pcie_unidir_bandwidth_gbps=gpu.pcie_unidir_bandwidth_gbps,
            gpus_per_node=gpu.gpus_per_node,
            inter_node_bandwidth_gbps=inter_node_bandwidth_gbps,
        )


@dataclass(frozen=True)
class GroupTopology:
    """The figures of one communicator group of ``group_size`` GPUs spread over ``nodes`` servers.

    ``link_bandwidth_gbps`` is the per-GPU bandwidth of the slowest hop a ring inside one server takes;
    ``nvlink`` says that hop is NVLink; ``fully_connected`` that every pair of the group talks over NVLink (the
    condition the engines' custom all-reduce needs for more than two GPUs).
    """

    group_size: int
    nodes: int
    architecture: str
    link_bandwidth_gbps: float
    nvlink: bool
    fully_connected: bool
    pcie_gen: int
    pcie_bandwidth_gbps: float
    inter_node_bandwidth_gbps: float

    @property
    def architecture_ordinal(self) -> int:
        return ARCHITECTURES.index(self.architecture) if self.architecture in ARCHITECTURES else len(ARCHITECTURES)


def group_topology(interconnect: Interconnect, group_size: int, nodes: int | None = None) -> GroupTopology:
    """Reduce ``interconnect`` to one group; ``nodes`` defaults to the fewest servers that hold the group."""
    if group_size < 2:
        raise ServesimError(f"a collective needs at least 2 GPUs, got {group_size}; pass --gpus 2 or more")
    if nodes is None:
        nodes = math.ceil(group_size / interconnect.gpus_per_node)
    per_node = math.ceil(group_size / nodes)
    has_nvlink = interconnect.nvlink_unidir_bandwidth_gbps > 0
    nvlink_path = has_nvlink and (interconnect.nvswitch or per_node <= 2)
    link_bandwidth = interconnect.nvlink_unidir_bandwidth_gbps if nvlink_path else interconnect.pcie_unidir_bandwidth_gbps
    return GroupTopology(
        group_size=group_size,
        nodes=nodes,
        architecture=interconnect.architecture,
        link_bandwidth_gbps=float(link_bandwidth),
        nvlink=nvlink_path,
        fully_connected=nvlink_path and nodes == 1,
        pcie_gen=interconnect.pcie_gen,
        pcie_bandwidth_gbps=float(interconnect.pcie_unidir_bandwidth_gbps),
        inter_node_bandwidth_gbps=float(interconnect.inter_node_bandwidth_gbps) if nodes > 1 else 0.0,
    )
