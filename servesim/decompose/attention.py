"""Attention decomposition: FlashAttention-2, FlashAttention-3 and FlashInfer, prefill (causal or not, varlen,
paged or ragged KV) and decode (split-KV), as (request, query tile, head) tasks. Sources in docs/synperf.md.

Causal masking makes tasks uneven: query rows near the start of a request attend to fewer keys, so a task's
work depends on where its tile sits. GQA packing (FA3 varlen, FlashInfer, FA2's decode head swap) lays the
``group`` query heads of one KV head along the tile's rows: packed row ``r`` is token ``r // group``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from servesim.compiled import jit
from servesim.decompose.launch import (
    MIN_HEAP,
    PIPE_ROW,
    PIPES,
    ROUND_ROBIN,
    Launch,
    LaunchConfig,
    TaskSet,
    task_arrays,
    check_task_count,
    cold_bytes,
    occupancy,
    pipe_rate_vector,
)
from servesim.errors import ServesimError
from servesim.hardware import GpuSpec
from servesim.kernels.types import AttentionDecode, AttentionPrefill, dtype_bytes

BACKENDS = ("fa2", "fa3", "flashinfer", "trtllm_mha")
#: Backends decomposed as another one's kernels. SGLang's ``trtllm_mha`` on Blackwell runs FlashInfer's TRT-LLM-gen
#: kernels, the same ones vLLM's FlashInfer backend dispatches to there.
_DECOMPOSED_AS = {"trtllm_mha": "flashinfer"}
#: Above this many query heads per KV head the engines run FlashInfer decode through its tensor-core prefill
#: kernel (vLLM's FlashInfer backend sets ``use_tensor_cores`` when the group exceeds 4).
FLASHINFER_DECODE_MAX_GROUP = 4
#: FA2 splits at most this many ways (flash_api.cpp: num_splits_heuristic(..., 128)); FA3 likewise.
MAX_SPLITS = 128
#: FA3's L2-size split rule assumes a 50 MiB L2 (hopper/heuristics.h).
_FA3_L2_BYTES = 50 * 1024 * 1024


@dataclass(frozen=True)
class AttentionTile:
    """The CTA tile and launch of one attention kernel variant."""

    block_m: int  # query rows (packed rows under GQA packing)
    block_n: int  # keys per main-loop step
    threads: int
    registers: int
    smem_bytes: int
    kv_readers: int  # warps/warpgroups that each read every K/V byte from shared memory
    persistent: bool


@lru_cache(maxsize=1024)
def _fa2_tile(head_dim: int, elem_bytes: float, max_smem_bytes: float) -> AttentionTile:
    """flash_fwd_launch_template.h (FA2 v2.6, sm80): 128x128 (d <= 64), 128x64 with 4 warps (d <= 128), 128x64
    with 8 warps above; Q, K and V tiles in shared memory. Where that tile's shared memory exceeds the GPU's
    per-CTA limit (d = 256 on sm86/sm89), 64x64 with 4 warps (``run_mha_fwd_hdim256``)."""
    block_m, block_n = 128, 128 if head_dim <= 64 else 64
    warps = 4 if head_dim <= 128 else 8
    if (block_m + 2 * block_n) * head_dim * elem_bytes > max_smem_bytes:
        block_m, block_n, warps = 64, 64, 4
    smem = int((block_m + 2 * block_n) * head_dim * elem_bytes)
    return AttentionTile(block_m, block_n, warps * 32, 255, smem, warps, False)


@lru_cache(maxsize=1024)
def _fa3_tile(head_dim: int, causal: bool, paged_non_tma: bool, elem_bytes: float) -> AttentionTile:
    """hopper/tile_size.h tile_size_fwd_sm90 (FA3 v3.0.0b1): 192x128 (d <= 64), 192x144 (d <= 96), 128x128 when
    causal or paged without TMA else 128x176 (d <= 128), 128x112 (d <= 192), 128x80 (d <= 256); one producer plus
    block_m/64 consumer warpgroups; two K/V pipeline stages. One CTA per SM: the warpgroups split the 64K-register
    file (setmaxnreg), so the mean registers per thread are 65536 / threads (168 for 384 threads, 128 for 512)."""
    if head_dim <= 64:
        block_m, block_n = 192, 128
    elif head_dim <= 96:
        block_m, block_n = 192, 144
    elif head_dim <= 128:
        block_m, block_n = 128, 128 if (causal or paged_non_tma) else 176
    elif head_dim <= 192:
        block_m, block_n = 128, 112
    else:
        block_m, block_n = 128, 80
    consumers = block_m // 64
    threads = (consumers + 1) * 128
    smem = int((block_m + 2 * 2 * block_n) * head_dim * elem_bytes)
    return AttentionTile(block_m, block_n, threads, 65536 // threads // 8 * 8, smem, consumers, True)


@lru_cache(maxsize=1024)
def _flashinfer_fa2_tile(avg_packed_q: float, head_dim: int, elem_bytes: float) -> AttentionTile:
    """FlashInfer prefill.cuh / scheduler.cuh FA2DetermineCtaTileQ: CTA query tile 128 when the average packed
    query length exceeds 64 (head_dim < 256), 64 above 16, else 16; 4 warps (split over Q for 64/128-row tiles,
    over KV for 16); a 64-key KV tile (32 at head_dim 256)."""
    tile_q = 128 if (avg_packed_q > 64 and head_dim < 256) else 64 if avg_packed_q > 16 else 16
    tile_kv = 64 if head_dim < 256 else 32
    smem = int((tile_q + 2 * tile_kv) * head_dim * elem_bytes)
    return AttentionTile(tile_q, tile_kv, 128, 128, smem, 4 if tile_q >= 64 else 1, False)


@jit
def _packed_row_token_sum(x: int, group: int) -> int:
    """Sum of ``r // group`` over packed rows r in [0, x)."""
    t = x // group
    return group * t * (t - 1) // 2 + t * (x - group * t)


@jit
def _windowed_row_pair_sum(x: int, group: int, first: int, window: int) -> int:
    """Keys scored by packed rows [0, x) when token t sees ``min(first + t, window)`` keys: the rows whose token's
    causal span fits the window see ``first + t``, the rest ``window``."""
    fits = min(max(group * (window - first + 1), 0), x)
    return fits * first + _packed_row_token_sum(fits, group) + (x - fits) * window


@jit
def _prefill_tiles(q: np.ndarray, kv: np.ndarray, tiles_per_req: np.ndarray, block_m: int, block_n: int, group: int,
                   causal: bool, window: int) -> tuple[np.ndarray, ...]:
    """One head's query tiles, request after request: ``tiles_per_req[i]`` tiles of ``block_m`` packed rows over
    request i's ``q[i] * group`` (tiles past them are empty), with ``kv[i]`` keys. Per tile: its request, its index
    in the request, its rows, the (row, key) pairs it scores, and the keys and key blocks its main loop walks
    (whole blocks of ``block_n``, up to the last row's causal limit). Under a sliding ``window`` (> 0, causal) a
    tile walks from the block holding its first row's earliest visible key (FlashAttention's local ``n_block_min``)
    to its last row's causal limit."""
    n = tiles_per_req.sum()
    request, tile, rows = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    pairs, keys, blocks = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    i = 0
    for r in range(len(q)):
        packed = q[r] * group
        for t in range(tiles_per_req[r]):
            row_a = min(t * block_m, packed)
            row_b = min(row_a + block_m, packed)
            request[i], tile[i], rows[i] = r, t, row_b - row_a
            if causal and window > 0:
                offset = kv[r] - q[r] + 1
                pairs[i] = (_windowed_row_pair_sum(row_b, group, offset, window)
                            - _windowed_row_pair_sum(row_a, group, offset, window))
                end = min(kv[r] - q[r] + (row_b - 1) // group + 1, kv[r]) if rows[i] > 0 else 0
                start = max(kv[r] - q[r] + row_a // group + 1 - window, 0) if rows[i] > 0 else 0
                keys[i] = end - start
                blocks[i] = -(-end // block_n) - start // block_n
            elif causal:
                offset = kv[r] - q[r] + 1  # keys visible to token 0
                pairs[i] = (rows[i] * offset + _packed_row_token_sum(row_b, group)
                            - _packed_row_token_sum(row_a, group))
                keys[i] = min(kv[r] - q[r] + (row_b - 1) // group + 1, kv[r]) if rows[i] > 0 else 0
                blocks[i] = -(-keys[i] // block_n)
            else:
                pairs[i] = rows[i] * kv[r]
                keys[i] = kv[r] if rows[i] > 0 else 0
                blocks[i] = -(-keys[i] // block_n)
            i += 1
    return request, tile, rows, pairs, keys, blocks


@lru_cache(maxsize=256)
def _demand_per_unit(head_dim: int, q_bytes: float, kv_bytes: float, kv_readers: int, v_dim: int = 0,
                     kv_per_key: int = 0) -> np.ndarray:
    """Each pipe's demand (a row per pipe of :data:`PIPES`) per unit of a task's work, in the columns of
    :func:`_attention_demand`'s basis: Tensor (QK^T and PV, 4·d per scored pair), XU (one exp per pair plus one
    rescale per row and key block), FMA (scale, max, subtract and sum per pair; output rescale per row, dim and key
    block), L2 (Q in, O out, the walked K and V), shared memory (K/V written once, read by each reader warp(group);
    Q staged); DRAM left at 0 for :func:`task_set` to spread. ``v_dim`` (0: ``head_dim``) is a narrower value
    head (MLA); ``kv_per_key`` (0: K and V, ``head_dim + v_dim``) the cached elements a key position holds (MLA's
    decode reads one latent that is both). Read-only (memoised)."""
    v_dim = v_dim or head_dim
    kv_per_key = kv_per_key or head_dim + v_dim
    per_unit = np.zeros((len(PIPES), 4))
    per_unit[PIPE_ROW["tensor"]] = (2.0 * (head_dim + v_dim), 0, 0, 0)
    per_unit[PIPE_ROW["xu"]] = (1, 1, 0, 0)
    per_unit[PIPE_ROW["fma"]] = (3, v_dim, 0, 0)
    per_unit[PIPE_ROW["l2"]] = (0, 0, (head_dim + v_dim) * q_bytes, kv_per_key * kv_bytes)
    per_unit[PIPE_ROW["smem"]] = (0, 0, (head_dim + v_dim) * q_bytes, kv_per_key * kv_bytes * (1 + kv_readers))
    per_unit.flags.writeable = False
    return per_unit


@jit
def _attention_demand(per_unit: np.ndarray, rows: np.ndarray, pairs: np.ndarray, keys: np.ndarray,
                      blocks: np.ndarray, block_m: int, block_n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-task useful and issued demand, a row per pipe of :data:`PIPES`: :func:`_demand_per_unit` times each
    task's scored pairs, rows x key blocks, rows and walked keys; issued counts full ``block_m``-row tiles over whole
    key blocks of ``block_n``. Every product and sum is of whole numbers (or halves) far below 2^53, so it is exact
    in any order."""
    pipes, n = per_unit.shape[0], len(rows)
    useful, issued = np.empty((pipes, n)), np.empty((pipes, n))
    for task in range(n):
        full_rows = block_m if rows[task] > 0 else 0
        walked = blocks[task] * block_n
        for pipe in range(pipes):
            per_pair, per_row_block, per_row, per_key = per_unit[pipe]
            useful[pipe, task] = (per_pair * pairs[task] + per_row_block * (rows[task] * blocks[task])
                                  + per_row * rows[task] + per_key * keys[task])
            issued[pipe, task] = (per_pair * (full_rows * walked) + per_row_block * (full_rows * blocks[task])
                                  + per_row * full_rows + per_key * walked)
    return useful, issued


def _task_inputs(kernel, gpu: GpuSpec, tile: AttentionTile) -> tuple[np.ndarray, np.ndarray, float]:
    """What :func:`_attention_tasks` needs of the kernel and GPU: the demand per unit of work
    (:func:`_demand_per_unit`), the pipes' rates and the kernel's cold DRAM bytes."""
    per_unit = _demand_per_unit(kernel.head_dim, dtype_bytes(kernel.dtype), dtype_bytes(kernel.kv_dtype),
                                tile.kv_readers, kernel.v_head_dim,
                                kernel.head_dim if getattr(kernel, "kv_shared", False) else 0)
    return per_unit, pipe_rate_vector(gpu, kernel.dtype), cold_bytes(kernel)


@jit
def _attention_tasks(per_unit: np.ndarray, rows: np.ndarray, pairs: np.ndarray, keys: np.ndarray,
                     blocks: np.ndarray, block_m: int, block_n: int, rates: np.ndarray, heads: int,
                     cold_dram_bytes: float) -> tuple[np.ndarray, np.ndarray]:
    """Every head's task demand and durations (:func:`task_set`'s arrays) from one head's tiles."""
    useful, issued = _attention_demand(per_unit, rows, pairs, keys, blocks, block_m, block_n)
    return task_arrays(useful, issued, rates, heads, cold_dram_bytes, True)


def _make_launch(kernel, gpu: GpuSpec, tile: AttentionTile, name: str, heads: int, dims: tuple[np.ndarray, ...],
                 demand_by_pipe: np.ndarray, duration_cycles: np.ndarray, notes: tuple[str, ...]) -> Launch:
    """The launch of ``heads`` repeats of one head's tasks (``dims``), their arrays from :func:`_attention_tasks`."""
    tasks = TaskSet(_DIM_NAMES, dims, demand_by_pipe, duration_cycles, heads, "head")
    config = LaunchConfig(tile.threads, tile.registers, tile.smem_bytes)
    grid = tasks.size
    if tile.persistent:
        grid = min(grid, gpu.sm_count * occupancy(config, gpu).ctas_per_sm)
    return Launch(name, config, tasks, MIN_HEAP if tile.persistent else ROUND_ROBIN, grid, kernel.dtype, notes)


#: An attention task's dimensions.
_DIM_NAMES = ("request", "head", "tile", "split", "rows", "keys")


def _head_dims(request, tile_idx, split, rows, keys) -> tuple[np.ndarray, ...]:
    """One head's task dimensions (head 0), a column per dimension of the launch's tasks."""
    return request, np.zeros_like(request), tile_idx, split, rows, keys


def _check(kernel, gpu: GpuSpec) -> str:
    """The backend whose kernels ``kernel`` is decomposed as; raises on a bad backend, one the GPU cannot run or a
    bad head grouping."""
    if kernel.backend not in BACKENDS:
        raise ServesimError(f"unknown attention backend {kernel.backend!r}; choose one of {', '.join(BACKENDS)}")
    if kernel.backend == "fa3" and not gpu.compute_capability.startswith("9"):
        # FlashAttention-3's kernels use Hopper's TMA and warpgroup MMA; vLLM and SGLang pick it on SM 9.x only.
        raise ServesimError(f"FlashAttention-3 (fa3) runs on Hopper GPUs (compute capability 9.x), not the "
                            f"{gpu.name} ({gpu.compute_capability}); choose fa2 or flashinfer")
    if kernel.num_heads % kernel.num_kv_heads:
        raise ServesimError(f"{kernel.num_heads} query heads do not group evenly over {kernel.num_kv_heads} KV heads")
    return _DECOMPOSED_AS.get(kernel.backend, kernel.backend)


def decompose_prefill(kernel: AttentionPrefill, gpu: GpuSpec) -> tuple[Launch, ...]:
    """FA2: grid (ceil(max_q / 128), batch, heads), shorter requests' surplus CTAs exit at once; hardware
    round-robin. FA3 and FlashInfer on SM90: GQA-packed varlen tiles on a persistent grid, longest tile first to the
    least-loaded CTA. FlashInfer elsewhere: GQA-packed (request, query tile) work items x KV heads, round-robin."""
    backend = _check(kernel, gpu)
    q = np.asarray(kernel.query_lens, dtype=np.int64)
    kv = np.asarray(kernel.kv_lens, dtype=np.int64)
    group = kernel.num_heads // kernel.num_kv_heads
    elem = dtype_bytes(kernel.dtype)
    sm90 = gpu.compute_capability.startswith("9")
    if kernel.kv_shared:  # MLA's absorbed form: the latent-MQA tile, the heads packed along its rows
        hopper_or_later = int(gpu.compute_capability.split(".")[0]) >= 9
        tile = _mla_decode_tile(kernel.head_dim, elem, dtype_bytes(kernel.kv_dtype), hopper_or_later)
        pack, heads = group, kernel.num_kv_heads
    elif backend == "fa2":
        tile, pack, heads = _fa2_tile(kernel.head_dim, elem, gpu.max_smem_per_cta_kib * 1024), 1, kernel.num_heads
    else:
        if backend == "fa3" or sm90:
            paged_non_tma = kernel.kv_layout == "paged"
            tile = _fa3_tile(kernel.head_dim, kernel.causal, paged_non_tma, elem)
        else:
            tile = _flashinfer_fa2_tile(float(q.mean()) * group, kernel.head_dim, elem)
        pack, heads = group, kernel.num_kv_heads
    # Each request has ceil(q * pack / block_m) query tiles; FA2's grid gives every request the longest's count.
    tiles_per_req = -(-(q * pack) // tile.block_m)
    if backend == "fa2" and not kernel.kv_shared:
        tiles_per_req[:] = tiles_per_req.max()
    check_task_count(kernel, heads * int(tiles_per_req.sum()))
    # Launch order: tiles fastest, then requests, then heads (grid x, y, z); every head runs the same tiles.
    req, tile_idx, rows, keys, demand, duration = _prefill_tasks(q, kv, tiles_per_req, tile.block_m, tile.block_n,
                                                                 pack, kernel.causal, kernel.window, heads,
                                                                 *_task_inputs(kernel, gpu, tile))
    dims = _head_dims(req, tile_idx, np.zeros_like(req), rows, keys)
    name = f"{kernel.backend} prefill"
    notes = (f"tile {tile.block_m}x{tile.block_n}" + (f", GQA packed x{pack}" if pack > 1 else "")
             + (f", sliding window {kernel.window}" if kernel.window else ""),)
    return (_make_launch(kernel, gpu, tile, name, heads, dims, demand, duration, notes),)


@jit
def _prefill_tasks(q: np.ndarray, kv: np.ndarray, tiles_per_req: np.ndarray, block_m: int, block_n: int,
                   group: int, causal: bool, window: int, heads: int, per_unit: np.ndarray, rates: np.ndarray,
                   cold_dram_bytes: float) -> tuple[np.ndarray, ...]:
    """One head's prefill tiles (:func:`_prefill_tiles`: request, tile, rows, keys; ``tiles_per_req`` query tiles
    per request) and every head's demand and durations (:func:`_attention_tasks`)."""
    request, tile, rows, pairs, keys, blocks = _prefill_tiles(q, kv, tiles_per_req, block_m, block_n, group, causal,
                                                              window)
    demand, duration = _attention_tasks(per_unit, rows, pairs, keys, blocks, block_m, block_n, rates, heads,
                                        cold_dram_bytes)
    return request, tile, rows, keys, demand, duration


def fa2_num_splits(blocks_x_heads_x_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int = MAX_SPLITS) -> int:
    """FA2's split-KV choice (flash_api.cpp num_splits_heuristic, v2.6): one split when the grid nearly fills the
    SMs; otherwise the fewest splits whose wave efficiency is within 85% of the best, skipping split counts that
    give the same blocks per split as one fewer."""
    if blocks_x_heads_x_mblocks >= 0.8 * num_sms:
        return 1
    splits = np.arange(1, min(max_splits, num_sms, num_n_blocks) + 1)
    blocks_per_split = -(-num_n_blocks // splits)
    eligible = np.append(True, blocks_per_split[1:] != blocks_per_split[:-1])
    efficiency = np.where(eligible, _wave_efficiency(blocks_x_heads_x_mblocks, splits, num_sms), 0.0)
    best = efficiency.max(initial=0.0)
    chosen = np.flatnonzero((efficiency > 0) & (efficiency >= 0.85 * best))
    return int(splits[chosen[0]]) if chosen.size else 1


def _wave_efficiency(ctas_per_split: int, splits: np.ndarray, num_sms: int) -> np.ndarray:
    """How full the last wave of ``ctas_per_split`` CTAs times each of ``splits`` is, 0 to 1."""
    waves = ctas_per_split * splits / num_sms
    return waves / np.ceil(waves)


def fa3_num_splits(total_mblocks: int, num_sms: int, num_n_blocks: int, kv_head_bytes: float,
                   max_splits: int = MAX_SPLITS) -> int:
    """FA3's split-KV choice (hopper/heuristics.h num_splits_heuristic, v3.0.0b1): with a nearly full grid, split
    only a KV head larger than L2 (non-causal, many key blocks); with four or fewer key blocks never; else the
    fewest splits within 85% of the best wave efficiency."""
    if total_mblocks >= 0.8 * num_sms:
        if kv_head_bytes > _FA3_L2_BYTES and num_n_blocks >= 2 * num_sms:
            return int(min(-(-kv_head_bytes // _FA3_L2_BYTES), max_splits))
        return 1
    if num_n_blocks <= 4:
        return 1
    splits = np.arange(1, min(max_splits, num_sms, num_n_blocks) + 1)
    efficiency = _wave_efficiency(total_mblocks, splits, num_sms)
    return int(splits[np.argmax(efficiency >= 0.85 * efficiency.max())])


def flashinfer_decode_chunk_pages(pages: np.ndarray, kv_heads: int, max_grid_ctas: int, page_size: int) -> int:
    """FlashInfer's decode KV partition (scheduler.cuh PartitionPagedKVCacheBinarySearchMinNumPagePerBatch):
    no split when batch x KV heads already fill the grid; else the smallest pages per chunk (at least 128 tokens'
    worth) whose chunk count x KV heads fits the grid. Returns pages per chunk."""
    longest = int(pages.max())
    if len(pages) * kv_heads >= max_grid_ctas:
        return longest
    low, high = max(128 // page_size, 1), max(longest, 1)
    while low < high:
        mid = (low + high) // 2
        if int((-(-pages // mid)).sum()) * kv_heads > max_grid_ctas:
            low = mid + 1
        else:
            high = mid
    return max(low, 1)


def _flashinfer_decode_tile(group: int, head_dim: int, kv_bytes: float) -> AttentionTile:
    """FlashInfer decode.cuh: bdx = head_dim / vec (vec = max(16 B / elem, head_dim / 32)), bdy = group,
    bdz so that the CTA has max(128, bdx*bdy) threads; 2 shared-memory stages of bdy*bdz*tile keys, tile =
    ``tile_size_per_bdx`` (1 under GQA, else 2 for 8-bit and 4 for 16-bit KV)."""
    vec = max(int(16 // kv_bytes), head_dim // 32)
    bdx = head_dim // vec
    threads = max(128, bdx * group)
    bdz = threads // (bdx * group)
    keys_per_step = group * bdz * (1 if group > 1 else 2 if kv_bytes == 1 else 4)
    smem = int(2 * 2 * keys_per_step * head_dim * kv_bytes)
    return AttentionTile(group, keys_per_step, threads, 64, smem, 1, False)


#: KV splits of the Triton MLA decode kernel the engines run below Hopper (vLLM ``TritonMLAImpl``: a fixed 4).
TRITON_MLA_KV_SPLITS = 4


def _mla_decode_tile(head_dim: int, elem_bytes: float, kv_bytes: float, hopper_or_later: bool) -> AttentionTile:
    """The latent-MQA kernels of MLA (decode, and SGLang's absorbed prefill). Hopper and later (FlashMLA, ``Flash_fwd_kernel_traits_mla``: 64 packed
    query rows, 64-key blocks, 8 warps in two warpgroups each reading every K tile, Q and two K stages in shared
    memory; the Blackwell MLA kernels are taken alike): a persistent grid of one CTA per SM. Earlier GPUs (the
    Triton MLA decode, ``_fwd_grouped_kernel_stage1``: 16 heads, 32-key blocks, 4 warps, two stages): a grid of
    (request, head block, KV split)."""
    if hopper_or_later:
        return AttentionTile(64, 64, 256, 255, int(64 * head_dim * elem_bytes + 2 * 64 * head_dim * kv_bytes), 2,
                             True)
    return AttentionTile(16, 32, 128, 128, int(16 * head_dim * elem_bytes + 2 * 32 * head_dim * kv_bytes), 1, False)


def decode_splits(kernel: AttentionDecode, gpu: GpuSpec) -> tuple[AttentionTile, int]:
    """The tile and the number of KV splits (FA2/FA3) or pages per chunk (FlashInfer) the backend chooses. FlashInfer
    with more than FLASHINFER_DECODE_MAX_GROUP query heads per KV head runs its prefill (tensor-core) kernel, whose
    plan chunks the KV the same way."""
    backend = _check(kernel, gpu)
    kv = np.asarray(kernel.kv_lens, dtype=np.int64)
    group = kernel.num_heads // kernel.num_kv_heads
    elem, kv_b = dtype_bytes(kernel.dtype), dtype_bytes(kernel.kv_dtype)
    batch, max_kv = len(kv), int(kv.max())
    if kernel.kv_shared:  # MLA's latent MQA: FA3's split rule over the latent (FlashMLA balances SM parts alike)
        tile = _mla_decode_tile(kernel.head_dim, elem, kv_b, int(gpu.compute_capability.split(".")[0]) >= 9)
        if not tile.persistent:
            return tile, min(TRITON_MLA_KV_SPLITS, -(-max_kv // tile.block_n))
        m_blocks = -(-group // tile.block_m)
        return tile, fa3_num_splits(batch * kernel.num_kv_heads * m_blocks, gpu.sm_count,
                                    -(-max_kv // tile.block_n), max_kv * kernel.head_dim * kv_b)
    if backend == "fa2":
        # flash_api.cpp set_params_splitkv: 64-row tile, key block by head_dim, 2 CTAs per SM assumed.
        block_n = 256 if kernel.head_dim <= 64 else 128 if kernel.head_dim <= 128 else 64
        tile = AttentionTile(64, block_n, 128, 255, int((64 + 2 * block_n) * kernel.head_dim * elem), 4, False)
        m_blocks = -(-group // 64)
        return tile, fa2_num_splits(batch * kernel.num_kv_heads * m_blocks, 2 * gpu.sm_count, -(-max_kv // block_n))
    if backend == "fa3":
        tile = _fa3_tile(kernel.head_dim, False, kernel.page_size % 128 != 0, elem)
        m_blocks = -(-group // tile.block_m)
        kv_head_bytes = max_kv * 2 * kernel.head_dim * kv_b
        return tile, fa3_num_splits(batch * kernel.num_kv_heads * m_blocks, gpu.sm_count,
                                    -(-max_kv // tile.block_n), kv_head_bytes)
    if group > FLASHINFER_DECODE_MAX_GROUP:  # tensor-core decode: the prefill kernel's tile over the packed group
        tile = _flashinfer_fa2_tile(float(group), kernel.head_dim, elem)
    else:
        tile = _flashinfer_decode_tile(group, kernel.head_dim, kv_b)
    max_grid = gpu.sm_count * occupancy(LaunchConfig(tile.threads, tile.registers, tile.smem_bytes), gpu).ctas_per_sm
    pages = -(-kv // kernel.page_size)
    return tile, flashinfer_decode_chunk_pages(pages, kernel.num_kv_heads, max_grid, kernel.page_size)


def decompose_decode(kernel: AttentionDecode, gpu: GpuSpec) -> tuple[Launch, ...]:
    """Tasks are (request, KV head, KV split) with the group's query heads as tile rows. FA2/FA3 split every
    request into the same number of splits of ceil(max key blocks / splits) blocks (shorter requests leave empty
    splits that exit at once); FlashInfer chunks each request into pages-per-chunk pieces."""
    tile, choice = decode_splits(kernel, gpu)
    kv = np.asarray(kernel.kv_lens, dtype=np.int64)
    group = kernel.num_heads // kernel.num_kv_heads
    if _check(kernel, gpu) == "flashinfer" and not kernel.kv_shared:
        chunk_keys = choice * kernel.page_size
        chunks = -(-kv // chunk_keys)
        splits_label = f"{choice} pages per chunk"
    else:
        blocks_per_split = -(-(-(-int(kv.max()) // tile.block_n)) // choice)
        chunk_keys = blocks_per_split * tile.block_n
        chunks = np.full_like(kv, choice)
        splits_label = f"{choice} KV splits"
    heads = kernel.num_kv_heads
    if kernel.kv_shared and group > tile.block_m:
        # MLA's latent MQA packs the query heads into tiles of block_m rows, one CTA per head block, each reading
        # the latent: a head block stands for a KV head.
        head_blocks = -(-group // tile.block_m)
        heads, group = heads * head_blocks, -(-group // head_blocks)
        splits_label += f", {head_blocks} head blocks"
    check_task_count(kernel, heads * int(chunks.sum()))
    req, split, rows, keys, demand, duration = _decode_tasks(kv, chunks, chunk_keys, group, tile.block_m,
                                                             tile.block_n, heads, *_task_inputs(kernel, gpu, tile))
    dims = _head_dims(req, np.zeros_like(req), split, rows, keys)
    notes = (f"tile {tile.block_m}x{tile.block_n}, {splits_label}",)
    return (_make_launch(kernel, gpu, tile, f"{kernel.backend} decode", heads, dims, demand, duration, notes),)


@jit
def _decode_tasks(kv: np.ndarray, chunks: np.ndarray, chunk_keys: int, group: int, block_m: int, block_n: int,
                  heads: int, per_unit: np.ndarray, rates: np.ndarray,
                  cold_dram_bytes: float) -> tuple[np.ndarray, ...]:
    """One KV head's decode tasks (:func:`_decode_chunks`: request, piece, rows, keys) and every head's demand and
    durations (:func:`_attention_tasks`); a task scores each of its rows against each of its keys."""
    request, split, rows, keys, blocks = _decode_chunks(kv, chunks, chunk_keys, group, block_n)
    demand, duration = _attention_tasks(per_unit, rows, rows * keys, keys, blocks, block_m, block_n, rates, heads,
                                        cold_dram_bytes)
    return request, split, rows, keys, demand, duration


@jit
def _decode_chunks(kv: np.ndarray, chunks: np.ndarray, chunk_keys: int, group: int,
                   block_n: int) -> tuple[np.ndarray, ...]:
    """One KV head's decode tasks, request after request: ``chunks[i]`` pieces of up to ``chunk_keys`` of request
    i's ``kv[i]`` keys (pieces past them are empty). Per task: its request, its piece, its rows (the ``group`` query
    heads, none when empty), its keys and key blocks of ``block_n``."""
    n = chunks.sum()
    request, split, rows = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    keys, blocks = np.empty(n, np.int64), np.empty(n, np.int64)
    i = 0
    for r in range(len(kv)):
        for c in range(chunks[r]):
            request[i], split[i] = r, c
            keys[i] = min(max(kv[r] - c * chunk_keys, 0), chunk_keys)
            rows[i] = group if keys[i] > 0 else 0
            blocks[i] = -(-keys[i] // block_n)
            i += 1
    return request, split, rows, keys, blocks
