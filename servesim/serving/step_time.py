"""Step time: one engine step's kernels through the estimator, its collectives through the communication model,
plus the engine's host overhead.

Kernel predictions are memoised by kernel (frozen, hashable), so a simulator that replays the same step shapes
pays for each distinct kernel once; whole steps are memoised by batch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from servesim.estimator.base import KernelEstimator
from servesim.hardware.spec import GpuSpec
from servesim.kernels.batch import BatchSpec
from servesim.kernels.expand import StepKernels, expand
from servesim.kernels.types import Collective, Kernel
from servesim.models.config import ModelConfig
from servesim.models.parallel import Parallelism
from servesim.serving.overhead import HostOverhead, host_overhead


@dataclass(frozen=True)
class StepTime:
    """Times of one step, µs. ``stage_us`` holds each pipeline stage's GPU time (kernels and collectives)."""

    stage_us: tuple[float, ...]
    compute_us: float  # kernels, all stages
    communication_us: float  # collectives, all stages, including the send/recv between stages
    overhead_us: float  # host overhead of the step

    @property
    def latency_us(self) -> float:
        """Time from the step's start to its last token: all stages in turn plus the host overhead."""
        return sum(self.stage_us) + self.overhead_us

    @property
    def bottleneck_stage_us(self) -> float:
        """The slowest stage: with micro-batches in flight, it sets the pipeline's step rate."""
        return max(self.stage_us)


def _comm_implementation(collective: Collective, in_graph: bool) -> str:
    """The communication model's name for the implementation the expansion chose (the custom all-reduce runs
    from registered buffers inside a CUDA graph, from an extra copy outside one)."""
    if collective.implementation == "custom_ar":
        return "custom_graph" if in_graph else "custom_eager"
    return collective.implementation


class StepTimeModel:
    """Predicts step times of one model on one GPU type under one engine and layout.

    ``overhead`` replaces the engine version's host-overhead constants (``servesim.serving.overhead``), as the
    calibration does when it tries candidate values. ``kv_cache_dtype`` is the engine's ``--kv-cache-dtype``
    (``auto`` or ``fp8``) and must match the ``EngineConfig`` the memory plan is made with.
    """

    def __init__(
        self,
        engine: str,
        model: ModelConfig,
        gpu: GpuSpec,
        par: Parallelism,
        estimator: KernelEstimator,
        dtype: str = "bf16",
        overhead: HostOverhead | None = None,
        kv_cache_dtype: str = "auto",
    ) -> None:
        from servesim.kernels.engines import get_engine

        self.engine = engine
        self.overhead = overhead or host_overhead(engine, get_engine(engine).version)
        self.model = model
        self.gpu = gpu
        self.par = par
        self.estimator = estimator
        self.dtype = dtype
        self.kv_cache_dtype = kv_cache_dtype
        self._kernel_us: dict[Kernel, float] = {}
        self._collective_us: dict[tuple[Collective, bool], float] = {}
        self.step_time_us = functools.lru_cache(maxsize=65536)(self._step_time_us)

    def expand_stage(self, batch: BatchSpec, stage: int) -> StepKernels:
        return expand(self.engine, self.model, self.gpu, batch, self.par.tp, self.par.pp, stage, self.dtype,
                      self.kv_cache_dtype)

    def kernel_times_us(self, kernels: list[Kernel]) -> np.ndarray:
        """Times of ``kernels`` (µs), predicting each kernel not seen before in one batched estimator call (the
        estimator groups by category itself)."""
        missing = [kernel for kernel in dict.fromkeys(kernels) if kernel not in self._kernel_us]
        if missing:
            self._kernel_us.update(zip(missing, self.estimator.predict_us(missing, self.gpu).tolist()))
        return np.array([self._kernel_us[k] for k in kernels])

    def collective_time_us(self, collective: Collective, in_graph: bool) -> float:
        key = (collective, in_graph)
        if key not in self._collective_us:
            from servesim.comm import collective_time_us

            op = "send_recv" if collective.op in ("send", "recv") else collective.op
            self._collective_us[key] = float(
                collective_time_us(
                    op,
                    collective.bytes,
                    collective.group_size,
                    self.gpu,
                    implementation=_comm_implementation(collective, in_graph),
                    engine=self.engine,
                )
            )
        return self._collective_us[key]

    def _stage_time(self, step: StepKernels) -> tuple[float, float, int]:
        """(kernel µs, collective µs, graph launches) of one stage's step."""
        eager = step.graph_mode == "none"
        kernels = [op for op, _ in step.op_counts if isinstance(op, Kernel)]
        repeats = np.array([n for op, n in step.op_counts if isinstance(op, Kernel)])
        kernel_us = self.kernel_times_us(kernels)
        # An eager kernel never finishes sooner than the CPU can launch it.
        launch_floor_us = self.overhead.eager_launch_us
        if eager:
            kernel_us = np.maximum(kernel_us, launch_floor_us)
        if step.graph_mode == "piecewise":
            # Attention runs eagerly between the captured pieces: it pays the launch floor, and each piece is a
            # graph launch (one per attention call plus one).
            attention = np.array([k.category.startswith("attn") for k in kernels])
            kernel_us = np.where(attention, np.maximum(kernel_us, launch_floor_us), kernel_us)
            launches = int(repeats[attention].sum()) + 1
        else:
            launches = 0 if eager else 1
        comm_us = sum(self.collective_time_us(op, not eager) * n for op, n in step.op_counts
                      if isinstance(op, Collective))
        return float(kernel_us @ repeats), comm_us, launches

    def _step_time_us(self, batch: BatchSpec) -> StepTime:
        stage_us, compute_us, comm_us, launches = [], 0.0, 0.0, 0
        for stage in range(self.par.pp):
            kernel_us, collective_us, graph_launches = self._stage_time(self.expand_stage(batch, stage))
            stage_us.append(kernel_us + collective_us)
            compute_us += kernel_us
            comm_us += collective_us
            launches += graph_launches
        overhead_us = self.overhead.step_overhead_us(batch.num_requests, launches)
        return StepTime(tuple(stage_us), compute_us, comm_us, overhead_us)
