"""The engine registry: one class per serving engine, owning its releases, defaults, memory rules and scheduler.

An :class:`Engine` answers everything servesim asks of vLLM or SGLang above the kernel level: which releases are
modelled (:class:`Release`: the defaults that changed between them and the host-overhead constants), the settings
its server picks for a GPU and layout, what it keeps out of its KV pool, which scheduler forms its steps, and the
launch command that deploys what was planned. What changes the kernels a step launches (attention backend,
CUDA-graph capture, all-reduce choice) is the kernel expanders' (``servesim.kernels.engines``), which the engine
names. Adding a release is one entry in its engine's ``releases``; docs/engines.md cites each default's source.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar

from servesim.errors import ServesimError, suggest
from servesim.hardware.spec import GpuSpec
from servesim.kernels.engines import EngineKernels, get_engine_kernels, sglang_memory_defaults
from servesim.models.config import ModelConfig
from servesim.models.memory import GIB, MemoryReserve
from servesim.models.parallel import Parallelism, padded_vocab_per_gpu
from servesim.serving.config import EngineSettings
from servesim.serving.overhead import (HOST_OVERHEAD, VLLM_0_15_1_DEVICE_STEP_US, VLLM_0_15_1_MOE_EAGER_LAUNCH_US,
                                       VLLM_REQUEST_LATENCY_US, HostOverhead)
from servesim.serving.scheduler import Scheduler
from servesim.serving.scheduler_sglang import SglangScheduler
from servesim.serving.scheduler_vllm import VllmScheduler

if TYPE_CHECKING:
    from servesim.serving.scheduler_dp import DataParallelScheduler

#: vLLM's non-torch memory per GPU (CUDA context, NCCL communicators, cuBLAS workspaces): it is measured during
#: start-up and kept out of the KV cache (vllm/v1/worker/gpu_worker.py ``determine_available_memory``).
VLLM_NON_TORCH_BYTES = 0.75 * GIB
#: Extra non-torch memory with TP > 1: the custom all-reduce's IPC buffers and NCCL channel buffers.
VLLM_TP_COMM_BYTES = 0.25 * GIB
#: Memory SGLang's processes hold before it measures free memory (CUDA context, NCCL); its KV pool is
#: ``mem_fraction_static`` of what is free then, minus the weights (model_runner.py ``profile_max_num_token``).
SGLANG_CONTEXT_BYTES = 0.5 * GIB
#: vLLM's largest CUDA-graph step for gpt-oss when none is given: 1024 since the release that lifted FA3's full-graph
#: limit (vllm-project/vllm pull request 27840; 0.12.0, 0.15.1); 992, that limit, in 0.11.0.
GPT_OSS_CAPTURE_TOKENS = 1024
GPT_OSS_CAPTURE_TOKENS_0_11 = 992


@dataclass(frozen=True)
class Release:
    """One modelled release of an engine: the defaults servesim honours that changed between releases, and the
    host-overhead constants its steps pay. ``kernels_version`` is the release whose kernel sequences the
    expanders follow (kernel launches change more slowly than scheduling defaults)."""

    engine: str
    version: str
    async_scheduling: bool  # the host schedules step n+1 while step n runs (vLLM --async-scheduling, SGLang overlap)
    prefix_caching: bool  # on unless --no-enable-prefix-caching / --disable-radix-cache
    overhead: HostOverhead
    kernels_version: str
    note: str = ""  # what the release is kept for

    @property
    def label(self) -> str:
        return f"{self.engine}=={self.version}"

    def schedules_async(self, par: Parallelism) -> bool:
        """Whether the release schedules asynchronously by itself with layout ``par``: both engines turn it off
        with pipeline parallelism."""
        return self.async_scheduling and par.pp == 1


def _sglang_mem_fraction_static(gpu_mib: float, chunked_prefill_size: int, cuda_graph_max_bs: int,
                                par: Parallelism) -> float:
    """SGLang's default ``mem_fraction_static``: memory kept back for activations, graphs and parallelism."""
    reserved_mib = 512 + max(chunked_prefill_size, 2048) * 1.5 + cuda_graph_max_bs * 2 + par.tp * par.pp / 8 * 1024
    if gpu_mib > 60 * 1024:
        reserved_mib = max(reserved_mib, 10 * 1024)
    return round((gpu_mib - reserved_mib) / gpu_mib, 3)


@dataclass(frozen=True)
class Engine:
    """A serving engine: its releases (newest last) and the rules every release shares."""

    name: str
    releases: tuple[Release, ...]
    scheduler_class: type[Scheduler] = field(repr=False)

    @property
    def kernels(self) -> EngineKernels:
        return get_engine_kernels(self.name)

    @property
    def default_release(self) -> Release:
        """The newest modelled release."""
        return self.releases[-1]

    def release(self, version: str | None = None) -> Release:
        """The release ``version`` (None: the newest modelled)."""
        if version is None:
            return self.default_release
        for release in self.releases:
            if release.version == version:
                return release
        known = ", ".join(r.version for r in self.releases)
        raise ServesimError(f"{self.name} {version} is not modelled (modelled releases: {known}); use "
                            f"--engine {self.default_release.label} or another of them")

    def default_settings(self, gpu: GpuSpec, par: Parallelism, release: Release) -> EngineSettings:
        """The settings the engine's server picks for ``gpu`` and ``par`` (docs/engines.md): its memory fraction
        and batch limits (:meth:`batch_defaults`), the attention backend's page, and the release's scheduling
        defaults (async scheduling only with one pipeline stage, as both engines have it)."""
        memory_fraction, token_budget, max_seqs = self.batch_defaults(gpu, par)
        return EngineSettings(
            engine=self.name,
            version=release.version,
            memory_fraction=memory_fraction,
            max_num_batched_tokens=token_budget,
            max_num_seqs=max_seqs,
            block_size=self.kernels.page_size(self.kernels.attention_backend(gpu.architecture)),
            enable_prefix_caching=release.prefix_caching,
            async_scheduling=release.schedules_async(par),
        )

    def batch_defaults(self, gpu: GpuSpec, par: Parallelism) -> tuple[float, int, int]:
        """(memory fraction, token budget per step, running requests) the server picks."""
        raise NotImplementedError

    def cudagraph_capture_tokens(self, model: ModelConfig, release: Release, settings: EngineSettings) -> int | None:
        """The largest step, in tokens, that runs in a CUDA graph where a deployment sets it (None: the engine's
        kernels decide alone)."""
        return None

    def memory_reserve(self, model: ModelConfig, par: Parallelism, settings: EngineSettings) -> MemoryReserve:
        """What the engine keeps out of its memory fraction besides weights."""
        raise NotImplementedError

    #: How the engine hands a request to one of its attention data-parallel ranks (servesim/serving/scheduler_dp.py).
    dp_balance: ClassVar[str] = "round_robin"

    def make_scheduler(self, settings: EngineSettings, kv_tokens: int,
                       dp: int = 1) -> Scheduler | DataParallelScheduler:
        """The scheduler of one engine instance with ``kv_tokens`` of KV cache, or with ``dp`` attention
        data-parallel ranks, one such scheduler per rank stepping together."""
        if dp == 1:
            return self.scheduler_class(settings, kv_tokens)
        from servesim.serving.scheduler_dp import DataParallelScheduler

        return DataParallelScheduler([self.scheduler_class(settings, kv_tokens) for _ in range(dp)], self.dp_balance)

    #: The server's flag for each setting (memory fraction, token budget, running requests, KV page) and the flags
    #: that turn off its prefix cache and its async scheduling.
    flag_names: ClassVar[tuple[str, str, str, str]] = ("", "", "", "")
    no_prefix_cache_flag: ClassVar[str] = ""
    no_async_flag: ClassVar[str] = ""
    async_flag: ClassVar[str] = ""

    #: The server command (with ``{model}``), and its tensor- and pipeline-parallel flags.
    command: ClassVar[str] = ""
    parallel_flags: ClassVar[tuple[str, str]] = ("", "")

    def launch_head(self, model_ref: str, par: Parallelism) -> list[str]:
        """The command that starts the server for ``model_ref`` with layout ``par`` (a size of 1 is the default)."""
        return [self.command.format(model=model_ref), *self.parallel_size_flags(par), *self.expert_parallel_flags(par)]

    def parallel_size_flags(self, par: Parallelism) -> list[str]:
        """The flags of the TP, PP and attention data-parallel sizes."""
        return [f"{flag} {size}" for flag, size in zip(self.parallel_flags, (par.tp, par.pp)) if size > 1]

    def expert_parallel_flags(self, par: Parallelism) -> list[str]:
        """The flags that split the experts over ``par.ep`` GPUs (none without expert parallelism)."""
        raise NotImplementedError

    def check_expert_parallel(self, par: Parallelism) -> None:
        """Refuse an expert-parallel degree the engine cannot run inside one TP group (every engine accepts 1)."""

    #: ``--moe-backend`` -> (environment, server flags) that pick that MoE kernel of BF16 and FP8 experts.
    moe_backend_flags: ClassVar[dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {}

    def moe_backend_launch(self, moe_backend: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The environment and server flags of a requested MoE kernel (none for ``auto``)."""
        return self.moe_backend_flags.get(moe_backend, ((), ()))

    #: Server flags that serve an NVFP4 checkpoint on FlashInfer's TRT-LLM FP4 MoE (vLLM reads the format from the
    #: checkpoint and takes that kernel by itself).
    nvfp4_flags: ClassVar[tuple[str, ...]] = ()
    #: Whether ``--kv-cache-dtype auto`` takes an NVFP4 checkpoint's own KV-cache format (FP8: NVIDIA's releases
    #: declare ``kv_cache_scheme`` 8-bit float, static).
    nvfp4_auto_kv_fp8: ClassVar[bool] = False

    def launch_flags(self, settings: EngineSettings, default_async: bool) -> list[str]:
        """The server flags whose values the prediction assumed; ``default_async``: whether the engine schedules
        asynchronously by itself for this release and layout."""
        values = (settings.memory_fraction, settings.max_num_batched_tokens, settings.max_num_seqs,
                  settings.block_size)
        flags = [f"{name} {value}" for name, value in zip(self.flag_names, values)]
        if settings.kv_cache_dtype != "auto":
            flags.append(f"--kv-cache-dtype {settings.kv_cache_dtype}")
        if not settings.enable_prefix_caching:
            flags.append(self.no_prefix_cache_flag)
        if settings.async_scheduling != default_async:
            flags.append(self.async_flag if settings.async_scheduling else self.no_async_flag)
        if settings.scheduler_recv_interval > 1:
            flags.append(f"--scheduler-recv-interval {settings.scheduler_recv_interval}")
        if settings.stream_interval > 1:
            flags.append(f"--stream-interval {settings.stream_interval}")
        if settings.max_cudagraph_capture_size is not None:  # vLLM's; 0.11.0 named it --cuda-graph-sizes
            name = "--cuda-graph-sizes" if settings.version == "0.11.0" else "--max-cudagraph-capture-size"
            flags.append(f"{name} {settings.max_cudagraph_capture_size}")
        return flags


class Vllm(Engine):
    command = "vllm serve {model}"
    dp_balance = "least_loaded"
    parallel_flags = ("--tensor-parallel-size", "--pipeline-parallel-size")
    flag_names = ("--gpu-memory-utilization", "--max-num-batched-tokens", "--max-num-seqs", "--block-size")
    no_prefix_cache_flag = "--no-enable-prefix-caching"
    no_async_flag = "--no-async-scheduling"
    async_flag = "--async-scheduling"
    # vllm/model_executor/layers/fused_moe/oracle/fp8.py (0.15.1-0.19): VLLM_USE_FLASHINFER_MOE_FP8=0 and
    # VLLM_MOE_USE_DEEP_GEMM=0 take the FlashInfer and DeepGEMM kernels out of the choice, leaving Triton; =1 tries
    # only FlashInfer's, TRT-LLM first with VLLM_FLASHINFER_MOE_BACKEND=latency.
    moe_backend_flags = {"triton": (("VLLM_USE_FLASHINFER_MOE_FP8=0", "VLLM_MOE_USE_DEEP_GEMM=0"), ()),
                         "flashinfer-trtllm": (("VLLM_USE_FLASHINFER_MOE_FP8=1", "VLLM_FLASHINFER_MOE_BACKEND=latency"),
                                               ())}
    # vllm/utils/torch_utils.py resolve_kv_cache_dtype_string (0.15.1 to 0.19): "auto" becomes fp8_e4m3 when the
    # checkpoint's quantization_config declares a static 8-bit float kv_cache_scheme, as NVIDIA's NVFP4 releases do.
    nvfp4_auto_kv_fp8 = True

    def expert_parallel_flags(self, par: Parallelism) -> list[str]:
        return ["--enable-expert-parallel"] if par.ep > 1 else []

    def parallel_size_flags(self, par: Parallelism) -> list[str]:
        """With attention data parallelism, ``--tensor-parallel-size`` is one rank's GPUs and
        ``--data-parallel-size`` the ranks (vLLM's TP group is its data-parallel ranks' TP groups together)."""
        if par.dp == 1:
            return super().parallel_size_flags(par)
        sizes = zip(self.parallel_flags, (par.attention_tp, par.pp))
        return [*(f"{flag} {size}" for flag, size in sizes if size > 1), f"--data-parallel-size {par.dp}"]

    def check_expert_parallel(self, par: Parallelism) -> None:
        """``--enable-expert-parallel`` splits the experts over every GPU of the replica (EP = TP × DP; with one
        data-parallel rank, all TP GPUs) and their widths over none (vllm/model_executor/layers/fused_moe/config.py
        ``FusedMoEParallelConfig.make``), so EP is 1 or TP."""
        if par.ep not in (1, par.tp):
            raise ServesimError(f"vllm splits the experts over all {par.tp} GPUs of the TP group or none "
                                f"(--enable-expert-parallel), not {par.ep}; use --ep 1 or --ep {par.tp}, or "
                                f"--engine sglang (--ep-size {par.ep})")

    def cudagraph_capture_tokens(self, model: ModelConfig, release: Release, settings: EngineSettings) -> int:
        """``--max-cudagraph-capture-size`` (0.11.0: ``--cuda-graph-sizes``), by default ``min(2 × max_num_seqs,
        512)``, never above the token budget (``VllmConfig._set_cudagraph_sizes`` in vllm/config/vllm.py, 0.15.1;
        0.11.0's ``SchedulerConfig.cuda_graph_sizes``); a larger step runs without graphs. gpt-oss defaults to
        :data:`GPT_OSS_CAPTURE_TOKENS` (``GptOssForCausalLMConfig`` in vllm/model_executor/models/config.py)."""
        limit = settings.max_cudagraph_capture_size
        if limit is None:
            if model.model_type == "gpt_oss":
                limit = GPT_OSS_CAPTURE_TOKENS_0_11 if release.version == "0.11.0" else GPT_OSS_CAPTURE_TOKENS
            else:
                limit = min(2 * settings.max_num_seqs, self.kernels.max_capture_tokens)
        return min(limit, settings.max_num_batched_tokens)

    def batch_defaults(self, gpu: GpuSpec, par: Parallelism) -> tuple[float, int, int]:
        # vllm/engine/arg_utils.py: GPUs with >= 70 GiB whose name lacks "a100" get the larger server defaults.
        big = gpu.memory_gib >= 70 and not gpu.name.upper().startswith("A100")
        return 0.9, 8192 if big else 2048, 1024 if big else 256

    def memory_reserve(self, model: ModelConfig, par: Parallelism, settings: EngineSettings) -> MemoryReserve:
        """vLLM subtracts its profiled peak activations and non-torch memory; its CUDA graphs are captured after the
        KV cache is sized and live in the headroom above ``gpu_memory_utilization``."""
        runtime = VLLM_NON_TORCH_BYTES + (VLLM_TP_COMM_BYTES if par.tp > 1 else 0.0)
        return MemoryReserve(activation_reserve_bytes(model, par, settings), 0.0, runtime)


class Sglang(Engine):
    command = "python -m sglang.launch_server --model-path {model}"
    parallel_flags = ("--tp-size", "--pp-size")
    flag_names = ("--mem-fraction-static", "--chunked-prefill-size", "--max-running-requests", "--page-size")
    no_prefix_cache_flag = "--disable-radix-cache"
    no_async_flag = "--disable-overlap-schedule"
    async_flag = ""  # the overlap scheduler is on unless disabled
    moe_backend_flags = {"triton": ((), ("--moe-runner-backend triton",)),
                         "flashinfer-trtllm": ((), ("--moe-runner-backend flashinfer_trtllm",))}
    # As InferenceX launches NVFP4 checkpoints (benchmarks/single_node/fixed_seq_len/qwen3.5_fp4_b200.sh)
    nvfp4_flags = ("--quantization modelopt_fp4", "--moe-runner-backend flashinfer_trtllm")

    def expert_parallel_flags(self, par: Parallelism) -> list[str]:
        """``--ep-size`` splits the TP group into EP subgroups: an expert's width over ``tp / ep`` GPUs
        (``moe_ep_rank = tp_rank // (tp_size // ep_size)``, python/sglang/srt/entrypoints/engine.py)."""
        return [f"--ep-size {par.ep}"] if par.ep > 1 else []

    def parallel_size_flags(self, par: Parallelism) -> list[str]:
        """``--dp-size`` with ``--enable-dp-attention``: the TP group's GPUs split into attention ranks."""
        dp = [f"--dp-size {par.dp}", "--enable-dp-attention"] if par.dp > 1 else []
        return [*super().parallel_size_flags(par), *dp]

    def default_settings(self, gpu: GpuSpec, par: Parallelism, release: Release) -> EngineSettings:
        """The engine's settings; with attention data parallelism SGLang admits with 0.3 times the conservativeness
        (server_args.py ``_handle_data_parallelism``, 0.5.9)."""
        settings = super().default_settings(gpu, par, release)
        return replace(settings, schedule_conservativeness=0.3) if par.dp > 1 else settings

    def batch_defaults(self, gpu: GpuSpec, par: Parallelism) -> tuple[float, int, int]:
        """SGLang's defaults for the GPU's memory; with attention data parallelism each rank takes
        ``chunked_prefill_size / dp`` prompt tokens a step (server_args.py ``_handle_data_parallelism``, 0.5.9)."""
        chunk, graph_max = sglang_memory_defaults(gpu.memory_gib, par.tp)
        # max_running_requests: an upper clamp of each rank; its KV pool usually binds first (model_runner.py)
        return _sglang_mem_fraction_static(gpu.memory_gib * 1024, chunk, graph_max, par), chunk // par.dp, 4096

    def memory_reserve(self, model: ModelConfig, par: Parallelism, settings: EngineSettings) -> MemoryReserve:
        """SGLang sizes its pool from free memory after start-up, so only the memory already held then counts
        (scaled by the fraction, as the engine does); activations come out of ``mem_fraction_static``."""
        return MemoryReserve(0.0, 0.0, SGLANG_CONTEXT_BYTES * settings.memory_fraction)


def activation_reserve_bytes(model: ModelConfig, par: Parallelism, settings: EngineSettings) -> float:
    """Peak activation memory of vLLM's start-up profiling pass.

    vLLM runs a dummy forward of ``max_num_batched_tokens`` tokens and a sampler pass over ``max_num_seqs``
    rows of FP32 logits, and keeps the peak out of the KV cache. The largest live set of the forward is the
    gate/up output plus the SiLU&Mul output and the residual stream; the sampler holds logits and their softmax.
    """
    tokens = settings.max_num_batched_tokens
    mlp_width = model.moe_intermediate_size * model.num_experts_per_tok if model.is_moe else model.intermediate_size
    # With attention data parallelism a MoE layer takes every rank's tokens.
    forward = tokens * (3 * mlp_width / par.moe_tp * par.dp + 4 * model.hidden_size) * 2
    sampler = settings.max_num_seqs * padded_vocab_per_gpu(model, 1) * 4 * 2
    return forward + sampler


_VLLM_OVERHEAD = HOST_OVERHEAD[("vllm", "0.11.0")]
_VLLM_ASYNC_OVERHEAD = replace(_VLLM_OVERHEAD, request_latency_us=VLLM_REQUEST_LATENCY_US,
                               device_step_us=VLLM_0_15_1_DEVICE_STEP_US, device_per_seq_us=0.0,
                               moe_eager_launch_us=VLLM_0_15_1_MOE_EAGER_LAUNCH_US)
_SGLANG_OVERHEAD = HOST_OVERHEAD[("sglang", "0.5.3")]

VLLM = Vllm("vllm", (
    Release("vllm", "0.11.0", async_scheduling=False, prefix_caching=True, overhead=_VLLM_OVERHEAD,
            kernels_version="0.11.0", note="the release whose kernels the expanders follow"),
    Release("vllm", "0.12.0", async_scheduling=False, prefix_caching=True, overhead=_VLLM_OVERHEAD,
            kernels_version="0.11.0", note="aiconfigurator-core's measured vLLM serving runs"),
    Release("vllm", "0.15.1", async_scheduling=True, prefix_caching=True, overhead=_VLLM_ASYNC_OVERHEAD,
            kernels_version="0.11.0", note="async scheduling on by default from 0.14.0"),
), VllmScheduler)

SGLANG = Sglang("sglang", (
    Release("sglang", "0.5.3", async_scheduling=True, prefix_caching=True, overhead=_SGLANG_OVERHEAD,
            kernels_version="0.5.3", note="the release whose kernels the expanders follow"),
), SglangScheduler)

ENGINES: dict[str, Engine] = {engine.name: engine for engine in (VLLM, SGLANG)}

#: What ``--engine`` accepts: an engine, or an engine and one of its releases.
ENGINE_CHOICES = tuple([*ENGINES, *(r.label for e in ENGINES.values() for r in e.releases)])


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name.strip().lower()]
    except KeyError:
        raise ServesimError(
            f"unknown engine {name!r}.{suggest(name, ENGINES)} Choose one of: {', '.join(ENGINES)}."
        ) from None


def release_key(version: str) -> tuple[int, ...]:
    """A release's leading numbers, for ordering (``0.5.1.post1`` -> (0, 5, 1))."""
    numbers = []
    for part in version.strip().lstrip("v").split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


def parse_engine(spec: str) -> tuple[Engine, Release]:
    """``vllm`` (its newest modelled release) or ``vllm==0.12.0``."""
    name, _, version = spec.partition("==")
    engine = get_engine(name)
    return engine, engine.release(version.strip() or None)
