"""The machines the communication measurements were taken on, described by their interconnect.

These describe the *measured boxes* (a Vidur pairwise-NVLink server is no catalogue GPU), so they live here rather
than in the GPU catalogue; ``tests/test_comm_systems.py`` checks that they agree with the catalogue wherever the
catalogue has the GPU. Bandwidths are per GPU, one direction, GB/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.comm.topology import Interconnect

_AIC = "aiconfigurator-core 0.12 systems/{}.yaml node section"
_NVL72 = ("; NVL72: one NVLink domain of 72 GPUs, compute trays of 4 GPUs each run by their own host "
          "(num_gpus_per_node: 4, 2 Grace CPUs x 2 GPUs)")
_VIDUR = "torch.distributed"

#: Timing harnesses: aiconfigurator-core's collectors time the bare kernels with CUDA events (nccl-tests style);
#: Vidur times torch.distributed calls from Python, which adds overhead and noise at small sizes. Predictions are
#: made for the first.
HARNESSES = ("nccl-tests", _VIDUR)

#: Why the measured L40S server is described as routing peer traffic through the CPU: on it every kernel's bus
#: bandwidth collapses beyond a pair (NCCL all-gather 20, 4.7 and 1.2 GB/s on 2, 4 and 8 GPUs; the engines' P2P
#: custom all-reduce likewise), while SGLang 0.5.12's custom all-reduce table of another L40S server in
#: aiconfigurator-core (comm/sglang/0.5.12) runs 8 GPUs at about ten times that, as PCIe switches allow.
_L40S_P2P_VIA_CPU = "peer traffic beyond a pair through the CPU root complex (4- and 8-GPU bus bandwidth collapse)"


@dataclass(frozen=True)
class MeasuredSystem:
    name: str
    gpu: str  # catalogue name of the GPU
    interconnect: Interconnect
    source: str
    harness: str = "nccl-tests"  # how latency was timed: one of HARNESSES


def _system(name: str, gpu: str, source: str, harness: str = "nccl-tests", **figures) -> MeasuredSystem:
    return MeasuredSystem(name=name, gpu=gpu, interconnect=Interconnect(**figures), source=source, harness=harness)


MEASURED_SYSTEMS: dict[str, MeasuredSystem] = {
    s.name: s
    for s in (
        _system("a100_sxm", "A100-SXM-80GB", _AIC.format("a100_sxm") + "; NVLink3 600 GB/s bidirectional",
                architecture="ampere", nvlink_unidir_bandwidth_gbps=300, nvswitch=True, pcie_gen=4,
                pcie_unidir_bandwidth_gbps=32, gpus_per_node=8, inter_node_bandwidth_gbps=25),
        _system("h100_sxm", "H100-SXM", _AIC.format("h100_sxm"),
                architecture="hopper", nvlink_unidir_bandwidth_gbps=450, nvswitch=True, pcie_gen=5,
                pcie_unidir_bandwidth_gbps=64, gpus_per_node=8, inter_node_bandwidth_gbps=50),
        _system("h200_sxm", "H200", _AIC.format("h200_sxm"),
                architecture="hopper", nvlink_unidir_bandwidth_gbps=450, nvswitch=True, pcie_gen=5,
                pcie_unidir_bandwidth_gbps=64, gpus_per_node=8, inter_node_bandwidth_gbps=50),
        _system("b200_sxm", "B200", _AIC.format("b200_sxm"),
                architecture="blackwell", nvlink_unidir_bandwidth_gbps=900, nvswitch=True, pcie_gen=6,
                pcie_unidir_bandwidth_gbps=128, gpus_per_node=8, inter_node_bandwidth_gbps=100),
        _system("b300_sxm", "B300", _AIC.format("b300_sxm"),
                architecture="blackwell", nvlink_unidir_bandwidth_gbps=900, nvswitch=True, pcie_gen=6,
                pcie_unidir_bandwidth_gbps=128, gpus_per_node=8, inter_node_bandwidth_gbps=100),
        _system("gb200", "GB200", _AIC.format("gb200") + _NVL72,
                architecture="blackwell", nvlink_unidir_bandwidth_gbps=900, nvswitch=True, pcie_gen=5,
                pcie_unidir_bandwidth_gbps=64, gpus_per_node=72, inter_node_bandwidth_gbps=900, gpus_per_host=4),
        _system("gb300", "GB300", _AIC.format("gb300") + _NVL72,
                architecture="blackwell", nvlink_unidir_bandwidth_gbps=900, nvswitch=True, pcie_gen=5,
                pcie_unidir_bandwidth_gbps=64, gpus_per_node=72, inter_node_bandwidth_gbps=900, gpus_per_host=4),
        _system("l40s", "L40S", _AIC.format("l40s") + "; no NVLink; " + _L40S_P2P_VIA_CPU,
                architecture="ada", nvlink_unidir_bandwidth_gbps=0, nvswitch=False, pcie_gen=4,
                pcie_unidir_bandwidth_gbps=32, gpus_per_node=8, inter_node_bandwidth_gbps=50, pcie_p2p_via_cpu=True),
        _system("rtx_pro_6000_server", "RTX-PRO-6000", _AIC.format("rtx_pro_6000_server") + "; no NVLink",
                architecture="blackwell", nvlink_unidir_bandwidth_gbps=0, nvswitch=False, pcie_gen=5,
                pcie_unidir_bandwidth_gbps=64, gpus_per_node=8, inter_node_bandwidth_gbps=50),
        _system("vidur_a100_dgx", "A100-SXM-80GB", harness=_VIDUR, source="Vidur network/a100_dgx: DGX A100, 8x 200 Gb/s HDR InfiniBand",
                architecture="ampere", nvlink_unidir_bandwidth_gbps=300, nvswitch=True, pcie_gen=4,
                pcie_unidir_bandwidth_gbps=32, gpus_per_node=8, inter_node_bandwidth_gbps=25),
        _system("vidur_h100_dgx", "H100-SXM", harness=_VIDUR, source="Vidur network/h100_dgx: DGX H100, 8x 400 Gb/s NDR InfiniBand",
                architecture="hopper", nvlink_unidir_bandwidth_gbps=450, nvswitch=True, pcie_gen=5,
                pcie_unidir_bandwidth_gbps=64, gpus_per_node=8, inter_node_bandwidth_gbps=50),
        _system("vidur_a100_pairwise_nvlink", "A100-PCIe", harness=_VIDUR, source=
                "Vidur network/a100_pairwise_nvlink: 4x A100 PCIe, NVLink bridge per pair (600 GB/s bidirectional)",
                architecture="ampere", nvlink_unidir_bandwidth_gbps=300, nvswitch=False, pcie_gen=4,
                pcie_unidir_bandwidth_gbps=32, gpus_per_node=4, inter_node_bandwidth_gbps=25),
        _system("vidur_h100_pairwise_nvlink", "H100-NVL", harness=_VIDUR, source=
                "Vidur network/h100_pairwise_nvlink: 4x H100 NVL, NVLink bridge per pair (600 GB/s bidirectional)",
                architecture="hopper", nvlink_unidir_bandwidth_gbps=300, nvswitch=False, pcie_gen=5,
                pcie_unidir_bandwidth_gbps=64, gpus_per_node=4, inter_node_bandwidth_gbps=50),
    )
}
