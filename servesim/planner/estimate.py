"""A quick per-GPU estimate without simulating traffic: memory fit, TTFT of one prompt, TPOT at batch 1 and at the
largest batch memory allows, steady-state throughput and cost.

Steady state with batch ``B``: each of ``B`` running requests needs its prompt prefilled once and then
``output_len`` decode steps, so one generation of ``B`` requests takes ``output_len · TPOT(B) + B · prefill`` and
yields ``B · output_len`` tokens. That bounds what the simulator later measures under real arrivals.
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.estimator.base import KernelEstimator
from servesim.hardware.spec import GpuSpec
from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.models.memory import GIB, MemoryPlan
from servesim.models.parallel import Parallelism
from servesim.serving.config import EngineSettings
from servesim.serving.deployment import Deployment
from servesim.serving.step_time import StepTimeModel


@dataclass(frozen=True)
class GpuEstimate:
    """One GPU option under one layout: memory, latency, throughput and cost (times in ms)."""

    gpu: GpuSpec
    par: Parallelism
    engine: EngineSettings
    memory: MemoryPlan
    input_len: int
    output_len: int
    ttft_ms: float | None = None
    tpot_batch1_ms: float | None = None
    loaded_batch: int = 0  # requests the replica holds at once (every attention data-parallel rank's)
    tpot_loaded_ms: float | None = None
    output_tokens_per_s: float | None = None  # whole replica

    @property
    def fits(self) -> bool:
        return self.memory.fits and self.loaded_batch > 0

    @property
    def kv_tokens(self) -> int:
        """KV-cache tokens the replica holds: every attention data-parallel rank's pool (one GPU's each)."""
        return self.memory.kv_tokens * self.par.dp

    @property
    def max_sequences(self) -> int:
        """Requests of the option's length the replica's KV cache holds at once, every rank's."""
        return self.memory.max_sequences(self.input_len + self.output_len) * self.par.dp if self.memory.fits else 0

    @property
    def usd_per_hour(self) -> float:
        return self.gpu.price_usd_per_gpu_hour * self.par.num_gpus

    @property
    def output_tokens_per_s_per_gpu(self) -> float | None:
        return None if self.output_tokens_per_s is None else self.output_tokens_per_s / self.par.num_gpus

    @property
    def usd_per_million_output_tokens(self) -> float | None:
        if not self.output_tokens_per_s:
            return None
        return self.usd_per_hour / (self.output_tokens_per_s * 3600) * 1e6

    def shortfall(self) -> str:
        """Why the model does not fit, in one sentence."""
        need = self.memory.needed_bytes / GIB
        have = self.memory.gpu_memory_bytes * self.memory.memory_fraction / GIB
        if not self.memory.fits:
            return (
                f"needs {need:.1f} GiB per GPU (weights {self.memory.weight_bytes / GIB:.1f} GiB) but "
                f"{self.engine.engine} may use {have:.1f} GiB of {self.gpu.name}; raise TP/PP or use FP8"
                + (f", or the memory fraction ({self.memory.memory_fraction})"
                   if self.memory.needed_bytes < self.memory.gpu_memory_bytes else "")
            )
        return (
            f"the KV cache holds {self.memory.kv_tokens} tokens, less than one request of "
            f"{self.input_len + self.output_len} tokens; raise TP/PP or shorten the context"
        )


def prefill_chunks(prompt_tokens: int, chunk_tokens: int) -> list[BatchSpec]:
    """The steps a lone prompt is prefilled in: chunks of the engine's token budget, each after the earlier ones."""
    steps = []
    for start in range(0, prompt_tokens, chunk_tokens):
        new = min(chunk_tokens, prompt_tokens - start)
        steps.append(BatchSpec(prefills=(PrefillChunk(new, start),)))
    return steps


def estimate_gpu(
    deployment: Deployment,
    estimator: KernelEstimator,
    input_len: int,
    output_len: int,
    step_model: StepTimeModel | None = None,
) -> GpuEstimate:
    """Estimate one GPU option; a model that does not fit gets its memory plan and no times.

    Pass the ``step_model`` a later simulation of the same option will use, so that it starts with these steps
    already predicted.
    """
    gpu, par, engine, memory = deployment.gpu, deployment.par, deployment.settings, deployment.memory
    context = input_len + output_len
    # Requests each engine rank holds (one rank, or each of the attention data-parallel ranks, stepping alike).
    per_rank = min(engine.max_num_seqs, memory.max_sequences(context)) if memory.fits else 0
    loaded = per_rank * par.dp
    base = GpuEstimate(gpu, par, engine, memory, input_len, output_len, loaded_batch=loaded)
    if loaded == 0:
        return base

    steps = step_model or StepTimeModel(deployment, estimator)
    prefill_us = sum(steps.step_time_us(b).latency_us for b in prefill_chunks(input_len, engine.max_num_batched_tokens))
    mid_context = input_len + output_len // 2
    tpot1_us = steps.step_time_us(BatchSpec(decodes=(mid_context,))).latency_us
    tpot_loaded_us = steps.step_time_us(BatchSpec(decodes=(mid_context,) * per_rank)).latency_us
    generation_us = output_len * tpot_loaded_us + per_rank * prefill_us
    return GpuEstimate(
        gpu,
        par,
        engine,
        memory,
        input_len,
        output_len,
        ttft_ms=prefill_us / 1e3,
        tpot_batch1_ms=tpot1_us / 1e3,
        loaded_batch=loaded,
        tpot_loaded_ms=tpot_loaded_us / 1e3,
        output_tokens_per_s=loaded * output_len / (generation_us / 1e6),
    )
