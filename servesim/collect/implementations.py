"""The implementations the collector can time, per category: what each one is, where it runs, and the name it
writes in ``kernel_source``. Metadata only (no torch); the code that builds and runs them is in ``ops.py``."""

from __future__ import annotations

from dataclasses import dataclass

from servesim.errors import ServesimError, suggest

DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class Implementation:
    """One way of running a kernel category.

    ``name`` is the ``kernel_source`` of CUDA rows and what ``--impl`` takes; ``cpu_name`` is the
    ``kernel_source`` of ``--device cpu`` rows (None: CUDA only), so a CPU row never names a GPU library.
    ``module`` must be importable for the implementation to run (``package`` installs it).
    ``attention_backend`` is the decomposer's backend for the kernels it launches (attention only).
    """

    name: str
    category: str
    description: str
    cpu_name: str | None
    default_on: tuple[str, ...]
    module: str = ""
    package: str = ""
    attention_backend: str = ""

    def kernel_source(self, device: str) -> str:
        return self.name if device == "cuda" else str(self.cpu_name)

    def runs_on(self, device: str) -> bool:
        return device == "cuda" or self.cpu_name is not None


def _elementwise(category: str, op: str, eager: str, inductor: str) -> tuple[Implementation, ...]:
    return (
        Implementation(f"torch_{op}_eager", category, eager, f"torch_{op}_eager_cpu", ("cpu",)),
        Implementation(f"torch_{op}_inductor", category, inductor, f"torch_{op}_inductor_cpu", ("cuda",)),
    )


#: Every implementation, keyed by (category, name); a name shared by two categories (``sdpa_flash`` for prefill
#: and decode) is one library run two ways.
IMPLEMENTATIONS: dict[tuple[str, str], Implementation] = {
    (impl.category, impl.name): impl
    for impl in (
        Implementation("torch_matmul_cublas", "gemm", "torch.matmul(A, W.t()) on BF16: cuBLAS/cuBLASLt on CUDA",
                       "torch_matmul_cpu", DEVICES),
        Implementation("torch_scaled_mm", "scaled_mm",
                       "torch._scaled_mm, FP8 e4m3 operands, per-tensor fp32 scales, BF16 output (GEMM only, no "
                       "activation quantisation)", "torch_scaled_mm_cpu", DEVICES),
        Implementation("sdpa_flash", "context_attention",
                       "F.scaled_dot_product_attention under sdpa_kernel(FLASH_ATTENTION): PyTorch's bundled "
                       "FlashAttention-2, causal, GQA", "sdpa_flash_cpu", DEVICES, attention_backend="fa2"),
        Implementation("flash_attn", "context_attention", "flash_attn.flash_attn_func (FlashAttention-2), causal",
                       None, ("cuda",), module="flash_attn", package="flash-attn", attention_backend="fa2"),
        Implementation("flashinfer", "context_attention",
                       "flashinfer.BatchPrefillWithRaggedKVCacheWrapper, causal", None, ("cuda",),
                       module="flashinfer", package="flashinfer-python", attention_backend="flashinfer"),
        Implementation("sdpa_flash", "generation_attention",
                       "F.scaled_dot_product_attention under sdpa_kernel(FLASH_ATTENTION), one query token per "
                       "sequence, contiguous KV", "sdpa_flash_cpu", DEVICES, attention_backend="fa2"),
        Implementation("flash_attn", "generation_attention",
                       "flash_attn.flash_attn_with_kvcache (FlashAttention-2 split-KV decode), contiguous KV",
                       None, ("cuda",), module="flash_attn", package="flash-attn", attention_backend="fa2"),
        Implementation("flashinfer", "generation_attention",
                       "flashinfer.BatchDecodeWithPagedKVCacheWrapper, 16-token pages, tensor cores when the GQA "
                       "group exceeds 4 (vLLM's rule)", None, ("cuda",), module="flashinfer",
                       package="flashinfer-python", attention_backend="flashinfer"),
        *_elementwise("rmsnorm", "rmsnorm", "F.rms_norm (one ATen op)",
                      "torch.compile(dynamic=True) of vLLM's RMSNorm.forward_native (fp32 math): one Inductor "
                      "(Triton) kernel"),
        *_elementwise("silu_mul", "silu_mul", "F.silu(x[:, :d]) * x[:, d:] (two ATen kernels)",
                      "torch.compile(dynamic=True) of the same expression: one fused Inductor kernel"),
        *_elementwise("rope", "rope_neox", "vLLM's RotaryEmbedding.forward_native, NeoX style (many ATen kernels)",
                      "torch.compile(dynamic=True) of the same function: fused Inductor kernels"),
        Implementation("torch_add", "residual_add", "torch.add(x, residual, out=y): one ATen kernel",
                       "torch_add_cpu", DEVICES),
    )
}

IMPLEMENTATION_NAMES: tuple[str, ...] = tuple(dict.fromkeys(name for _, name in IMPLEMENTATIONS))


def by_kernel_source(category: str, kernel_source: str) -> Implementation | None:
    """The implementation of ``category`` that writes ``kernel_source`` (on CUDA or CPU), if any."""
    return next((i for i in IMPLEMENTATIONS.values()
                 if i.category == category and kernel_source in (i.name, i.cpu_name)), None)


def select(categories: tuple[str, ...], device: str,
           names: tuple[str, ...] = ()) -> dict[str, tuple[Implementation, ...]]:
    """Implementations to run per category on ``device``: its defaults, except that a category with an
    implementation named in ``names`` runs only the named ones."""
    for name in names:
        if name not in IMPLEMENTATION_NAMES:
            raise ServesimError(f"unknown --impl {name!r}; choose from {', '.join(IMPLEMENTATION_NAMES)}."
                                f"{suggest(name, IMPLEMENTATION_NAMES)}")
        if not any((c, name) in IMPLEMENTATIONS for c in categories):
            raise ServesimError(f"--impl {name} measures none of the selected categories ({', '.join(categories)})")
    selected = {}
    for category in categories:
        named = [IMPLEMENTATIONS[(category, n)] for n in names if (category, n) in IMPLEMENTATIONS]
        pool = named or [i for i in IMPLEMENTATIONS.values() if i.category == category and device in i.default_on]
        for impl in pool:
            if not impl.runs_on(device):
                raise ServesimError(f"--impl {impl.name} runs on CUDA only, not with --device {device}")
        selected[category] = tuple(pool)
    return selected
