"""Fused MoE as vLLM's Triton path runs it (vllm/model_executor/layers/fused_moe/fused_moe.py): tokens sorted by
expert into BLOCK_SIZE_M-padded blocks (moe_align_block_size), a grouped GEMM for gate/up, SiLU&Mul, a grouped
GEMM for down. Each grouped GEMM is a 1-D grid over (padded M blocks x N blocks) with Triton's GROUP_SIZE_M
swizzle; blocks past the padded token count exit at once.

MXFP4 experts (gpt-oss) on the engines' other MXFP4 MoE kernels (OpenAI's Triton ``matmul_ogs`` on Hopper,
FlashInfer's MXFP4 x BF16 on Blackwell) are decomposed the same way, their weights read at 4.25 bits and
dequantised to BF16 in the kernel; those kernels' own tilings are not modelled. vLLM's Marlin MoE
(:class:`MarlinMoE`: Ampere and Ada, or Hopper with ``VLLM_MXFP4_USE_MARLIN=1``) is decomposed below as its own
kernel."""

from __future__ import annotations

import numpy as np

from servesim.decompose.elementwise import decompose_rowwise, uniform_launch
from servesim.decompose.launch import ROUND_ROBIN, Launch, LaunchConfig, check_task_count, pipe_rate_vector, task_set
from servesim.hardware import GpuSpec
from servesim.kernels.types import FusedMoE, MarlinMoE, SiluMul, dtype_bytes

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
    b, wb = dtype_bytes(kernel.dtype), kernel.weight_element_bytes  # activations, weights
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
    if kernel.weight_dtype == "nvfp4":
        return ("nvfp4 weights x activations quantised to NVFP4, FP4 MMAs",)
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


# --- Marlin MoE ---------------------------------------------------------------------------------------------------

_MARLIN_STAGES = 4
#: Integer and FMA operations Marlin spends turning one 4-bit weight into BF16 (mask/shift with ``lop3``, then a
#: fused multiply by its scale).
_MARLIN_DEQUANT_OPS = 2


def marlin_block_m(kernel: MarlinMoE) -> int:
    """``fused_marlin_moe``'s ``moe_block_size``: the first of 8, 16, 32, 48, 64 with fewer than 0.9 blocks' worth
    of (token, choice) pairs per expert, else 64 (vllm/model_executor/layers/fused_moe/fused_marlin_moe.py)."""
    pairs_per_expert = kernel.tokens * kernel.top_k / kernel.num_experts
    return next((m for m in (8, 16, 32, 48) if pairs_per_expert / m < 0.9), 64)


def marlin_dims(kernel: MarlinMoE) -> tuple[int, int]:
    """(hidden, intermediate) as the Marlin path pads MXFP4 experts: hidden to 256, intermediate to 128
    (``Mxfp4MoEMethod.create_weights``, vllm/model_executor/layers/quantization/mxfp4.py); INT4 checkpoints as they
    are."""
    if kernel.weight_dtype != "mxfp4":
        return kernel.hidden, kernel.intermediate
    return -(-kernel.hidden // 256) * 256, -(-kernel.intermediate // 128) * 128


def _marlin_gemm(kernel: MarlinMoE, gpu: GpuSpec, n: int, k: int, block_m: int, name: str) -> Launch:
    """One ``moe_wna16_marlin_gemm``: every real ``block_m``-row block of an expert's (token, choice) pairs times
    ``thread_n``-wide tiles of its dequantised weights. Marlin stripes the K dimension over its SM-sized grid, so
    a problem with fewer tiles than SMs runs K-slices in parallel and reduces them in FP32; a task here is one
    (block, tile, K-slice)."""
    thread_m_blocks = -(-block_m // 16)
    thread_n, thread_k, threads = (128, 128, 256) if thread_m_blocks == 1 else (256, 64, 256)
    block_rows = real_block_rows(kernel, block_m)
    n_tiles, k_tiles = -(-n // thread_n), -(-k // thread_k)
    tiles = max(len(block_rows), 1) * n_tiles
    slices = int(min(k_tiles, max(1, gpu.sm_count // tiles)))
    check_task_count(kernel, tiles * slices)
    pid = np.arange(tiles * slices)
    tile, pid_k = pid // slices, pid % slices
    pid_m, pid_n = tile // n_tiles, tile % n_tiles
    rows = block_rows[pid_m] if len(block_rows) else np.zeros_like(pid)
    cols = np.minimum(thread_n, n - pid_n * thread_n)
    depth = np.full(len(pid), -(-k // slices))
    depth[pid_k == slices - 1] = k - (slices - 1) * depth[0]
    wb = kernel.weight_element_bytes
    out_bytes = 4 if slices > 1 else 2  # K-slices reduce in FP32 (use_fp32_reduce)

    def demand(r):
        return {
            "tensor": 2.0 * r * cols * depth,
            "fma": (_MARLIN_DEQUANT_OPS * cols * depth + r * cols).astype(np.float64),
            "l2": (cols * depth * wb + r * depth * 2 + r * cols * out_bytes).astype(np.float64),
            "smem": (2 * (cols * depth * wb + r * depth * 2)).astype(np.float64),
        }

    issued = demand(np.maximum(16, -(-rows // 16) * 16))  # m16 MMAs: a block of 8 rows still issues 16
    unique = kernel.active_experts() * n * k * wb + kernel.routed_pairs() * (k + n) * 2
    tasks = task_set(("pid_m", "pid_n", "pid_k", "rows", "cols", "k"), (pid_m, pid_n, pid_k, rows, cols, depth),
                     demand(rows), pipe_rate_vector(gpu, kernel.dtype), issued, cold_dram_bytes=unique)
    smem = int(_MARLIN_STAGES * (thread_m_blocks * 16 * thread_k * 2 + thread_k * thread_n * wb))
    note = (f"Marlin {thread_m_blocks * 16}x{thread_n}x{thread_k} tiles, moe_block_size {block_m}, "
            f"{len(block_rows)} blocks hold tokens, K in {slices} slice(s)")
    return Launch(name, LaunchConfig(threads, 128, smem), tasks, ROUND_ROBIN, len(pid), kernel.dtype,
                  (note, *_weight_notes(kernel, gpu)))


#: ``moe_align_block_size_kernel``'s one CTA (csrc/moe/moe_align_sum_kernels.cu: ``<<<1, 1024>>>``, a thread per
#: expert in its block scan), the count-and-sort kernel's CTAs and PyTorch's vectorised fill (128 threads x 4
#: elements).
_ALIGN_THREADS, _SORT_THREADS, _FILL_ELEMENTS_PER_CTA = 1024, 256, 512


def marlin_align_launches(kernel: MarlinMoE, gpu: GpuSpec, block_m: int) -> tuple[Launch, ...]:
    """``moe_align_block_size`` as ``fused_marlin_moe`` calls it, before either GEMM: the ``tokens x top_k``
    choices (int32) sorted by expert into ``block_m``-row blocks over all ``E`` experts the router picks from
    (:meth:`MarlinMoE.router_experts`). It writes the worst-case padded list, ``max_num_tokens_padded = numel +
    E·(block_m − 1)`` sorted ids and one expert id per ``block_m`` of them, whatever the routing
    (vllm/model_executor/layers/fused_moe/moe_align_block_size.py; SGLang's copy the same). Below 1,024 choices
    and up to 64 experts one CTA of ``max(E, 32)`` threads counts, scans and sorts in shared memory
    (``moe_align_block_size_small_batch_expert_kernel``, a ``(threads + 1) x E`` count table); otherwise one CTA
    of 1,024 threads counts into shared memory, scans over the experts and fills both lists
    (``moe_align_block_size_kernel``), then ``count_and_sort_expert_tokens_kernel`` places every choice with a
    global atomic, 256 threads a CTA (csrc/moe/moe_align_sum_kernels.cu). The lists and the choices (which the
    router has just written) are a few hundred KB at most and stay in L2: no DRAM traffic is counted."""
    experts, numel = kernel.router_experts(), kernel.tokens * kernel.top_k
    padded = numel + experts * (block_m - 1)
    lists = 4.0 * (padded + -(-padded // block_m))  # sorted ids + expert ids, int32
    if numel < 1024 and experts <= 64:
        threads = max(experts, 32)
        table = (threads + 1) * experts
        return (uniform_launch(kernel, gpu, 1, threads, 3.0 * table + 2.0 * numel, 0.0, lists + 8.0 * numel,
                               4.0 * (3 * table + experts + 1), "moe_align_block_size (small batch)",
                               smem_alloc=4 * (table + experts + 1), from_dram=False,
                               note=f"{padded} padded slots over {experts} experts"),)
    return (
        uniform_launch(kernel, gpu, 1, _ALIGN_THREADS, 2.0 * numel + 2.0 * experts, 0.0, lists + 4.0 * numel,
                       4.0 * (2 * numel + 3 * experts), "moe_align_block_size",
                       smem_alloc=4 * (-(-experts // 32) * 32) + 4 * 1024, from_dram=False,
                       note=f"{padded} padded slots over {experts} experts"),
        uniform_launch(kernel, gpu, -(-numel // _SORT_THREADS), _SORT_THREADS, 2.0 * numel, 0.0, 12.0 * numel, 0.0,
                       "count_and_sort_expert_tokens", from_dram=False, note=f"{numel} choices"),
    )


def marlin_sum_launch(kernel: MarlinMoE, gpu: GpuSpec, hidden: int) -> Launch:
    """The sum over each token's ``top_k`` down-projection rows that ends ``fused_marlin_moe`` (``moe_sum``: grid
    = tokens, ``min(hidden, 1024)`` threads, for top-2 to top-4, csrc/moe/moe_align_sum_kernels.cu; ``at::sum_out``
    for other top-k, taken with the same grid): every choice's row read, including those of experts on other
    expert-parallel ranks, which the zeroed output holds. The rows are the down GEMM's output, just written: read
    from L2 when they fit in it, from DRAM otherwise."""
    rows = kernel.tokens * kernel.top_k
    return uniform_launch(kernel, gpu, kernel.tokens, min(hidden, 1024), float(rows * hidden), 0.0,
                          2.0 * hidden * (rows + kernel.tokens), 0.0, "moe_sum (top-k reduce)",
                          from_dram=2.0 * hidden * rows > gpu.l2_cache_bytes,
                          note=f"top-{kernel.top_k} rows of {hidden}")


def marlin_zero_launch(kernel: MarlinMoE, gpu: GpuSpec, hidden: int) -> Launch | None:
    """Under expert parallelism (``router_experts() > num_experts``) ``_fused_marlin_moe`` zeroes the down GEMM's
    ``tokens·top_k x hidden`` BF16 output first (``if expert_map is not None: output.zero_()``), as the GEMM writes
    only the rows of this GPU's experts; PyTorch's fill kernel. None without expert parallelism."""
    if kernel.router_experts() <= kernel.num_experts:
        return None
    elems = kernel.tokens * kernel.top_k * hidden
    return uniform_launch(kernel, gpu, -(-elems // _FILL_ELEMENTS_PER_CTA), 128, 0.0, 0.0, 2.0 * elems, 0.0,
                          "output.zero_() (expert parallel)", note=f"{elems} BF16 zeros")


def decompose_marlin_moe(kernel: MarlinMoE, gpu: GpuSpec) -> tuple[Launch, ...]:
    """Every launch of one ``fused_marlin_moe`` call, in order (vllm/model_executor/layers/fused_moe/
    fused_marlin_moe.py): the expert sort (:func:`marlin_align_launches`), the gate/up GEMM, the activation, under
    expert parallelism the output's zeroing (:func:`marlin_zero_launch`), the down GEMM and the top-k sum
    (:func:`marlin_sum_launch`). The router that picks the experts is a kernel of its own (``RouterTopK``)."""
    block_m = marlin_block_m(kernel)
    hidden, inter = marlin_dims(kernel)
    act = SiluMul(tokens=max(kernel.routed_pairs(), 1), dim=inter)
    zero = marlin_zero_launch(kernel, gpu, hidden)
    return (
        *marlin_align_launches(kernel, gpu, block_m),
        _marlin_gemm(kernel, gpu, 2 * inter, hidden, block_m, "marlin_moe w13 (gate/up)"),
        *decompose_rowwise(act, gpu),
        *((zero,) if zero is not None else ()),
        _marlin_gemm(kernel, gpu, hidden, inter, block_m, "marlin_moe w2 (down)"),
        marlin_sum_launch(kernel, gpu, hidden),
    )
