"""GEMM-family decomposition: cuBLAS BF16/FP16 GEMM (closed source: a documented surrogate) and the FP8 scaled MMs
of vLLM's CUTLASS, SGLang's sgl-kernel and DeepGEMM (open: their dispatch tables and heuristics), as output tiles
(x split-K chunks).

Every function here takes numpy arrays of shapes so that many GEMMs are tiled at once; the single-kernel path
calls them with one-element arrays. Mapping sources are listed in docs/synperf.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servesim.decompose.launch import (
    ROUND_ROBIN,
    STATIC_PERSISTENT,
    Launch,
    LaunchConfig,
    check_task_count,
    cold_bytes,
    dram_fraction,
    occupancy,
    pipe_rate_vector,
    task_set,
)
from servesim.hardware import GpuSpec
from servesim.kernels.types import Gemm, ScaledMM, dtype_bytes

#: Bytes of one K step of a Hopper TMA/wgmma pipeline stage (64 bf16 or 128 fp8 elements: a 128-byte swizzle row).
_HOPPER_BK_BYTES = 128
#: Split-K keeps at least this many BK steps per split so the software pipeline stays full (surrogate).
_MIN_K_STEPS_PER_SPLIT = 8
_MAX_SPLITS = 16


@dataclass(frozen=True, eq=False)
class GemmTiling:
    """The tile configuration of a batch of GEMM-family launches (arrays broadcast over the batch)."""

    bm: np.ndarray
    bn: np.ndarray
    bk: np.ndarray
    splits: np.ndarray
    k_chunk: np.ndarray  # K elements per split, a multiple of bk
    warp_m: np.ndarray  # rows one MMA warp(group) owns: shared-memory reads of B repeat bm / warp_m times
    warp_n: np.ndarray
    threads: int | np.ndarray
    registers: int
    smem_bytes: np.ndarray
    persistent: bool | np.ndarray
    in_bytes: float
    out_bytes: float
    block_scale_k: int = 0  # K granularity of block scales (0: per-tensor scales)
    block_scale_n: int = 0

    def tiles_m(self, m: np.ndarray) -> np.ndarray:
        return -(-m // self.bm)

    def tiles_n(self, n: np.ndarray) -> np.ndarray:
        return -(-n // self.bn)

    def num_tasks(self, m: np.ndarray, n: np.ndarray) -> np.ndarray:
        return self.tiles_m(m) * self.tiles_n(n) * self.splits


def _major(gpu: GpuSpec) -> int:
    return int(gpu.compute_capability.split(".")[0])


def _is_sm90_family(gpu: GpuSpec) -> bool:
    """Hopper and datacenter Blackwell run TMA/warp-specialised persistent kernels; Ampere/Ada/consumer Blackwell
    run classic multistage grids."""
    return _major(gpu) in (9, 10)


def _stages(stage_bytes: np.ndarray, gpu: GpuSpec, epilogue_bytes: int, cap: int | np.ndarray) -> np.ndarray:
    budget = gpu.max_smem_per_cta_kib * 1024 - epilogue_bytes
    return np.clip(budget // stage_bytes, 2, cap)


def _split_k(tiles: np.ndarray, k_steps: np.ndarray, sm_count: int) -> np.ndarray:
    """Split-K for skinny problems (surrogate of cuBLAS's heuristic): split when the output tiles fill less than
    half the SMs, into the largest divisor of the K steps that neither overfills the GPU nor leaves fewer than
    :data:`_MIN_K_STEPS_PER_SPLIT` steps per split."""
    wanted = np.where(tiles * 2 <= sm_count, np.minimum(sm_count // np.maximum(tiles, 1), _MAX_SPLITS), 1)
    wanted = np.minimum(wanted, np.maximum(k_steps // _MIN_K_STEPS_PER_SPLIT, 1))
    splits = np.ones_like(tiles)
    for s in range(2, _MAX_SPLITS + 1):
        splits = np.where((s <= wanted) & (k_steps % s == 0), s, splits)
    return splits


def gemm_tiling(m: np.ndarray, n: np.ndarray, k: np.ndarray, gpu: GpuSpec, dtype: str, out_dtype: str) -> GemmTiling:
    """cuBLAS surrogate. Hopper/B200: warp-specialised persistent kernel (a producer and two consumer warpgroups,
    384 threads, 168 registers by launch bound), tiles 64x128 (m <= 64), 128x128 (m <= 128), 128x256 otherwise, as
    many TMA stages as fit in shared memory. Ampere/Ada: CUTLASS-2-style multistage kernels, BK=32, 64x64 warp tiles,
    64x128 (128 threads), 128x128 and 128x256 (256 threads). Both split K when the tiles underfill the GPU."""
    m, n, k = (np.asarray(x, dtype=np.int64) for x in (m, n, k))
    b = dtype_bytes(dtype)
    bm = np.where(m <= 64, 64, 128)
    bn = np.where(m <= 128, 128, 256)
    if _is_sm90_family(gpu):
        bk = np.full_like(m, int(_HOPPER_BK_BYTES // b))
        threads, registers, cap = 384, 168, 8
        warp_m, warp_n = np.full_like(m, 64), bn  # consumer warpgroups split M in 64-row slices (cooperative)
    else:
        bk = np.full_like(m, int(64 // b))
        threads, registers, cap = np.where(m <= 64, 128, 256), 232, 4
        warp_m, warp_n = np.full_like(m, 64), np.full_like(m, 64)
    epilogue = 8192
    stages = _stages((bm + bn) * bk * b, gpu, epilogue, cap)
    k_steps = -(-k // bk)
    splits = _split_k(-(-m // bm) * -(-n // bn), k_steps, gpu.sm_count)
    return GemmTiling(
        bm, bn, bk, splits, k_steps // splits * bk, warp_m, warp_n, threads, registers,
        stages * (bm + bn) * bk * b + epilogue, _is_sm90_family(gpu), b, dtype_bytes(out_dtype),
    )


def _fp8_tiling(m: np.ndarray, k: np.ndarray, gpu: GpuSpec, kernel: ScaledMM, bm: np.ndarray, bn: np.ndarray,
                bk: np.ndarray, warp_m: np.ndarray, warp_n: np.ndarray, threads: int | np.ndarray,
                stage_cap: int | np.ndarray, persistent: bool | np.ndarray, warp_specialised: bool) -> GemmTiling:
    """A scaled-MM tiling from its tile, warp tile and threads (no split-K in any of them), with as many pipeline
    stages as fit in shared memory beside the epilogue, at most ``stage_cap``. Warp-specialised (TMA) kernels run
    168 registers a thread by launch bound, classic multistage kernels 232."""
    block = kernel.scale == "block"
    epilogue = 8192
    stages = _stages((bm + bn) * bk, gpu, epilogue, stage_cap)
    return GemmTiling(
        bm, bn, bk, np.ones_like(m), -(-k // bk) * bk, warp_m, warp_n, threads, 168 if warp_specialised else 232,
        stages * (bm + bn) * bk + epilogue, persistent, 1.0, dtype_bytes(kernel.out_dtype),
        kernel.block_k if block else 0, kernel.block_n if block else 0,
    )


def _vllm_cutlass_tiling(m: np.ndarray, n: np.ndarray, k: np.ndarray, gpu: GpuSpec, kernel: ScaledMM) -> GemmTiling:
    """vLLM CUTLASS FP8 configs. SM90 per-tensor (c3x/scaled_mm_sm90_fp8_dispatch.cuh): m <= 64 -> 64x64x128,
    m <= 128 -> 64x128x128, else 128x128x128, ping-pong warp-specialised (each consumer warpgroup owns a whole
    tile), persistent. SM90 block-scaled (c3x/scaled_mm_blockwise_sm90_fp8_dispatch.cuh): 128x128x128 cooperative.
    SM89 (scaled_mm_c2x_sm89_fp8_dispatch.cuh): 64x128x64 fallback for m <= 64 (32x64 warps), else 128x128x64
    (64x64 warps), 5 stages. No split-K (GemmUniversalMode::kGemm)."""
    ones = np.ones_like(m)
    if _is_sm90_family(gpu):
        if kernel.scale == "block":
            bm, bn, warp_m = 128 * ones, 128 * ones, 64 * ones
        else:
            bm = np.where(m <= 128, 64, 128)
            bn = np.where(m <= 64, 64, 128)
            warp_m = bm
        bk, warp_n, threads, cap = 128 * ones, bn, 384, 8
    else:
        bm, bn, bk = np.where(m <= 64, 64, 128), 128 * ones, 64 * ones
        warp_m, warp_n = np.where(m <= 64, 32, 64), 64 * ones
        threads, cap = (bm // warp_m) * (bn // warp_n) * 32, 5
    sm90 = _is_sm90_family(gpu)
    return _fp8_tiling(m, k, gpu, kernel, bm, bn, bk, warp_m, warp_n, threads, cap, sm90, sm90)


def _next_pow2(x: np.ndarray) -> np.ndarray:
    return 1 << np.ceil(np.log2(np.maximum(x, 1))).astype(np.int64)


def _sgl_kernel_tiling(m: np.ndarray, n: np.ndarray, k: np.ndarray, gpu: GpuSpec, kernel: ScaledMM) -> GemmTiling:
    """SGLang's sgl-kernel ``fp8_scaled_mm`` (csrc/gemm/fp8_gemm_kernel.cu). SM90, by m: m = 1 -> 64x64x128
    non-persistent warp-specialised (one consumer warpgroup); m <= 256 -> 64x64x128, else 128x128x128, ping-pong
    persistent. SM100, by max(16, next_pow2(m)): <= 64 -> 64x64x128, <= 256 -> 128x128x128 and else 256x128x64, the
    two larger as 2-SM MMAs (each SM computes half the rows: one task per SM). No split-K.

    Its SM89 and SM120 tables (16-row tiles of one-warp CTAs up to 256x128 cooperative tiles) are not used: the
    L40S and the RTX PRO 6000 are the only measured GPUs of those architectures, and with their own tiles a model
    trained without one of them met features unlike any it was trained on (left out, the L40S's predicted times
    diverged). vLLM's classic tiles stand for them, as for vLLM's own kernel there."""
    major = _major(gpu)
    if major not in (9, 10):
        return _vllm_cutlass_tiling(m, n, k, gpu, kernel)
    ones = np.ones_like(m)
    if major == 10:
        padded = np.maximum(16, _next_pow2(m))
        bm = np.where(padded <= 256, 64, 128)  # per SM: above 64, half the rows of a 2-SM pair's tile
        bn = np.where(padded <= 64, 64, 128)
        bk = np.where(padded <= 256, 128, 64)
        return _fp8_tiling(m, k, gpu, kernel, bm, bn, bk, bm, bn, 384, 8, True, True)
    bm = np.where(m <= 256, 64, 128)
    pingpong = m > 1
    return _fp8_tiling(m, k, gpu, kernel, bm, bm, 128 * ones, bm, bm, np.where(pingpong, 384, 256), 8, pingpong,
                       True)


def _deepgemm_blocks(m: np.ndarray, n: np.ndarray, k: np.ndarray, gpu: GpuSpec) -> tuple[np.ndarray, np.ndarray]:
    """DeepGEMM's ``fp8_gemm_nt`` block sizes (csrc/jit_kernels/heuristics/{common,sm90,sm100}.hpp): of the legal
    (block_m, block_n), the fewest waves of blocks over the SMs, then the fullest last wave, then, scanning in
    order, a candidate replaces the best one with the same block_m and a smaller block_n, the same block_n and a
    smaller block_m, or a larger block_n that fits (block_n <= n and block_m <= m). SM90: block_m 64, 128, 256
    (16 and 32 too for m <= 16 and m <= 32), block_n 16..256 by 16 but above 128 only 144, 160 and 192, one of them
    at most 128. SM100: block_m 128 (64 and 32 for m <= 64 and m <= 32), block_n 16 and 32..256 by 32, both at
    most 128 for k <= 256."""
    sm100 = _major(gpu) == 10
    if sm100:
        block_ms, small_ms, block_ns = (32, 64, 128), (32, 64), (16, *range(32, 257, 32))
    else:
        block_ms, small_ms, block_ns = (16, 32, 64, 128, 256), (16, 32), (*range(16, 129, 16), 144, 160, 192)
    best_m, best_n = np.zeros_like(m), np.zeros_like(m)
    best_waves, best_last = np.full(m.shape, np.iinfo(np.int64).max), np.zeros_like(m)
    for bm in block_ms:
        for bn in block_ns:
            legal = (m <= bm) if bm in small_ms else np.ones(m.shape, dtype=bool)
            legal &= (bm <= 128) | (bn <= 128)
            if sm100:
                legal &= (k > 256) | (bn <= 128)
            blocks = -(-m // bm) * -(-n // bn)
            waves = -(-blocks // gpu.sm_count)
            last = np.where(blocks % gpu.sm_count == 0, gpu.sm_count, blocks % gpu.sm_count)
            tie = (waves == best_waves) & (last == best_last)
            better = (waves < best_waves) | ((waves == best_waves) & (last > best_last)) | tie & (
                ((bm == best_m) & (bn < best_n)) | ((bn == best_n) & (bm < best_m))
                | ((bm != best_m) & (bn > best_n) & (bn <= n) & (bm <= m)))
            take = legal & better
            best_m, best_n = np.where(take, bm, best_m), np.where(take, bn, best_n)
            best_waves, best_last = np.where(take, waves, best_waves), np.where(take, last, best_last)
    return best_m, best_n


def _deepgemm_tiling(m: np.ndarray, n: np.ndarray, k: np.ndarray, gpu: GpuSpec, kernel: ScaledMM) -> GemmTiling:
    """DeepGEMM's block-scaled FP8 GEMM: :func:`_deepgemm_blocks` tiles, BK 128, a TMA warpgroup and one math
    warpgroup per 64 rows of the block (two above 64, each taking half), persistent. Stages fill shared memory, at
    most 8, at most 4 when block_n leaves block-scale promotion unaligned (128 % block_n with 128 / gcd <= 4)."""
    bm, bn = _deepgemm_blocks(m, n, k, gpu)
    bk = 128 * np.ones_like(m)
    unaligned = (128 % bn != 0) & (128 // np.gcd(128, bn) <= 4)
    math_groups = np.where(bm <= 64, 1, 2)
    return _fp8_tiling(m, k, gpu, kernel, bm, bn, bk, bm // math_groups, bn, 128 * (1 + math_groups),
                       np.where(unaligned, 4, 8), True, True)


def scaled_mm_tiling(m: np.ndarray, n: np.ndarray, k: np.ndarray, gpu: GpuSpec, kernel: ScaledMM) -> GemmTiling:
    """The tiles of the library that runs the scaled MM: DeepGEMM for block scales on SM90 and later (elsewhere
    the engines fall back to Triton's block kernel, for which vLLM's classic CUTLASS tiles stand), SGLang's
    sgl-kernel or vLLM's CUTLASS for per-tensor scales; cuBLASLt (``torch._scaled_mm``) is closed, and vLLM's
    tiles stand for it."""
    m, n, k = (np.asarray(x, dtype=np.int64) for x in (m, n, k))
    if kernel.library == "deepgemm" and _is_sm90_family(gpu):
        return _deepgemm_tiling(m, n, k, gpu, kernel)
    if kernel.library == "sgl_kernel":
        return _sgl_kernel_tiling(m, n, k, gpu, kernel)
    return _vllm_cutlass_tiling(m, n, k, gpu, kernel)


def tile_demand(
    t: GemmTiling, rows: np.ndarray, cols: np.ndarray, depth: np.ndarray, last_split: np.ndarray, bias: bool
) -> dict[str, np.ndarray]:
    """Useful demand of tiles covering ``rows`` x ``cols`` of the output over ``depth`` of K.

    Global loads go through L2: the A and B panels of the tile, the output (fp32 partials per split plus, on the
    last split, the reduction and the final write), scales. Shared memory: each operand byte is written once by
    the loads and read once per MMA warp(group) that needs it. FMA: the epilogue (one op per output element, plus
    the split-K reduction and block-scale promotion)."""
    split = t.splits > 1
    out = rows * cols
    l2 = (rows + cols) * depth * t.in_bytes
    l2 = l2 + np.where(split, out * 4 + last_split * (t.splits * out * 4), 0) + last_split * out * t.out_bytes
    l2 = l2 + (last_split * cols * t.out_bytes if bias else 0)
    smem_reads = (rows * -(-t.bn // t.warp_n) + cols * -(-t.bm // t.warp_m)) * depth * t.in_bytes
    fma = out + last_split * (t.splits - 1) * out
    if t.block_scale_k:
        k_blocks = -(-depth // t.block_scale_k)
        fma = fma + 2 * out * k_blocks
        l2 = l2 + (rows + -(-cols // t.block_scale_n)) * k_blocks * 4
    return {
        "tensor": 2.0 * rows * cols * depth,
        "fma": fma.astype(np.float64),
        "l2": l2.astype(np.float64),
        "smem": ((rows + cols) * depth * t.in_bytes + smem_reads).astype(np.float64),
    }


def total_demand(t: GemmTiling, m: np.ndarray, n: np.ndarray, k: np.ndarray, bias: bool) -> dict[str, np.ndarray]:
    """Closed form of :func:`tile_demand` summed over every tile of each GEMM (Tensor, FMA, L2, shared memory)."""
    tm_count, tn_count = t.tiles_m(m), t.tiles_n(n)
    panels = (m * tn_count + n * tm_count) * k
    l2 = panels * t.in_bytes + m * n * t.out_bytes
    l2 = l2 + np.where(t.splits > 1, 2 * t.splits * m * n * 4, 0) + (tm_count * n * t.out_bytes if bias else 0)
    fma = (2 * t.splits - 1) * m * n
    if t.block_scale_k:
        # Each tile reads the weight scales of ceil(cols / block_n) column blocks, as tile_demand counts them.
        full_cols, edge_cols = np.divmod(n, t.bn)
        col_scales = full_cols * -(-t.bn // t.block_scale_n) + -(-edge_cols // t.block_scale_n)
        k_blocks = -(-k // t.block_scale_k)
        l2 = l2 + (m * tn_count + col_scales * tm_count) * k_blocks * 4
        fma = fma + 2 * m * n * k_blocks
    reads = (m * tn_count * -(-t.bn // t.warp_n) + n * tm_count * -(-t.bm // t.warp_m)) * k
    return {
        "tensor": 2.0 * m * n * k,
        "fma": fma.astype(np.float64),
        "l2": l2.astype(np.float64),
        "smem": ((panels + reads) * t.in_bytes).astype(np.float64),
    }


def tile_coords(j: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray, t: GemmTiling):
    """Rows, cols, depth and last-split flag of task ``j`` (launch order: split outermost, then tile rows, then
    tile columns, as blockIdx.z/y/x of a split-K grid or the raster of a persistent tile scheduler)."""
    tm_count, tn_count = t.tiles_m(m), t.tiles_n(n)
    p, r = np.divmod(j, tm_count * tn_count)
    tm, tn = np.divmod(r, tn_count)
    rows = np.minimum(t.bm, m - tm * t.bm)
    cols = np.minimum(t.bn, n - tn * t.bn)
    depth = np.minimum(t.k_chunk, k - p * t.k_chunk)
    return p, tm, tn, rows, cols, depth, p == t.splits - 1


def full_tile_demand(t: GemmTiling, ones: np.ndarray) -> dict[str, np.ndarray]:
    """What a tile's main loop issues: the full bm x bn x k_chunk tile whatever the edge (predicated loads and
    padded MMAs). The split-K reduction is left out so that every tile of a launch lasts equally long."""
    return tile_demand(t, t.bm * ones, t.bn * ones, t.k_chunk * ones, np.zeros_like(ones, dtype=bool), False)


def _launch(kernel: Gemm | ScaledMM, gpu: GpuSpec, t: GemmTiling, name: str) -> Launch:
    m, n, k = (np.array([x]) for x in (kernel.m, kernel.n, kernel.k))
    rates = pipe_rate_vector(gpu, kernel.dtype)
    count = int(t.num_tasks(m, n)[0])
    check_task_count(kernel, count)
    j = np.arange(count)
    p, tm, tn, rows, cols, depth, last = tile_coords(j, m, n, k, t)
    useful = tile_demand(t, rows, cols, depth, last, kernel.bias)
    full = np.ones_like(j)
    issued = full_tile_demand(t, full)
    dram_per_l2 = dram_fraction(cold_bytes(kernel), total_demand(t, m, n, k, kernel.bias)["l2"])[0]
    useful["dram"] = useful["l2"] * dram_per_l2
    issued["dram"] = issued["l2"] * dram_per_l2
    tasks = task_set(("split", "tile_m", "tile_n", "rows", "cols", "k"),
                     (p, tm, tn, rows, cols, depth), useful, rates, issued)
    config = LaunchConfig(int(np.asarray(t.threads).reshape(-1)[0]), t.registers, int(t.smem_bytes[0]))
    grid = count
    persistent = bool(np.asarray(t.persistent).reshape(-1)[0])
    if persistent:
        grid = min(count, gpu.sm_count * occupancy(config, gpu).ctas_per_sm)
    tile = f"{int(t.bm[0])}x{int(t.bn[0])}x{int(t.bk[0])}"
    notes = (f"tile {tile}, split-K {int(t.splits[0])}",)
    return Launch(name, config, tasks, STATIC_PERSISTENT if persistent else ROUND_ROBIN, grid, kernel.dtype, notes)


def decompose_gemm(kernel: Gemm, gpu: GpuSpec) -> tuple[Launch, ...]:
    t = gemm_tiling(np.array([kernel.m]), np.array([kernel.n]), np.array([kernel.k]), gpu, kernel.dtype,
                    kernel.out_dtype)
    name = "nvfp4 linear (GEMM tiles at FP4 width)" if kernel.category == "fp4_mm" else "gemm (cuBLAS surrogate)"
    return (_launch(kernel, gpu, t, name),)


def decompose_scaled_mm(kernel: ScaledMM, gpu: GpuSpec) -> tuple[Launch, ...]:
    t = scaled_mm_tiling(np.array([kernel.m]), np.array([kernel.n]), np.array([kernel.k]), gpu, kernel)
    return (_launch(kernel, gpu, t, f"scaled_mm ({kernel.library}, {kernel.scale} scales)"),)
