"""What the expanders need to know about each serving engine's defaults.

Each figure follows one engine version's source; docs/kernels.md names the file. Only the choices that change
which kernels a step launches live here (attention backend, CUDA-graph capture, all-reduce implementation, how a
mixed batch is attended); memory and scheduling settings belong to the serving simulator.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from servesim.errors import ServesimError, suggest
from servesim.hardware.spec import GpuSpec
from servesim.kernels.types import FOUR_BIT_EXPERT_FORMATS



@dataclass(frozen=True)
class GpuTraits:
    """The few GPU facts the expanders branch on; the memoisation key stands in for the whole GpuSpec."""

    architecture: str
    fp8_tensor_cores: bool
    nvswitch: bool
    gpus_per_node: int
    memory_gib: float
    custom_ar_limit_bytes: int  # all-reduces strictly smaller take the custom kernel; 0 when it is never used


@functools.lru_cache(maxsize=256)
def gpu_traits(gpu: GpuSpec, engine: str, tp: int) -> GpuTraits:
    """The traits of ``gpu`` for ``engine`` at tensor-parallel size ``tp``."""
    from servesim.comm import topology_of
    from servesim.comm.selection import custom_ar_max_bytes

    limit = custom_ar_max_bytes(engine, topology_of(gpu, tp)) if tp > 1 else 0
    return GpuTraits(
        architecture=gpu.architecture,
        fp8_tensor_cores=gpu.tensor_flops_per_sm_per_cycle.get("fp8", 0) > 0,
        nvswitch=bool(gpu.nvswitch),
        gpus_per_node=gpu.gpus_per_node,
        memory_gib=gpu.memory_gib,
        custom_ar_limit_bytes=int(limit),
    )


#: SGLang's settings by GPU memory (server_args.py ``_handle_gpu_memory_settings``): (memory below MiB,
#: chunked_prefill_size, cuda_graph_max_bs at TP < 4, cuda_graph_max_bs at TP >= 4).
SGLANG_MEMORY_BUCKETS = (
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 2048, 24, 80),
    (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 256, 512),
    (160 * 1024, 8192, 256, 512),
    (float("inf"), 16384, 512, 512),
)


def sglang_memory_defaults(memory_gib: float, tp: int) -> tuple[int, int]:
    """SGLang's default ``(chunked_prefill_size, cuda_graph_max_bs)`` for a GPU of ``memory_gib`` at ``tp``."""
    _, chunk, graph_small_tp, graph_large_tp = next(b for b in SGLANG_MEMORY_BUCKETS if memory_gib * 1024 < b[0])
    return chunk, graph_small_tp if tp < 4 else graph_large_tp


@dataclass(frozen=True)
class GraphPlan:
    """How a step runs: ``mode`` is ``full`` (whole forward replayed as one CUDA graph), ``piecewise`` (everything
    but attention in graphs) or ``none`` (eager); ``padded_tokens`` is the token count the graphed kernels see."""

    mode: str
    padded_tokens: int


def _pad(tokens: int, capture_sizes: tuple[int, ...]) -> int:
    return capture_sizes[bisect.bisect_left(capture_sizes, tokens)]


#: MoE kernels for MXFP4 experts: ``auto`` (the engine's default for the GPU), vLLM's Marlin MoE, the Triton path
#: (OpenAI's ``matmul_ogs``), or FlashInfer's TRT-LLM MXFP4 MoE on Blackwell with BF16 activations (``flashinfer``)
#: or MXFP8 ones (``flashinfer-mxfp8``: vLLM's ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1``).
MXFP4_MOE_BACKENDS = ("auto", "marlin", "triton", "flashinfer", "flashinfer-mxfp8")
#: MoE kernels for BF16 and FP8 experts: ``auto`` (the engine's default for the GPU, model and weights), the Triton
#: fused MoE, or FlashInfer's TRT-LLM fused MoE on Blackwell (vLLM's ``VLLM_USE_FLASHINFER_MOE_FP8=1``, SGLang's
#: ``--moe-runner-backend flashinfer_trtllm``).
MOE_BACKENDS = ("auto", "triton", "flashinfer-trtllm")


@dataclass(frozen=True)
class EngineKernels:
    """One engine version's kernel-relevant defaults."""

    name: str
    version: str
    attention_backends: Mapping[str, str]  # GPU architecture -> default attention backend
    #: vLLM's FlashInfer backend runs a mixed batch's decodes and prefills as two wrappers (decode and prefill).
    splits_mixed_attention: tuple[str, ...] = ()
    #: SGLang's FlashInfer extend: new tokens against themselves (ragged, causal) plus against the cached prefix
    #: (paged, non-causal), merged; every other backend reads new and cached keys from the paged cache at once.
    ragged_prefix_split: tuple[str, ...] = ()
    #: The LM head runs inside the decode CUDA graph, on the padded batch (SGLang captures logits).
    lm_head_in_graph: bool = False
    default_page_size: int = 16  # KV-cache tokens per page (vLLM block_size, SGLang page_size)
    fp8_tensor_library: str = "cutlass"  # runs per-tensor FP8 linears (ScaledMM.library)
    backend_page_sizes: Mapping[str, int] = field(default_factory=dict)
    #: GPU architecture -> the MoE kernel MXFP4 experts run on by default (``marlin``; ``triton`` where absent).
    mxfp4_moe_backends: Mapping[str, str] = field(default_factory=dict)
    #: GPU architecture -> model type (of the language model: ``text_config``'s where the config nests one) -> the
    #: weight formats whose experts run on FlashInfer's TRT-LLM fused MoE (:class:`servesim.kernels.types.TrtllmMoE`)
    #: rather than the Triton path.
    trtllm_moe: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    #: (model type, routed experts, shared experts) of the models whose shared expert runs inside the Triton fused
    #: MoE as one more expert every token picks (SGLang's shared-experts fusion), rather than as a dense MLP beside
    #: it, when the experts are not split over expert-parallel ranks (:meth:`fuses_shared_expert`).
    fused_shared_experts: tuple[tuple[str, int, int], ...] = ()
    #: With attention data parallelism, the dense MLPs and shared experts run on every rank's tokens gathered and
    #: split over the whole TP group (SGLang's default ``moe_dense_tp_size`` None: ``ScatterMode.FULL``,
    #: srt/layers/communicator.py), rather than on the rank's own tokens over its attention GPUs (vLLM, whose
    #: tensor-parallel group is one data-parallel rank's).
    dp_mlp_over_group: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "attention_backends", MappingProxyType(dict(self.attention_backends)))
        object.__setattr__(self, "backend_page_sizes", MappingProxyType(dict(self.backend_page_sizes)))
        object.__setattr__(self, "mxfp4_moe_backends", MappingProxyType(dict(self.mxfp4_moe_backends)))
        object.__setattr__(self, "trtllm_moe", MappingProxyType({arch: MappingProxyType(dict(types))
                                                                 for arch, types in self.trtllm_moe.items()}))

    def __hash__(self) -> int:
        return hash((self.name, self.version))

    def page_size(self, backend: str) -> int:
        return self.backend_page_sizes.get(backend, self.default_page_size)

    def attention_backend(self, architecture: str) -> str:
        try:
            return self.attention_backends[architecture]
        except KeyError:
            raise ServesimError(
                f"{self.name} {self.version}: no default attention backend known for GPU architecture "
                f"{architecture!r} (known: {', '.join(self.attention_backends)})"
            ) from None

    def mxfp4_moe_backend(self, architecture: str, requested: str = "auto") -> str:
        """The MoE kernel MXFP4 experts run on: the engine's default for the architecture (``auto``), or the one
        requested where the engine can run it there (:data:`MXFP4_MOE_BACKENDS`)."""
        if requested not in MXFP4_MOE_BACKENDS:
            raise ServesimError(f"unknown MXFP4 MoE backend {requested!r}; choose one of "
                                f"{', '.join(MXFP4_MOE_BACKENDS)}")
        default = self.mxfp4_moe_backends.get(architecture, "triton")
        if requested in ("auto", default):
            return default
        if requested.startswith("flashinfer"):
            if architecture != "blackwell":
                raise ServesimError(f"FlashInfer's TRT-LLM MXFP4 MoE runs on Blackwell GPUs only (compute capability "
                                    f"10.x), not {architecture}; use --mxfp4-moe-backend auto")
            if requested == "flashinfer-mxfp8" and self.name != "vllm":
                raise ServesimError(f"MXFP8 activations for the MXFP4 MoE are modelled for vLLM "
                                    f"(VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1), not {self.name}; use "
                                    f"--mxfp4-moe-backend auto")
            return requested
        if requested == "marlin" and "marlin" not in self.mxfp4_moe_backends.values():
            raise ServesimError(f"{self.name} has no Marlin MoE path for MXFP4 experts; use --mxfp4-moe-backend auto")
        if requested == "triton" and default == "marlin":
            raise ServesimError(f"{self.name} runs MXFP4 experts on Marlin on {architecture} GPUs (no Triton "
                                f"matmul_ogs below compute capability 9.0); use --mxfp4-moe-backend auto")
        return requested

    def moe_backend(self, architecture: str, model_type: str, weights: str, requested: str = "auto") -> str:
        """The MoE kernel BF16 and FP8 experts of ``model_type`` run on (``triton`` or ``flashinfer-trtllm``): the
        engine's default (``auto``), or the one requested where it runs (:data:`MOE_BACKENDS`). NVFP4 experts run on
        FlashInfer's TRT-LLM FP4 MoE (servesim.kernels.expand.check_nvfp4 says where)."""
        if requested not in MOE_BACKENDS:
            raise ServesimError(f"unknown MoE backend {requested!r}; choose one of {', '.join(MOE_BACKENDS)}")
        trtllm = weights == "nvfp4" or self.runs_trtllm_moe(architecture, model_type, weights)
        default = "flashinfer-trtllm" if trtllm else "triton"
        if requested in ("auto", default):
            return default
        if weights in FOUR_BIT_EXPERT_FORMATS:
            raise ServesimError(f"--moe-backend picks the kernel of BF16 and FP8 experts, not {weights} ones; drop "
                                f"--moe-backend" + (" (--mxfp4-moe-backend picks MXFP4 experts' kernel)"
                                                    if weights == "mxfp4" else ""))
        if requested == "flashinfer-trtllm" and architecture != "blackwell":
            raise ServesimError(f"FlashInfer's TRT-LLM fused MoE runs on Blackwell GPUs only (compute capability "
                                f"10.x), not {architecture}; use --moe-backend auto")
        return requested

    def runs_trtllm_moe(self, architecture: str, model_type: str, weights: str) -> bool:
        """Whether the engine runs the routed experts of ``model_type`` in ``weights`` on FlashInfer's TRT-LLM fused
        MoE on ``architecture`` GPUs by default."""
        return weights in self.trtllm_moe.get(architecture, {}).get(model_type, ())

    def fuses_shared_expert(self, model_type: str, routed_experts: int, shared_experts: int, ep: int) -> bool:
        """Whether the Triton fused MoE runs the model's shared expert as one more expert (see
        :attr:`fused_shared_experts`): never under expert parallelism."""
        return ep == 1 and (model_type, routed_experts, shared_experts) in self.fused_shared_experts

    def capture_sizes(self, gpu: GpuTraits, tp: int, capture_tokens: int | None = None) -> tuple[int, ...]:
        raise NotImplementedError

    def graph_plan(self, num_tokens: int, decode_only: bool, gpu: GpuTraits, tp: int,
                   local_attention: bool = False, capture_tokens: int | None = None) -> GraphPlan:
        """How a step of ``num_tokens`` runs; ``local_attention``: the model has chunked-local-attention layers;
        ``capture_tokens``: the deployment's largest captured step where the engine lets it be set (vLLM's
        ``Deployment.cudagraph_capture_tokens``; None: the engine's default)."""
        raise NotImplementedError

    def all_reduce_impl(self, nbytes: int, gpu: GpuTraits) -> str:
        """``custom_ar`` when the engine's CustomAllreduce takes the message, else ``nccl``.

        The rule (which groups the engine enables it for, and its size limit) is the communication model's
        (servesim/comm/selection.py), folded into ``gpu.custom_ar_limit_bytes`` so both always agree.
        """
        return "custom_ar" if nbytes < gpu.custom_ar_limit_bytes else "nccl"


@functools.lru_cache(maxsize=64)
def _vllm_capture_sizes(limit: int) -> tuple[int, ...]:
    """vLLM V1's CUDA-graph capture sizes up to ``limit`` tokens: 1, 2, 4, then multiples of 8 (asked for by every
    step expanded, hence memoised)."""
    return (*(size for size in (1, 2, 4) if size <= limit), *range(8, limit + 1, 8))


@dataclass(frozen=True, eq=False)  # keeps EngineKernels's hash (name, version)
class VllmKernels(EngineKernels):
    """vLLM V1 0.11: ``cudagraph_mode=FULL_AND_PIECEWISE``; capture sizes 1, 2, 4 and multiples of 8 up to the
    deployment's largest captured step (512, vLLM's default for the OpenAI server's ``max_num_seqs`` of 256 or 1024,
    when not given); a step above the largest size runs without graphs."""

    max_capture_tokens: int = 512

    def capture_sizes(self, gpu: GpuTraits, tp: int, capture_tokens: int | None = None) -> tuple[int, ...]:
        return _vllm_capture_sizes(self.max_capture_tokens if capture_tokens is None else capture_tokens)

    def graph_plan(self, num_tokens: int, decode_only: bool, gpu: GpuTraits, tp: int,
                   local_attention: bool = False, capture_tokens: int | None = None) -> GraphPlan:
        sizes = self.capture_sizes(gpu, tp, capture_tokens)
        if num_tokens > sizes[-1]:
            return GraphPlan("none", num_tokens)
        padded = _pad(num_tokens, sizes)
        # Chunked local attention's metadata builder takes no CUDA graph (AttentionCGSupport.NEVER in
        # vllm/model_executor/layers/attention/chunked_local_attention.py, 0.15.1), so the model runner turns
        # FULL_AND_PIECEWISE into PIECEWISE (v1/worker/gpu_model_runner.py _check_and_update_cudagraph_mode).
        return GraphPlan("full" if decode_only and not local_attention else "piecewise", padded)


@dataclass(frozen=True, eq=False)
class SglangKernels(EngineKernels):
    """SGLang 0.5: CUDA graphs for decode batches only, up to ``cuda_graph_max_bs`` chosen from GPU memory and TP
    (server_args ``_handle_gpu_memory_settings``); capture list 1, 2, 4, 8, 12, 16..256 step 8, 272..496 step 16,
    512.. step 32."""

    def max_graph_batch(self, gpu: GpuTraits, tp: int) -> int:
        return sglang_memory_defaults(gpu.memory_gib, tp)[1]

    def capture_sizes(self, gpu: GpuTraits, tp: int, capture_tokens: int | None = None) -> tuple[int, ...]:
        limit = self.max_graph_batch(gpu, tp)
        sizes = (1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, limit + 1, 32))
        return tuple(s for s in sizes if s <= limit)

    def graph_plan(self, num_tokens: int, decode_only: bool, gpu: GpuTraits, tp: int,
                   local_attention: bool = False, capture_tokens: int | None = None) -> GraphPlan:
        if not decode_only or num_tokens > self.max_graph_batch(gpu, tp):
            return GraphPlan("none", num_tokens)
        return GraphPlan("full", _pad(num_tokens, self.capture_sizes(gpu, tp)))


VLLM = VllmKernels(
    name="vllm",
    version="0.11.0",
    attention_backends={"ampere": "fa2", "ada": "fa2", "hopper": "fa3", "blackwell": "flashinfer"},
    splits_mixed_attention=("flashinfer",),
    # vllm/model_executor/layers/quantization/mxfp4.py get_mxfp4_backend: Marlin below compute capability 9.0
    # (and wherever VLLM_MXFP4_USE_MARLIN=1), Triton matmul_ogs on Hopper, and on compute capability 10.0 (FlashInfer
    # installed) FlashInfer's TRT-LLM MXFP4 MoE, BF16 activations unless VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1.
    mxfp4_moe_backends={"ampere": "marlin", "ada": "marlin", "blackwell": "flashinfer"},
)

SGLANG = SglangKernels(
    name="sglang",
    version="0.5.3",
    attention_backends={"ampere": "flashinfer", "ada": "flashinfer", "hopper": "fa3", "blackwell": "trtllm_mha"},
    ragged_prefix_split=("flashinfer",),
    lm_head_in_graph=True,
    default_page_size=1,
    backend_page_sizes={"trtllm_mha": 64},
    fp8_tensor_library="sgl_kernel",
    # python/sglang/srt/server_args.py (0.5.x), gpt-oss with MXFP4 experts on Blackwell: --moe-runner-backend auto
    # becomes flashinfer_mxfp4 (the TRT-LLM MXFP4 MoE, BF16 activations); triton_kernel elsewhere.
    mxfp4_moe_backends={"blackwell": "flashinfer"},
    # server_args.py (0.5.9, 0.5.10): on compute capability 10.x with no all-to-all backend, --moe-runner-backend
    # auto becomes flashinfer_trtllm for FP8 DeepSeek-V3/R1, Kimi-K2 and GLM-5 checkpoints and for FP8 or
    # unquantised Qwen3-MoE and Qwen3.5 ones; elsewhere FP8 block MoE stays on the Triton fused_moe.
    trtllm_moe={"blackwell": {
        **{family: ("fp8", "fp8-block") for family in ("deepseek_v3", "kimi_k2", "glm_moe_dsa", "deepseek_v32")},
        **{family: ("fp8", "fp8-block", "bf16") for family in ("qwen3_moe", "qwen3_5_moe_text")},
    }},
    # python/sglang/srt/models/deepseek_v2.py determine_num_fused_shared_experts (0.5.x): DeepSeek-V3/R1 (the
    # DeepseekV3ForCausalLM architecture, 256 routed experts and 1 shared) on compute capability 8.0 and up, without
    # expert parallelism, W4AFP8 or DeepEP; server_args.py disables it under the FlashInfer TRT-LLM MoE runner.
    # Kimi-K2 (384 experts) and DeepSeek-V3.2 (another architecture) keep their shared expert apart.
    fused_shared_experts=(("deepseek_v3", 256, 1),),
    dp_mlp_over_group=True,
)

ENGINE_KERNELS: dict[str, EngineKernels] = {e.name: e for e in (VLLM, SGLANG)}


def get_engine_kernels(name: str) -> EngineKernels:
    """The kernel-relevant defaults of engine ``name`` (the engine registry, servesim/serving/engines.py, names
    the engines and their releases)."""
    try:
        return ENGINE_KERNELS[name.strip().lower()]
    except KeyError:
        raise ServesimError(
            f"unknown engine {name!r}.{suggest(name, ENGINE_KERNELS)} Choose one of: {', '.join(ENGINE_KERNELS)}."
        ) from None
