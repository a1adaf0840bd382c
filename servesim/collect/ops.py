"""Building each implementation's operation for one shape: allocate its inputs on the device and return a
zero-argument callable that launches it. Imports torch at module level: only the collector's run path imports
this module.

Inputs are standard-normal (the GPU draws less power on zeros, which would flatter it). Layouts follow the
engines: activations ``[tokens, features]``, linear weights ``[out, in]`` (``nn.Linear``), Q/K/V
``[tokens, heads, head_dim]``.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from servesim.collect.implementations import Implementation
from servesim.collect.schema import Shape

Op = Callable[[], object]
_BF16 = torch.bfloat16
_FP8 = torch.float8_e4m3fn
#: RMSNorm epsilon (checkpoints set 1e-5 or 1e-6; the value does not change the work).
_RMS_EPS = 1e-6
#: RoPE cache rows (positions); positions are drawn below it.
_ROPE_POSITIONS = 8192
#: FlashInfer page size (vLLM's default block size) and workspace (vLLM's FLASHINFER_WORKSPACE_BUFFER_SIZE).
_FLASHINFER_PAGE = 16
_FLASHINFER_WORKSPACE_BYTES = 256 * 2**20
#: vLLM's FlashInfer backend uses tensor-core decode when the GQA group is larger than this.
_FLASHINFER_TC_GROUP = 4


class Unsupported(Exception):
    """This implementation cannot run this shape; the message is the reason recorded in the manifest."""


def _randn(*shape: int, device: str, dtype: torch.dtype = _BF16) -> torch.Tensor:
    return torch.randn(*shape, device=device, dtype=torch.float32).to(dtype)


# --- GEMM ------------------------------------------------------------------------------------------------------

def _gemm(s: dict, device: str) -> Op:
    a, w = _randn(s["m"], s["k"], device=device), _randn(s["n"], s["k"], device=device)
    out = torch.empty(s["m"], s["n"], device=device, dtype=_BF16)
    w_t = w.t()
    return lambda: torch.matmul(a, w_t, out=out)


def _scaled_mm(s: dict, device: str) -> Op:
    # torch._scaled_mm(self [m, k] row-major, mat2 [k, n] column-major, scale_a, scale_b, bias, scale_result,
    # out_dtype, use_fast_accum): per-tensor scaling takes one fp32 scale per operand.
    a, w = _randn(s["m"], s["k"], device=device, dtype=_FP8), _randn(s["n"], s["k"], device=device, dtype=_FP8)
    scale_a = torch.ones((), device=device, dtype=torch.float32)
    scale_b = torch.ones((), device=device, dtype=torch.float32)
    w_t = w.t()
    return lambda: torch._scaled_mm(a, w_t, scale_a=scale_a, scale_b=scale_b, out_dtype=_BF16)


# --- attention -------------------------------------------------------------------------------------------------

def _qkv(s: dict, q_len: int, kv_len: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q ``[batch, q_len, heads, d]`` and K, V ``[batch, kv_len, kv_heads, d]``."""
    b, d = s["batch"], s["head_dim"]
    q = _randn(b, q_len, s["num_heads"], d, device=device)
    k = _randn(b, kv_len, s["num_kv_heads"], d, device=device)
    v = _randn(b, kv_len, s["num_kv_heads"], d, device=device)
    return q, k, v


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> Op:
    # SDPA takes [batch, heads, len, d]; the transposes are views, which the flash kernel reads in place.
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    gqa = q.shape[1] != k.shape[1]

    def op() -> torch.Tensor:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # raises rather than fall back to another backend
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    return op


def _sdpa_prefill(s: dict, device: str) -> Op:
    if s["prefix_len"]:
        raise Unsupported("SDPA's causal mask is aligned top-left, so it cannot attend to a cached prefix")
    return _sdpa(*_qkv(s, s["seq_len"], s["seq_len"], device), causal=True)


def _sdpa_decode(s: dict, device: str) -> Op:
    return _sdpa(*_qkv(s, 1, s["kv_len"], device), causal=False)


def _flash_attn_prefill(s: dict, device: str) -> Op:
    from flash_attn import flash_attn_func

    # causal=True aligns the mask bottom-right, so the new tokens see the whole prefix.
    q, k, v = _qkv(s, s["seq_len"], s["seq_len"] + s["prefix_len"], device)
    return lambda: flash_attn_func(q, k, v, causal=True)


def _flash_attn_decode(s: dict, device: str) -> Op:
    from flash_attn import flash_attn_with_kvcache

    q, k_cache, v_cache = _qkv(s, 1, s["kv_len"], device)
    return lambda: flash_attn_with_kvcache(q, k_cache, v_cache, causal=True)


def _flashinfer_workspace(device: str) -> torch.Tensor:
    return torch.empty(_FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)


def _indptr(batch: int, step: int, device: str) -> torch.Tensor:
    return torch.arange(0, (batch + 1) * step, step, dtype=torch.int32, device=device)


def _flashinfer_prefill(s: dict, device: str) -> Op:
    import flashinfer

    b, q_len, kv_len = s["batch"], s["seq_len"], s["seq_len"] + s["prefix_len"]
    q, k, v = (x.flatten(0, 1) for x in _qkv(s, q_len, kv_len, device))  # ragged [tokens, heads, d]
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_flashinfer_workspace(device), "NHD")
    wrapper.plan(_indptr(b, q_len, device), _indptr(b, kv_len, device), s["num_heads"], s["num_kv_heads"],
                 s["head_dim"], causal=True, q_data_type=_BF16, kv_data_type=_BF16)
    return lambda: wrapper.run(q, k, v)


def _flashinfer_decode(s: dict, device: str) -> Op:
    import flashinfer

    b, kv_len, page = s["batch"], s["kv_len"], _FLASHINFER_PAGE
    pages = -(-kv_len // page)
    q = _randn(b, s["num_heads"], s["head_dim"], device=device)
    cache = _randn(b * pages, 2, page, s["num_kv_heads"], s["head_dim"], device=device)
    tensor_cores = s["num_heads"] // s["num_kv_heads"] > _FLASHINFER_TC_GROUP
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_flashinfer_workspace(device), "NHD",
                                                            use_tensor_cores=tensor_cores)
    last_page_len = torch.full((b,), kv_len - (pages - 1) * page, dtype=torch.int32, device=device)
    indices = torch.arange(b * pages, dtype=torch.int32, device=device)
    wrapper.plan(_indptr(b, pages, device), indices, last_page_len, s["num_heads"], s["num_kv_heads"],
                 s["head_dim"], page, q_data_type=_BF16, kv_data_type=_BF16)
    return lambda: wrapper.run(q, cache)


# --- element-wise ----------------------------------------------------------------------------------------------

def rms_norm_native(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """vLLM ``RMSNorm.forward_native``: fp32 mean of squares, rsqrt, back to the input dtype, times the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + _RMS_EPS)
    return h.to(x.dtype) * weight


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """vLLM ``SiluAndMul.forward_native``: ``silu(x[..., :d]) * x[..., d:]``."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def rope_neox(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
              cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM ``RotaryEmbedding.forward_native`` (NeoX style, full rotary dim): look up cos/sin by position in the
    fp32 cache and rotate the two halves of every Q and K head."""
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
    head_dim = 2 * cos.shape[-1]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        heads = x.unflatten(-1, (-1, head_dim)).float()
        x1, x2 = heads.chunk(2, dim=-1)
        c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype).flatten(-2)

    return rotate(q), rotate(k)


@functools.cache
def _compiled(fn: Callable) -> Callable:
    """``fn`` compiled once for every shape (``dynamic=True``): one Inductor kernel set serves all token counts,
    as the engines' kernels do, and a failure to compile raises instead of silently running eager."""
    import torch._dynamo.config as dynamo_config

    dynamo_config.fail_on_recompile_limit_hit = True
    return torch.compile(fn, dynamic=True, fullgraph=True)


def _maybe_compiled(fn: Callable, impl: Implementation) -> Callable:
    return _compiled(fn) if impl.name.endswith("_inductor") else fn


def _rmsnorm(s: dict, device: str, impl: Implementation) -> Op:
    x, w = _randn(s["num_tokens"], s["hidden"], device=device), _randn(s["hidden"], device=device)
    if impl.name.endswith("_eager"):
        return lambda: F.rms_norm(x, (s["hidden"],), w, _RMS_EPS)
    fn = _compiled(rms_norm_native)
    return lambda: fn(x, w)


def _silu_mul(s: dict, device: str, impl: Implementation) -> Op:
    x = _randn(s["num_tokens"], 2 * s["hidden"], device=device)
    fn = _maybe_compiled(silu_and_mul, impl)
    return lambda: fn(x)


def _rope(s: dict, device: str, impl: Implementation) -> Op:
    t, d = s["num_tokens"], s["head_dim"]
    positions = torch.randint(0, _ROPE_POSITIONS, (t,), device=device)
    q, k = _randn(t, s["num_heads"] * d, device=device), _randn(t, s["num_kv_heads"] * d, device=device)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
    angles = torch.outer(torch.arange(_ROPE_POSITIONS, dtype=torch.float32, device=device), inv_freq)
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1)
    fn = _maybe_compiled(rope_neox, impl)
    return lambda: fn(positions, q, k, cache)


def _residual_add(s: dict, device: str) -> Op:
    x, residual = (_randn(s["num_tokens"], s["hidden"], device=device) for _ in range(2))
    out = torch.empty_like(x)
    return lambda: torch.add(x, residual, out=out)


_BUILDERS: dict[tuple[str, str], Callable[..., Op]] = {
    ("gemm", "torch_matmul_cublas"): _gemm,
    ("scaled_mm", "torch_scaled_mm"): _scaled_mm,
    ("context_attention", "sdpa_flash"): _sdpa_prefill,
    ("context_attention", "flash_attn"): _flash_attn_prefill,
    ("context_attention", "flashinfer"): _flashinfer_prefill,
    ("generation_attention", "sdpa_flash"): _sdpa_decode,
    ("generation_attention", "flash_attn"): _flash_attn_decode,
    ("generation_attention", "flashinfer"): _flashinfer_decode,
    ("residual_add", "torch_add"): _residual_add,
}
_ELEMENTWISE_BUILDERS: dict[str, Callable[..., Op]] = {"rmsnorm": _rmsnorm, "silu_mul": _silu_mul, "rope": _rope}


def build(impl: Implementation, shape: Shape, device: str) -> Op:
    """Allocate ``shape``'s inputs on ``device`` and return the operation; raises :class:`Unsupported`."""
    values = shape.as_dict()
    if impl.category in _ELEMENTWISE_BUILDERS:
        return _ELEMENTWISE_BUILDERS[impl.category](values, device, impl)
    return _BUILDERS[(impl.category, impl.name)](values, device)


def unavailable_reason(impl: Implementation, device: str) -> str | None:
    """Why ``impl`` cannot run here at all (a missing package, no FP8 Tensor cores), or None."""
    if impl.module and importlib.util.find_spec(impl.module) is None:
        return f"{impl.module} is not installed (pip install {impl.package})"
    if device == "cuda" and impl.category == "scaled_mm":
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (8, 9):
            return f"FP8 needs compute capability 8.9 or later; this GPU is {major}.{minor}"
    if device == "cuda" and impl.name.endswith("_inductor") and importlib.util.find_spec("triton") is None:
        return "torch.compile on CUDA needs triton (pip install triton)"
    return None
