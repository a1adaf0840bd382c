"""Alpha-beta times of the algorithm each library runs: the physics the random forest corrects.

``time = launch + steps x hop latency + bytes on the busiest link / link bandwidth``, vectorised over message sizes.

Algorithms followed:

- NCCL all-reduce: ring (2(n-1) steps, 2(n-1)/n of the buffer per link) or tree (2 log2 n steps, 2x the buffer),
  whichever is faster, as NCCL's tuner picks by its own cost model (NCCL ``src/graph/tuning.cc``).
  All-gather, reduce-scatter and all-to-all: ring, n-1 steps, (n-1)/n of the buffer. Send/recv: one hop.
  ``message_bytes`` is the whole buffer (nccl-tests' "size"), not one rank's share.
- The engines' custom all-reduce (vLLM ``csrc/custom_all_reduce.cuh``, copied by SGLang ``sgl-kernel``): one-shot
  (every GPU reads the whole buffer of each peer) for 2 GPUs, and on full NVLink below 512 KiB for up to 4 GPUs or
  256 KiB for up to 8; two-shot (reduce-scatter then all-gather through peer memory) above.
"""

from __future__ import annotations

import numpy as np

from servesim.comm.topology import GroupTopology

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
IMPLEMENTATIONS = ("nccl", "custom_graph", "custom_eager")
ALGORITHMS = ("ring", "tree", "one_shot", "two_shot", "p2p")

KIB = 1024
#: Fixed cost of a call: kernel launch and the library's bookkeeping (µs).
LAUNCH_US = {"nccl": 5.0, "custom_graph": 3.0, "custom_eager": 3.0}
#: Latency of one step of an algorithm over each kind of hop (µs).
HOP_LATENCY_US = {"nvlink": 0.7, "pcie": 1.5, "network": 5.0}


def custom_one_shot(message_bytes: np.ndarray, group_size: int, fully_connected: bool) -> np.ndarray:
    """Where the custom all-reduce kernel runs its one-shot variant (vLLM csrc/custom_all_reduce.cuh)."""
    small = ((group_size <= 4) & (message_bytes < 512 * KIB)) | ((group_size <= 8) & (message_bytes < 256 * KIB))
    return np.asarray((group_size == 2) | (fully_connected & small), dtype=bool)


def _hop(topo: GroupTopology) -> tuple[float, float]:
    """(hop latency µs, bottleneck bandwidth in bytes per µs) of the group's ring."""
    if topo.nodes > 1:
        bandwidth_gbps = min(topo.link_bandwidth_gbps, topo.inter_node_bandwidth_gbps)
        return HOP_LATENCY_US["network"], bandwidth_gbps * 1e3
    return HOP_LATENCY_US["nvlink" if topo.nvlink else "pcie"], topo.link_bandwidth_gbps * 1e3


def alpha_beta_us(
    op: str, implementation: str, message_bytes: np.ndarray, topo: GroupTopology
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(latency term µs, bandwidth term µs, algorithm code) per message size; total = launch + both terms."""
    size = np.asarray(message_bytes, dtype=float)
    n = topo.group_size
    alpha_us, bytes_per_us = _hop(topo)
    if implementation != "nccl":
        one_shot = custom_one_shot(size, n, topo.fully_connected)
        latency = np.where(one_shot, 2 * alpha_us, 4 * alpha_us)
        bandwidth = np.where(one_shot, (n - 1) * size, 2 * (n - 1) / n * size) / bytes_per_us
        return latency, bandwidth, np.where(one_shot, ALGORITHMS.index("one_shot"), ALGORITHMS.index("two_shot"))
    if op == "all_reduce":
        ring_latency, ring_bandwidth = 2 * (n - 1) * alpha_us, 2 * (n - 1) / n * size / bytes_per_us
        tree_latency, tree_bandwidth = 2 * np.ceil(np.log2(n)) * alpha_us, 2 * size / bytes_per_us
        ring = ring_latency + ring_bandwidth <= tree_latency + tree_bandwidth
        return (np.where(ring, ring_latency, tree_latency), np.where(ring, ring_bandwidth, tree_bandwidth),
                np.where(ring, ALGORITHMS.index("ring"), ALGORITHMS.index("tree")))
    if op == "send_recv":
        return np.full_like(size, alpha_us), size / bytes_per_us, np.full(size.shape, ALGORITHMS.index("p2p"))
    return (np.full_like(size, (n - 1) * alpha_us), (n - 1) / n * size / bytes_per_us,
            np.full(size.shape, ALGORITHMS.index("ring")))


def analytical_time_us(op: str, implementation: str, message_bytes: np.ndarray, topo: GroupTopology) -> np.ndarray:
    latency, bandwidth, _ = alpha_beta_us(op, implementation, message_bytes, topo)
    return LAUNCH_US[implementation] + latency + bandwidth
