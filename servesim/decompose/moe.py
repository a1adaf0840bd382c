"""Fused MoE as vLLM's Triton path runs it (vllm/model_executor/layers/fused_moe/fused_moe.py): tokens sorted by
expert into BLOCK_SIZE_M-padded blocks (moe_align_block_size), a grouped GEMM for gate/up, SiLU&Mul, a grouped
GEMM for down. Each grouped GEMM is a 1-D grid over (padded M blocks x N blocks) with Triton's GROUP_SIZE_M
swizzle; blocks past the padded token count exit at once.

MXFP4 experts (gpt-oss) are decomposed the same way with their weights read at 4.25 bits and multiplied in BF16:
the engines' MXFP4 MoE kernels (OpenAI's Triton ``matmul_ogs`` or Marlin on Hopper and Ampere, FlashInfer's
MXFP4 x BF16 on Blackwell) dequantise each weight tile in the kernel. Their own tilings are not modelled: the tiles
are the BF16 path's."""

from __future__ import annotations

import numpy as np

from servesim.decompose.elementwise import decompose_rowwise
from servesim.decompose.launch import ROUND_ROBIN, Launch, LaunchConfig, check_task_count, pipe_rate_vector, task_set
from servesim.hardware import GpuSpec
from servesim.kernels.types import FusedMoE, SiluMul, dtype_bytes

_TRITON_WARPS = 4
_TRITON_STAGES = 3


def moe_config(kernel: FusedMoE) -> dict[str, int]:
    """fused_moe.py get_default_config (untuned shapes): FP8 block-scaled weights use BLOCK_SIZE_N/K equal to the
    scale block and M 64, GROUP 32; otherwise 16x32x64 (GROUP 1) when tokens <= experts, else 64x64x32 (GROUP 8)."""
    if kernel.dtype == "fp8" and kernel.scale == "block":
        return {"m": 64, "n": 128, "k": 128, "group": 32}
    if kernel.tokens <= kernel.num_experts:
        return {"m": 16, "n": 32, "k": 64, "group": 1}
    return {"m": 64, "n": 64, "k": 32, "group": 8}


def grid_m_blocks(kernel: FusedMoE, block_m: int) -> int:
    """M blocks of the grouped GEMM's grid: the worst-case padded length numel + E·(BLOCK_M − 1) (capped at
    numel·BLOCK_M when numel < E) over BLOCK_M."""
    numel = kernel.tokens * kernel.top_k
    padded = numel + kernel.num_experts * (block_m - 1)
    if numel < kernel.num_experts:
        padded = min(numel * block_m, padded)
    return -(-padded // block_m)


def real_block_rows(kernel: FusedMoE, block_m: int) -> np.ndarray:
    """Rows of each real M block in expert order: ceil(n_e / BLOCK_M) blocks per expert."""
    counts = np.asarray(kernel.expert_tokens, dtype=np.int64)
    per_expert = -(-counts // block_m)
    owner = np.repeat(np.arange(len(counts)), per_expert)
    first = np.cumsum(per_expert) - per_expert
    return np.minimum(block_m, counts[owner] - (np.arange(int(per_expert.sum())) - first[owner]) * block_m)


def _grouped_gemm(kernel: FusedMoE, gpu: GpuSpec, n: int, k: int, cfg: dict[str, int], name: str) -> Launch:
    grid_m, grid_n = grid_m_blocks(kernel, cfg["m"]), -(-n // cfg["n"])
    check_task_count(kernel, grid_m * grid_n)
    block_rows = real_block_rows(kernel, cfg["m"])
    pid = np.arange(grid_m * grid_n)
    # Triton GROUP_SIZE_M swizzle: consecutive programs walk GROUP_SIZE_M row blocks before the next column.
    per_group = cfg["group"] * grid_n
    first_m = pid // per_group * cfg["group"]
    group_rows = np.minimum(grid_m - first_m, cfg["group"])
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rows = np.where(pid_m < len(block_rows), block_rows[np.minimum(pid_m, max(len(block_rows) - 1, 0))], 0)
    cols = np.minimum(cfg["n"], n - pid_n * cfg["n"])
    b, wb = dtype_bytes(kernel.dtype), dtype_bytes(kernel.stored_dtype)  # activations, weights
    active = rows > 0

    def demand(r, c):
        return {
            "tensor": 2.0 * r * c * k,
            "fma": (r * c * active).astype(np.float64),  # epilogue (routing weight / convert)
            "l2": (r * k * b + c * k * active * wb + r * c * 2).astype(np.float64),
            "smem": (2 * (r * k * b + c * k * active * wb)).astype(np.float64),
        }

    useful = demand(rows, cols)
    issued = demand(np.where(active, cfg["m"], 0), np.where(active, cfg["n"], 0))
    unique = kernel.active_experts() * n * k * wb + kernel.routed_pairs() * (k + n) * 2
    tasks = task_set(("pid_m", "pid_n", "rows", "cols", "k"), (pid_m, pid_n, rows, cols, np.full_like(pid, k)),
                     useful, pipe_rate_vector(gpu, kernel.dtype), issued, cold_dram_bytes=unique)
    smem = int(_TRITON_STAGES * (cfg["m"] * b + cfg["n"] * wb) * cfg["k"])
    config = LaunchConfig(_TRITON_WARPS * 32, 128, smem)
    note = f"BLOCK {cfg['m']}x{cfg['n']}x{cfg['k']}, {len(block_rows)} of {grid_m} M blocks hold tokens"
    return Launch(name, config, tasks, ROUND_ROBIN, len(pid), kernel.dtype, (note, *_weight_notes(kernel, gpu)))


def _weight_notes(kernel: FusedMoE, gpu: GpuSpec) -> tuple[str, ...]:
    """What the launch says of weights stored in another dtype than the MMAs run in."""
    if not kernel.weight_dtype:
        return ()
    if gpu.tensor_flops_per_sm_per_cycle.get("fp4", 0) > 0:
        return (f"{kernel.weight_dtype} weights x {kernel.dtype} activations, weight-only (BF16 MMAs)",)
    return (f"{kernel.weight_dtype} weights dequantised to {kernel.dtype} (emulated: {gpu.name} has no FP4 Tensor "
            f"cores)",)


def decompose_moe(kernel: FusedMoE, gpu: GpuSpec) -> tuple[Launch, ...]:
    cfg = moe_config(kernel)
    act = SiluMul(tokens=max(kernel.routed_pairs(), 1), dim=kernel.intermediate)
    return (
        _grouped_gemm(kernel, gpu, 2 * kernel.intermediate, kernel.hidden, cfg, "fused_moe w13 (gate/up)"),
        *decompose_rowwise(act, gpu),
        _grouped_gemm(kernel, gpu, kernel.hidden, kernel.intermediate, cfg, "fused_moe w2 (down)"),
    )
