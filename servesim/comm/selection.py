"""Which implementation an engine runs for an all-reduce, following the engines' source.

vLLM (``vllm/distributed/device_communicators/custom_all_reduce.py`` and ``all_reduce_utils.py``, v0.11 to v0.24):
the custom all-reduce serves tensor-parallel groups of 2, 4, 6 or 8 GPUs inside one server whose GPUs have P2P
access, and for more than two GPUs only when they are fully NVLink-connected. "One server" is one host
(``in_the_same_node_as``): a group spanning two compute trays of an NVL72 rack runs NCCL although NVLink joins
them. It takes messages below ``max_size``:
8 MiB, lowered with symmetric memory (on by default on compute capability 9.0 and 10.x) to
``CUSTOM_ALL_REDUCE_MAX_SIZES[cc][world_size]``. Larger messages go to symmetric-memory all-reduce there and to
NCCL elsewhere; servesim times both with NCCL (no symmetric-memory measurements exist to learn from).

SGLang (``python/sglang/srt/distributed/device_communicators/custom_all_reduce.py``, v0.5): the same rules with a
fixed 8 MiB ``max_size``, except that its second custom all-reduce (``custom_all_reduce_v2.py``) also serves a
group spanning hosts when they form one NVLink clique (``is_one_nvlink_clique``), as NVL72 trays do.

servesim requires NVLink for the custom kernel even for two GPUs: the engines would also use it on two PCIe GPUs
with working P2P, but P2P over PCIe depends on the server (ACS, IOMMU, driver) rather than the spec sheet, and
without it they fall back to NCCL.
"""

from __future__ import annotations

import numpy as np

from servesim.comm.topology import GroupTopology
from servesim.errors import ServesimError

ENGINES = ("vllm", "sglang")
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)
MIB = 1024 * 1024
DEFAULT_CUSTOM_AR_MAX_BYTES = 8 * MIB

#: vLLM all_reduce_utils.CUSTOM_ALL_REDUCE_MAX_SIZES (v0.11+), keyed by architecture: applies where symmetric
#: memory is available (Hopper cc 9.0, Blackwell datacenter cc 10.x).
VLLM_SYMM_MEM_CUSTOM_AR_MAX_BYTES = {
    "hopper": {2: 64 * MIB, 4: 32 * MIB, 6: MIB // 2, 8: MIB // 4},
    "blackwell": {2: 2 * MIB, 4: 2 * MIB, 6: 1 * MIB, 8: 1 * MIB},
}


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise ServesimError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    return engine


def custom_ar_supported(topo: GroupTopology, engine: str | None = None) -> bool:
    """Whether ``engine`` (either engine when None) enables its custom all-reduce for this group at all."""
    supported = topo.nodes == 1 and topo.group_size in CUSTOM_AR_WORLD_SIZES and topo.nvlink and (
        topo.group_size == 2 or topo.fully_connected)
    if engine is not None and check_engine(engine) == "vllm":
        return supported and topo.hosts == 1
    return supported


def custom_ar_max_bytes(engine: str, topo: GroupTopology) -> int:
    """The engine's size limit: messages strictly below it take the custom kernel (0 where the engine does not
    run it for this group)."""
    if not custom_ar_supported(topo, engine):
        return 0
    if engine == "vllm":
        by_size = VLLM_SYMM_MEM_CUSTOM_AR_MAX_BYTES.get(topo.architecture, {})
        return by_size.get(topo.group_size, DEFAULT_CUSTOM_AR_MAX_BYTES)
    return DEFAULT_CUSTOM_AR_MAX_BYTES


def select_allreduce(engine: str, topo: GroupTopology, message_bytes, cuda_graph: bool = True):
    """Implementation name per message size: ``custom_graph``/``custom_eager`` below the limit, else ``nccl``."""
    size = np.asarray(message_bytes, dtype=float)
    custom = "custom_graph" if cuda_graph else "custom_eager"
    choice = np.where(size < custom_ar_max_bytes(engine, topo), custom, "nccl").astype(object)
    return choice.item() if choice.ndim == 0 else choice
