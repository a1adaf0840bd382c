"""A deployment: one engine instance's model, GPU, layout, engine release and settings, dtypes and estimator,
built and validated once.

Everything that times or simulates serving takes a :class:`Deployment` (``StepTimeModel``, ``simulate``, the
planner's tasks, the validators), so the layout is validated, the weight dtype normalised and the memory plan made
in one place, :func:`build_deployment`. A fleet that mixes GPUs or splits prefill from decode is a list of
deployments.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servesim.errors import ServesimError
from servesim.estimator.base import DEFAULT_ESTIMATOR
from servesim.hardware.spec import GpuSpec
from servesim.kernels.expand import WEIGHT_DTYPES, kv_storage_dtype, served_weights
from servesim.kernels.types import FOUR_BIT_EXPERT_FORMATS
from servesim.models.config import ModelConfig
from servesim.models.memory import MemoryPlan, plan_memory
from servesim.models.parallel import Parallelism, validate_parallelism
from servesim.serving.config import EngineSettings
from servesim.serving.engines import Engine, Release, parse_engine
from servesim.serving.scheduler import Scheduler

if TYPE_CHECKING:
    from servesim.serving.scheduler_dp import DataParallelScheduler

#: Settings a user may override (``build_deployment``'s keyword arguments), with the engines' own names.
SETTING_NAMES = ("memory_fraction", "max_num_batched_tokens", "max_num_seqs", "kv_cache_dtype",
                 "enable_prefix_caching", "async_scheduling", "mxfp4_moe_backend", "moe_backend",
                 "scheduler_recv_interval", "max_cudagraph_capture_size", "stream_interval")


@dataclass(frozen=True)
class Deployment:
    """One engine instance (a TP × PP group of one GPU type) serving one model."""

    model: ModelConfig
    gpu: GpuSpec
    par: Parallelism
    engine: Engine
    release: Release
    settings: EngineSettings
    dtype: str  # weights: bf16, fp16, fp8 (per-tensor) or fp8-block
    estimator: str = DEFAULT_ESTIMATOR

    @property
    def weight_dtype(self) -> str:
        """The weights' storage dtype: FP8 for both FP8 schemes."""
        return "fp8" if self.dtype.startswith("fp8") else self.dtype

    @property
    def kv_cache_dtype(self) -> str:
        return self.settings.kv_cache_dtype

    @property
    def mxfp4_moe_backend(self) -> str:
        """The MoE kernel MXFP4 experts run on here (``marlin``, ``triton``, ``flashinfer`` or ``flashinfer-mxfp8``;
        only MXFP4 weights read it)."""
        return self.engine.kernels.mxfp4_moe_backend(self.gpu.architecture, self.settings.mxfp4_moe_backend)

    @property
    def moe_backend(self) -> str:
        """The MoE kernel BF16 and FP8 experts run on here (``triton`` or ``flashinfer-trtllm``)."""
        return self.engine.kernels.moe_backend(self.gpu.architecture, self.model.model_type,
                                               served_weights(self.model, self.dtype), self.settings.moe_backend)

    @property
    def cudagraph_capture_tokens(self) -> int | None:
        """The largest step, in tokens, that runs in a CUDA graph where the engine lets a deployment set it (vLLM;
        None: the engine's kernels decide)."""
        return self.engine.cudagraph_capture_tokens(self.model, self.release, self.settings)

    @functools.cached_property
    def memory(self) -> MemoryPlan:
        """Weights, reserves and the KV pool per GPU (made once per deployment)."""
        return plan_memory(
            self.model, self.par, gpu_memory_bytes=self.gpu.memory_bytes,
            memory_fraction=self.settings.memory_fraction,
            reserve=self.engine.memory_reserve(self.model, self.par, self.settings),
            block_size=self.settings.block_size, weight_dtype=self.weight_dtype,
            kv_dtype=kv_storage_dtype(self.weight_dtype, self.settings.kv_cache_dtype),
            dp_mlp_over_group=self.engine.kernels.dp_mlp_over_group,
        )

    def layer_identity(self) -> tuple:
        """What one layer's kernels and their times depend on: deployments that agree on it, whatever their pipeline
        depth, can share per-layer times (``StepTimeModel(shares_with=...)``)."""
        par = self.par
        return (self.model, self.gpu, par.tp, par.ep, par.dp, self.release, self.dtype, self.kv_cache_dtype,
                self.mxfp4_moe_backend, self.moe_backend, self.cudagraph_capture_tokens)

    def timing_identity(self) -> tuple:
        """What step times depend on: deployments that agree on it time every step alike (the engine settings that
        only change batching and memory do not enter)."""
        return self.layer_identity(), self.par.pp

    def label(self) -> str:
        kv = ", fp8 KV cache" if self.kv_cache_dtype == "fp8" else ""
        return f"{self.model.name} ({self.dtype}{kv}) on {self.gpu.name} {self.par} under {self.release.label}"

    def make_scheduler(self) -> Scheduler | DataParallelScheduler:
        """The replica's scheduler: its engine's, one per attention data-parallel rank when it has ranks."""
        return self.engine.make_scheduler(self.settings, self.memory.kv_tokens, self.par.dp)

    def launch_command(self) -> str:
        """The server command whose flags this deployment's prediction assumed."""
        quant = ["--quantization fp8"] if self.dtype == "fp8" else []  # fp8-block checkpoints come quantised
        source = self.model.source
        if self.dtype == "nvfp4":
            quant = list(self.engine.nvfp4_flags)
            source = source if self.model.checkpoint_quant == "nvfp4" else nvfp4_checkpoint(source)
        forced_marlin = (self.dtype == "mxfp4" and self.mxfp4_moe_backend == "marlin"
                         and self.engine.kernels.mxfp4_moe_backend(self.gpu.architecture) != "marlin")
        env = ["VLLM_MXFP4_USE_MARLIN=1"] if forced_marlin else []
        if self.dtype == "mxfp4" and self.mxfp4_moe_backend == "flashinfer-mxfp8":
            env.append("VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1")
        # --moe-backend picks the kernel of BF16 and FP8 experts; 4-bit experts have their own (above)
        picks_moe = self.model.is_moe and self.dtype not in FOUR_BIT_EXPERT_FORMATS
        moe_env, moe_flags = self.engine.moe_backend_launch(self.settings.moe_backend) if picks_moe else ((), ())
        return " ".join([*env, *moe_env, *self.engine.launch_head(source, self.par), *quant,
                         *self.engine.launch_flags(self.settings, self.release.schedules_async(self.par)),
                         *moe_flags])


def served_kv_cache_dtype(engine_class: type[Engine], dtype: str, kv_cache_dtype: str) -> str:
    """The KV-cache dtype the engine serves ``--kv-cache-dtype kv_cache_dtype`` in for ``dtype`` weights: an NVFP4
    checkpoint's own FP8 where the engine's ``auto`` takes it (:attr:`Engine.nvfp4_auto_kv_fp8`)."""
    if dtype == "nvfp4" and kv_cache_dtype == "auto" and engine_class.nvfp4_auto_kv_fp8:
        return "fp8"
    return kv_cache_dtype


def nvfp4_checkpoint(source: str) -> str:
    """NVIDIA's NVFP4 checkpoint of the model at ``source`` (a hub id or a path): ``nvidia/<name>-NVFP4``, as
    nvidia/MiniMax-M2.5-NVFP4, nvidia/Kimi-K2.5-NVFP4 and nvidia/Qwen3.5-397B-A17B-NVFP4 are named."""
    return f"nvidia/{source.rstrip('/').split('/')[-1]}-NVFP4"


def build_deployment(
    model: ModelConfig,
    gpu: GpuSpec,
    par: Parallelism,
    engine: str = "vllm",
    dtype: str = "bf16",
    estimator: str = DEFAULT_ESTIMATOR,
    **overrides: float | int | str | bool | None,
) -> Deployment:
    """The deployment of ``model`` on ``gpu`` with ``par`` under ``engine`` (``vllm``, ``sglang`` or a release such
    as ``vllm==0.12.0``), with the release's defaults for that GPU and layout and ``overrides`` of
    :data:`SETTING_NAMES` (``None`` keeps a default). Raises :class:`ServesimError` for a layout the engines
    refuse or an unknown dtype; a model that does not fit is a valid deployment whose ``memory.fits`` is False."""
    unknown = set(overrides) - set(SETTING_NAMES)
    if unknown:
        raise ServesimError(f"unknown engine setting(s) {', '.join(sorted(unknown))}; use {', '.join(SETTING_NAMES)}")
    if dtype not in WEIGHT_DTYPES:
        raise ServesimError(f"unknown weight dtype {dtype!r}; use one of {', '.join(WEIGHT_DTYPES)}")
    validate_parallelism(model, par)
    engine_class, release = parse_engine(engine)
    engine_class.check_expert_parallel(par)
    settings = engine_class.default_settings(gpu, par, release).with_overrides(**overrides)
    settings = settings.with_overrides(kv_cache_dtype=served_kv_cache_dtype(engine_class, dtype,
                                                                             settings.kv_cache_dtype))
    if settings.async_scheduling and par.pp > 1:
        raise ServesimError(f"{release.label} runs no async scheduling with pipeline parallelism; drop "
                            f"--async-scheduling or use --pp 1")
    deployment = Deployment(model, gpu, par, engine_class, release, settings, dtype, estimator)
    deployment.mxfp4_moe_backend  # noqa: B018 - refuses a MoE kernel the engine cannot run on this GPU
    deployment.moe_backend  # noqa: B018 - likewise
    return deployment
