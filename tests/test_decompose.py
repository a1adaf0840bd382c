"""Task decomposition: CTA counts, workloads and occupancy as the kernels' sources and the CUDA rules give them."""

import numpy as np
import pytest

from servesim.decompose import LaunchConfig, decode_splits, decompose, occupancy
from servesim.decompose.attention import fa2_num_splits, fa3_num_splits, flashinfer_decode_chunk_pages
from servesim.errors import ServesimError
from servesim.hardware import get_gpu
from servesim.kernels.types import (
    AttentionDecode, AttentionPrefill, FusedMoE, Gemm, Quantize, RMSNorm, Rope, ScaledMM, SiluMul,
)

H100, A100, H20 = get_gpu("H100-SXM"), get_gpu("A100-SXM-80GB"), get_gpu("H20")


def _tasks(kernel, gpu):
    return sum(launch.tasks.size for launch in decompose(kernel, gpu))


@pytest.mark.parametrize(("m", "n", "k"), [(4096, 8192, 8192), (1000, 3000, 1000), (3, 4096, 4096), (77, 129, 65)])
@pytest.mark.parametrize("gpu", [H100, A100])
def test_gemm_tensor_ops_equal_closed_form_flops(m, n, k, gpu):
    kernel = Gemm(m=m, n=n, k=k)
    (launch,) = decompose(kernel, gpu)
    assert launch.tasks.demand["tensor"].sum() == pytest.approx(kernel.flops(), rel=1e-12)
    assert launch.tasks.demand["dram"].sum() == pytest.approx(kernel.bytes_moved(), rel=1e-9)


def test_scaled_mm_ctas_follow_vllm_sm90_dispatch():
    # c3x/scaled_mm_sm90_fp8_dispatch.cuh: m <= 64 -> 64x64, m <= 128 -> 64x128, else 128x128 tiles
    for m, tile_m, tile_n in [(16, 64, 64), (100, 64, 128), (4096, 128, 128)]:
        kernel = ScaledMM(m=m, n=4096, k=4096)
        (launch,) = decompose(kernel, H100)
        assert launch.tasks.size == -(-m // tile_m) * (4096 // tile_n)
        assert launch.tasks.demand["tensor"].sum() == pytest.approx(kernel.flops())


def test_sgl_kernel_scaled_mm_follows_its_sm90_and_sm100_dispatch():
    # sgl-kernel fp8_gemm_kernel.cu: SM90 m <= 256 -> 64x64 tiles, else 128x128; SM100 m <= 256 -> 128x128 2-SM
    # tiles, 64 rows per SM
    for gpu, m, tile_m, tile_n in [(H100, 200, 64, 64), (H100, 300, 128, 128), (get_gpu("B200"), 200, 64, 128)]:
        kernel = ScaledMM(m=m, n=4096, k=4096, library="sgl_kernel")
        (launch,) = decompose(kernel, gpu)
        assert launch.tasks.size == -(-m // tile_m) * (4096 // tile_n)
        assert launch.tasks.demand["tensor"].sum() == pytest.approx(kernel.flops())


def test_deepgemm_blocks_fill_the_fewest_waves():
    # 512 x 8192 on 132 SMs: 256 x 128 blocks make 128 tiles, one wave; 128 x 128 would take two.
    kernel = ScaledMM(m=512, n=8192, k=8192, scale="block")
    (launch,) = decompose(kernel, H100)
    assert launch.tasks.size == 2 * 64 and launch.notes[0].startswith("tile 256x128")
    # One token: the smallest block_m, and block_n 64 puts the 128 tiles in one wave.
    (launch,) = decompose(ScaledMM(m=1, n=8192, k=8192, scale="block"), H100)
    assert launch.notes[0].startswith("tile 16x64")


def test_skinny_gemm_splits_k_and_keeps_flops():
    kernel = Gemm(m=4, n=4096, k=8192)
    (launch,) = decompose(kernel, H100)
    splits = launch.tasks.dims[:, 0].max() + 1
    assert splits > 1 and launch.tasks.size == 32 * splits
    assert launch.tasks.demand["tensor"].sum() == pytest.approx(kernel.flops())


@pytest.mark.parametrize("backend", ["fa2", "fa3", "flashinfer"])
@pytest.mark.parametrize("causal", [True, False])
def test_prefill_tensor_ops_equal_masked_flops(backend, causal):
    kernel = AttentionPrefill(query_lens=(300, 1000, 17), kv_lens=(800, 1000, 17), num_heads=32, num_kv_heads=8,
                              head_dim=128, causal=causal, backend=backend)
    (launch,) = decompose(kernel, H100)
    assert launch.tasks.demand["tensor"].sum() == pytest.approx(kernel.flops(), rel=1e-12)


def test_fa2_prefill_grid_is_max_query_tiles_by_batch_by_heads():
    # flash_fwd_launch_template.h: grid(ceil(max_seqlen_q / kBlockM), batch, heads); kBlockM = 128
    kernel = AttentionPrefill(query_lens=(300, 1000), kv_lens=(300, 1000), num_heads=32, num_kv_heads=8,
                              head_dim=128, backend="fa2")
    (launch,) = decompose(kernel, A100)
    assert launch.grid_ctas == launch.tasks.size == 8 * 2 * 32


@pytest.mark.parametrize("kernel", [
    AttentionPrefill(query_lens=(300, 1000, 1), kv_lens=(300, 1500, 900), num_heads=32, num_kv_heads=8, head_dim=128,
                     backend="fa2"),
    AttentionDecode(kv_lens=(300, 5000, 17), num_heads=32, num_kv_heads=8, head_dim=128, backend="fa2"),
])
def test_attention_tasks_run_head_after_head_each_alike(kernel):
    # grid z (heads) is outermost: the launch is one head's tiles, then the next head's, each doing the same work
    (launch,) = decompose(kernel, A100)
    dims, heads = launch.tasks.dims, int(launch.tasks.dims[:, 1].max()) + 1
    per_head = launch.tasks.size // heads
    assert np.array_equal(dims[:, 1], np.repeat(np.arange(heads), per_head))
    for values in (dims[:, [0, 2, 3, 4, 5]], launch.tasks.duration_cycles, launch.tasks.demand["tensor"]):
        assert np.array_equal(values, np.tile(values[:per_head], (heads,) + (1,) * (values.ndim - 1)))


@pytest.mark.parametrize(("kernel", "gpu"), [
    (AttentionPrefill(query_lens=(300, 1000), kv_lens=(800, 1000), num_heads=32, num_kv_heads=8, head_dim=128,
                      backend="fa2"), A100),
    (AttentionDecode(kv_lens=(300, 5000, 17), num_heads=32, num_kv_heads=8, head_dim=128, backend="fa3"), H100),
])
def test_attention_reads_its_kv_cache_from_dram_once_over_every_head(kernel, gpu):
    # The cold bytes are spread over the tasks of all heads, not repeated per head nor shared by one head's tasks.
    (launch,) = decompose(kernel, gpu)
    demand = launch.tasks.demand
    assert demand["dram"].sum() == pytest.approx(min(kernel.bytes_moved(), demand["l2"].sum()), rel=1e-9)
    busy = demand["l2"] > 0
    assert np.allclose(demand["dram"][busy] / demand["l2"][busy], demand["dram"].sum() / demand["l2"].sum())


def test_fa3_prefill_packs_gqa_and_runs_persistent():
    kernel = AttentionPrefill(query_lens=(300, 1000), kv_lens=(300, 1000), num_heads=32, num_kv_heads=8,
                              head_dim=128, backend="fa3")
    (launch,) = decompose(kernel, H100)
    assert launch.tasks.size == (-(-300 * 4 // 128) + -(-1000 * 4 // 128)) * 8
    assert launch.grid_ctas == H100.sm_count


def test_causal_tiles_early_in_a_request_attend_to_fewer_keys():
    kernel = AttentionPrefill(query_lens=(2048,), kv_lens=(2048,), num_heads=8, num_kv_heads=8, head_dim=128,
                              backend="fa2")
    (launch,) = decompose(kernel, A100)
    head0 = launch.tasks.dims[:, 1] == 0
    keys = launch.tasks.dims[head0, 5]
    assert keys[0] == 128 and keys[-1] == 2048 and np.all(np.diff(keys) > 0)


def test_fa2_split_heuristic_matches_source_examples():
    # Source comment: batch*heads = 48 on 108 SMs -> 2 splits (efficiency 0.89) beats 3 (0.67).
    assert fa2_num_splits(48, 108, 64) == 2
    assert fa2_num_splits(200, 216, 64) == 1  # grid already >= 80% of the SMs
    # 8 blocks on 264 "SMs" with 32 key blocks: 32 splits (0.97 of a wave) is the only one near the best
    assert fa2_num_splits(8, 264, 32) == 32
    assert fa3_num_splits(8, 132, 4, 1e6) == 1  # four or fewer key blocks never split


def test_decode_split_choice_per_backend():
    fa2 = AttentionDecode(kv_lens=(4096,) * 4, num_heads=32, num_kv_heads=8, head_dim=128, backend="fa2")
    tile, splits = decode_splits(fa2, H100)
    assert tile.block_n == 128
    assert splits == fa2_num_splits(4 * 8, 2 * H100.sm_count, 32)
    assert _tasks(fa2, H100) == 4 * 8 * splits
    big = AttentionDecode(kv_lens=(4096,) * 256, num_heads=32, num_kv_heads=8, head_dim=128, backend="fa2")
    assert decode_splits(big, H100)[1] == 1
    fi = AttentionDecode(kv_lens=(4096,) * 4, num_heads=32, num_kv_heads=8, head_dim=128, backend="flashinfer")
    _, pages = decode_splits(fi, H100)
    assert int((-(-np.full(4, 256) // pages)).sum()) * 8 <= H100.sm_count * 16  # fits the grid
    # 4 requests x 8 KV heads x ceil(256 / p) chunks <= 264 CTAs -> 8 chunks of 32 pages
    assert flashinfer_decode_chunk_pages(np.array([256] * 4), 8, 264, 16) == 32
    assert flashinfer_decode_chunk_pages(np.array([256] * 64), 8, 264, 16) == 256  # grid already full


@pytest.mark.parametrize("backend", ["fa2", "fa3", "flashinfer"])
def test_decode_tensor_ops_equal_flops(backend):
    kernel = AttentionDecode(kv_lens=(17, 4096, 900), num_heads=32, num_kv_heads=8, head_dim=128, backend=backend)
    assert sum(l.tasks.demand["tensor"].sum() for l in decompose(kernel, H100)) == pytest.approx(kernel.flops())


def test_moe_grid_counts_padded_blocks_and_keeps_flops():
    kernel = FusedMoE(tokens=100, num_experts=8, top_k=2, hidden=1024, intermediate=512,
                      expert_tokens=(50, 50, 40, 30, 20, 10, 0, 0))
    w13, act, w2 = decompose(kernel, H100)
    grid_m = -(-(200 + 8 * 63) // 64)  # moe_align_block_size worst-case padding, BLOCK_SIZE_M = 64
    assert w13.tasks.size == grid_m * (1024 // 64) and w2.tasks.size == grid_m * (1024 // 64)
    assert act.tasks.size == 200
    tensor = w13.tasks.demand["tensor"].sum() + w2.tasks.demand["tensor"].sum()
    assert tensor == pytest.approx(kernel.flops())


def test_rowwise_grids_follow_vllm_sources():
    (norm,) = decompose(RMSNorm(rows=300, dim=4096), H100)
    assert norm.tasks.size == 300 and norm.config.threads_per_cta == 256
    (small,) = decompose(RMSNorm(rows=10, dim=4096), H100)
    assert small.config.threads_per_cta == 1024
    (rope,) = decompose(Rope(tokens=7, num_heads=32, num_kv_heads=8, head_dim=128), H100)
    assert rope.tasks.size == 7 and rope.config.threads_per_cta == 512
    (silu,) = decompose(SiluMul(tokens=5, dim=14336), H100)
    assert silu.tasks.demand["fma"].sum() == pytest.approx(SiluMul(tokens=5, dim=14336).flops())


def test_fp8_activation_quantisation_follows_each_engines_kernels():
    """vLLM's per-tensor scale needs the abs-max before the conversion: two launches of a CTA per token, each reading
    the activations. SGLang scales per token: one launch, a warp per token once there are 16 tokens per SM. A
    per-group scale is one pass."""
    vllm = Quantize(rows=4096, cols=8192)
    absmax, convert = decompose(vllm, H100)
    assert absmax.grid_ctas == convert.grid_ctas == 4096
    assert absmax.tasks.demand["dram"].sum() == pytest.approx(4096 * 8192 * 2)
    assert convert.tasks.demand["dram"].sum() == pytest.approx(4096 * 8192 * 3 + 4)
    sglang = Quantize(rows=4096, cols=8192, engine="sglang")
    (per_token,) = decompose(sglang, H100)
    assert per_token.grid_ctas == 4096 // 8 and per_token.tasks.demand["dram"].sum() == pytest.approx(
        4096 * 8192 * 3 + 4 * 4096)
    (few_tokens,) = decompose(Quantize(rows=100, cols=8192, engine="sglang"), H100)
    assert few_tokens.grid_ctas == 100
    group = Quantize(rows=4096, cols=8192, group=128)
    (one_pass,) = decompose(group, H100)
    assert one_pass.tasks.demand["dram"].sum() == pytest.approx(group.bytes_moved())
    assert sglang.bytes_moved() < vllm.bytes_moved() and group.bytes_moved() < vllm.bytes_moved()
    assert [q.shape() for q in (vllm, sglang)] == ["4096x8192 per-tensor vllm", "4096x8192 per-token sglang"]
    with pytest.raises(ValueError, match="unknown engine"):
        Quantize(rows=1, cols=1, engine="trtllm")


def test_occupancy_worked_examples():
    # 256 threads x 128 registers: 4096 registers per warp, 4 warps per sub-partition -> 16 warps -> 2 CTAs
    occ = occupancy(LaunchConfig(256, 128, 0), H100)
    assert (occ.ctas_per_sm, occ.limiter) == (2, "registers")
    # 256 threads x 64 registers, 48 KiB smem: registers allow 4, smem 228 KiB / 49 KiB = 4
    assert occupancy(LaunchConfig(256, 64, 48 * 1024), H100).ctas_per_sm == 4
    # 100 KiB smem on A100 (164 KiB per SM) -> 1 CTA, limited by shared memory
    occ = occupancy(LaunchConfig(128, 32, 100 * 1024), A100)
    assert (occ.ctas_per_sm, occ.limiter) == (1, "smem")
    # tiny CTAs hit the 32-CTA slot limit; 64-thread CTAs at 2048 threads also allow 32
    assert occupancy(LaunchConfig(32, 16, 0), H100).ctas_per_sm == 32
    # 1024 threads -> 2 CTAs by threads and warps
    assert occupancy(LaunchConfig(1024, 32, 0), H100).ctas_per_sm == 2
    with pytest.raises(ServesimError):
        occupancy(LaunchConfig(128, 32, 300 * 1024), H100)


def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_a_user_error():
    with pytest.raises(ServesimError, match="fp8"):
        decompose(ScaledMM(m=16, n=4096, k=4096), A100)


def test_fa2_grid_sized_by_the_longest_request_is_refused_beyond_the_task_limit():
    """FA2 gives every request the longest one's query tiles: one 128k prompt among a thousand 1-token ones
    launches 32.8M CTAs, which servesim refuses before building them; FA3 packs the same batch into 41k tasks."""
    lens = (131072,) + (1,) * 1000
    shape = dict(query_lens=lens, kv_lens=lens, num_heads=32, num_kv_heads=8, head_dim=128)
    with pytest.raises(ServesimError, match=r"32,800,768 tasks"):
        decompose(AttentionPrefill(**shape, backend="fa2"), H100)
    (launch,) = decompose(AttentionPrefill(**shape, backend="fa3"), H100)
    assert launch.tasks.size == 8 * (131072 * 4 // 128 + 1000)


def test_fa3_is_refused_off_hopper():
    kernel = AttentionDecode(kv_lens=(1024,), num_heads=32, num_kv_heads=8, head_dim=128, backend="fa3")
    with pytest.raises(ServesimError, match=r"Hopper GPUs .* not the A100-SXM-80GB \(8.0\)"):
        decompose(kernel, get_gpu("A100"))
