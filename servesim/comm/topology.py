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

#: Architectures whose NVSwitch (third generation on) reduces in the switch (NVLink SHARP, NCCL's NVLS algorithm).
NVLINK_SHARP_ARCHITECTURES = ("hopper", "blackwell")

#: GPUs per host (compute tray) of a rack-scale NVLink domain: an NVL72 rack is 18 trays of 2 Grace CPUs and 4
#: GPUs, each tray its own operating system (catalogue GB200/GB300 sources; aiconfigurator-core gb200.yaml
#: ``num_gpus_per_node: 4``). Superchips are the only parts sold in such racks.
RACK_SCALE_GPUS_PER_HOST = 4

#: Per-GPU network bandwidth between servers (GB/s, one direction) assumed when the spec sheet gives none: one
#: 200 Gb/s HDR NIC per GPU on Ampere servers (DGX A100), one 400 Gb/s NDR NIC per GPU after (DGX H100/B200).
DEFAULT_INTER_NODE_BANDWIDTH_GBPS = {"ampere": 25.0, "ada": 25.0, "hopper": 50.0, "blackwell": 50.0}


@dataclass(frozen=True)
class Interconnect:
    """The links of one server type, bandwidths per GPU in one direction (GB/s).

    ``nvswitch`` means every GPU of the NVLink domain reaches every other at full NVLink bandwidth; NVLink
    without it is a bridge between pairs (A100 PCIe, H100 NVL, A40), so larger groups cross PCIe.
    ``gpus_per_node`` is the NVLink/PCIe domain size (72 for an NVL72 rack); ``gpus_per_host`` how many of them one
    host (operating system) drives, None when one host drives the whole domain. ``pcie_p2p_via_cpu`` says that
    peer traffic between more than a pair of PCIe GPUs is routed through the CPU root complex rather than PCIe
    switches; a spec sheet never says so (it is a property of the server board), so it is False for predictions
    and set only for a measured server shown to behave so (see ``systems.py``).
    """

    architecture: str
    nvlink_unidir_bandwidth_gbps: float
    nvswitch: bool
    pcie_gen: int
    pcie_unidir_bandwidth_gbps: float
    gpus_per_node: int
    inter_node_bandwidth_gbps: float
    pcie_p2p_via_cpu: bool = False
    gpus_per_host: int | None = None

    @classmethod
    def from_gpu(cls, gpu: GpuSpec, inter_node_bandwidth_gbps: float | None = None) -> "Interconnect":
        if inter_node_bandwidth_gbps is None:
            inter_node_bandwidth_gbps = DEFAULT_INTER_NODE_BANDWIDTH_GBPS.get(gpu.architecture, 25.0)
        rack_scale = gpu.form_factor == "superchip" and gpu.gpus_per_node > 8
        return cls(
            architecture=gpu.architecture,
            nvlink_unidir_bandwidth_gbps=gpu.nvlink_unidir_bandwidth_gbps,
            nvswitch=gpu.nvswitch,
            pcie_gen=gpu.pcie_gen,
            pcie_unidir_bandwidth_gbps=gpu.pcie_unidir_bandwidth_gbps,
            gpus_per_node=gpu.gpus_per_node,
            inter_node_bandwidth_gbps=inter_node_bandwidth_gbps,
            gpus_per_host=RACK_SCALE_GPUS_PER_HOST if rack_scale else None,
        )


@dataclass(frozen=True)
class GroupTopology:
    """The figures of one communicator group of ``group_size`` GPUs spread over ``nodes`` servers.

    ``link_bandwidth_gbps`` is the per-GPU bandwidth of the slowest hop a ring inside one server takes;
    ``nvlink`` says that hop is NVLink; ``fully_connected`` that every pair of the group talks over NVLink (the
    condition the engines' custom all-reduce needs for more than two GPUs); ``nvlink_sharp`` that the switch can
    reduce in-network; ``domain_gpus`` is the size of the NVLink (or PCIe) domain the group lives in;
    ``p2p_via_cpu`` that the group's PCIe peer traffic crosses the CPU root complex; ``hosts`` how many hosts
    (operating systems) the group spans: more than ``nodes`` when it spans compute trays of one NVL72 rack.
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
    nvlink_sharp: bool = False
    domain_gpus: int = 8
    p2p_via_cpu: bool = False
    hosts: int = 1


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
        nvlink_sharp=nvlink_path and interconnect.nvswitch and interconnect.architecture in NVLINK_SHARP_ARCHITECTURES,
        domain_gpus=interconnect.gpus_per_node,
        p2p_via_cpu=interconnect.pcie_p2p_via_cpu and not nvlink_path and per_node > 2,
        hosts=max(nodes, math.ceil(group_size / (interconnect.gpus_per_host or interconnect.gpus_per_node))),
    )
