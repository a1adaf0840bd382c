"""Step time: one engine step's kernels through the estimator, its collectives through the communication model,
plus the engine's host overhead.

A step's time is split in two parts, memoised apart: attention, whose kernels depend on every request's lengths,
and the rest (GEMMs, norms, activations, the KV-cache write, embedding, LM head, sampling, collectives), whose
kernels depend only on the step's token and request counts and its graph mode. A batch never seen before then costs
one layer's attention kernels, and its other kernels are looked up by counts. Kernel predictions are memoised by
kernel (frozen, hashable), and whole steps by batch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from servesim.errors import ServesimError
from servesim.estimator.base import KernelEstimator
from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.kernels.engines import GraphPlan, gpu_traits
from servesim.kernels.expand import Op, StepKernels, expand, step_part
from servesim.kernels.types import AttentionDecode, AttentionPrefill, Collective, Kernel
from servesim.models.config import ModelConfig
from servesim.models.parallel import stage_layers
from servesim.serving.overhead import HostOverhead

if TYPE_CHECKING:
    from servesim.serving.deployment import Deployment


@dataclass(frozen=True)
class StepTime:
    """Times of one step, µs. ``stage_us`` holds each pipeline stage's GPU time (kernels and collectives)."""

    stage_us: tuple[float, ...]
    overhead_us: float  # host overhead of the step

    @property
    def latency_us(self) -> float:
        """Time from the step's start to its last token: all stages in turn plus the host overhead."""
        return sum(self.stage_us) + self.overhead_us

    @property
    def bottleneck_stage_us(self) -> float:
        """The slowest stage: with micro-batches in flight, it sets the pipeline's step rate."""
        return max(self.stage_us)


def _is_attention(kernel: Kernel) -> bool:
    return isinstance(kernel, (AttentionDecode, AttentionPrefill))


def _alike_stages(model: ModelConfig, pp: int) -> tuple[int, ...]:
    """For each pipeline stage, the first stage that launches the same kernels outside attention: inner stages
    (neither embedding nor LM head) with the same sequence of dense and MoE layers launch the same ones."""
    first: dict[tuple, int] = {}
    return tuple(first.setdefault((stage == 0, stage == pp - 1,
                                   tuple(map(model.is_moe_layer, stage_layers(model.num_layers, pp, stage)))), stage)
                 for stage in range(pp))


def _comm_implementation(collective: Collective, in_graph: bool) -> str:
    """The communication model's name for the implementation the expansion chose (the custom all-reduce runs
    from registered buffers inside a CUDA graph, from an extra copy outside one)."""
    if collective.implementation == "custom_ar":
        return "custom_graph" if in_graph else "custom_eager"
    return collective.implementation


class StepTimeModel:
    """Predicts step times of one deployment (servesim/serving/deployment.py): its model on its GPU under its
    engine release, layout, weight and KV dtypes.

    ``estimator`` is the kernel estimator object (by default the deployment's, made afresh); ``overhead``
    replaces the release's host-overhead constants, as the calibration does when it tries candidate values.

    ``shares_with`` is a model of the same engine, model, GPU, TP, dtype, estimator and eager launch cost,
    typically with another pipeline depth or other per-step host constants: the two then share their memos of
    kernel, collective and per-layer attention times, none of which depends on the number of stages or the
    per-step host cost (a capacity search of several layouts of one TP times each attention batch once; a
    calibration tries many host constants on the same kernels).
    """

    def __init__(
        self,
        deployment: Deployment,
        estimator: KernelEstimator | None = None,
        overhead: HostOverhead | None = None,
        shares_with: StepTimeModel | None = None,
    ) -> None:
        from servesim.estimator import get_estimator

        model, gpu, par = deployment.model, deployment.gpu, deployment.par
        estimator = estimator or get_estimator(deployment.estimator)
        self.deployment = deployment
        self.engine = deployment.engine.name
        self._engine = deployment.engine.kernels
        self.overhead = overhead or deployment.release.overhead
        #: The CPU cost of one launch of this model in a step run without graphs (servesim/serving/overhead.py), and
        #: of one attention launch between the captured pieces of a piecewise graph: only attention's own Python
        #: runs there, the MoE layers being inside the pieces.
        self.launch_us = self.overhead.launch_us(deployment.model.is_moe)
        self.piecewise_launch_us = self.overhead.eager_launch_us
        self.model = model
        self.gpu = gpu
        self.par = par
        self.estimator = estimator
        self.dtype = deployment.dtype
        self.kv_cache_dtype = deployment.kv_cache_dtype
        self.mxfp4_moe_backend = deployment.mxfp4_moe_backend
        self.moe_backend = deployment.moe_backend
        self.capture_tokens = deployment.cudagraph_capture_tokens
        self._traits = gpu_traits(gpu, self._engine.name, par.attention_tp)
        #: Each pipeline stage's number of layers.
        self.stage_layers = tuple(len(stage_layers(model.num_layers, par.pp, stage)) for stage in range(par.pp))
        self._stage_alike = _alike_stages(model, par.pp)
        self._kernel_us: dict[Kernel, float] = {}
        self._collective_us: dict[tuple[Collective, bool], float] = {}
        #: The CUDA-graph mode (none, piecewise or full) of a step of some tokens, decode only or not, and the
        #: tokens its dense kernels see (padded to a captured size in a graph); a mixed step asks for several.
        self.graph_plan = functools.lru_cache(maxsize=65536)(self._graph_plan)
        self.step_time_us = functools.lru_cache(maxsize=65536)(self._step_time_us)
        #: A batch's attention kernels (``step_part``): the decodes and chunks of a mixed batch, expanded apart, recur
        #: in the batches beside it (other chunk or decode counts at the same lengths).
        self.attention_ops = functools.lru_cache(maxsize=4096)(functools.partial(self._step_part, "attention"))
        #: Each stage's time outside attention, µs, by (tokens, requests, decode only) (:meth:`rest_time_us`).
        self.rest_times: dict[tuple[int, int, bool], tuple[float, ...]] = {}
        self.rest_time_us = functools.lru_cache(maxsize=65536)(self._rest_time_us)
        #: Each stage's time outside attention of a mixed step, less its sampled rows, µs, by tokens.
        self.mixed_bodies: dict[int, tuple[float, ...]] = {}
        #: One layer's attention time, µs, and its mean number of kernels (a cycle's over its layers: a quarter a
        #: layer for Qwen3.5's one full-attention layer in four), by batch (:meth:`layer_attentions_us`).
        self.attention_by_batch: dict[BatchSpec, tuple[float, float]] = {}
        #: The same for the representative batches of mixed steps, by what they depend on
        #: (servesim/serving/step_cache.py).
        self.mixed_attention: dict[tuple[int, ...], tuple[float, float]] = {}
        if shares_with is not None:
            if shares_with._layer_identity() != self._layer_identity() or shares_with.estimator is not estimator:
                raise ServesimError(f"a step-time model of {model.name} on {gpu.name} with {par} cannot share times "
                                    f"with one of another engine, model, GPU, TP, EP, dtype, estimator or overhead")
            self._kernel_us, self._collective_us = shares_with._kernel_us, shares_with._collective_us
            self.attention_by_batch, self.mixed_attention = shares_with.attention_by_batch, shares_with.mixed_attention
        #: The decode spans servesim/serving/step_cache.py interpolates decode-only steps in, by what they depend on.
        self.decode_spans: dict[tuple[int, int, int], Any] = {}
        #: The compiled event loop's table of step-time parts (servesim/serving/compiled_loop.py), kept for the next
        #: run: (keys, values, entries). The parts depend on this model alone.
        self.loop_table: tuple[Any, Any, int] | None = None

    def _layer_identity(self) -> tuple:
        """What one layer's kernels and their times depend on: the deployment's (``Deployment.layer_identity``) and,
        of the host's terms, the eager launch costs (without graphs, and between piecewise pieces)."""
        return self.deployment.layer_identity(), self.launch_us, self.piecewise_launch_us

    def _step_part(self, part: str, batch: BatchSpec) -> tuple[Op, ...]:
        return step_part(part, self.engine, self.model, self.gpu, batch, self.par.tp, self.dtype, self.kv_cache_dtype,
                         self.par.dp, self.capture_tokens)

    def expand_stage(self, batch: BatchSpec, stage: int) -> StepKernels:
        return expand(self.engine, self.model, self.gpu, batch, self.par.tp, self.par.pp, stage, self.dtype,
                      self.kv_cache_dtype, self.mxfp4_moe_backend, self.par.ep, self.moe_backend, self.par.dp,
                      self.capture_tokens)

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

    def _graph_plan(self, num_tokens: int, decode_only: bool) -> GraphPlan:
        return self._engine.graph_plan(num_tokens, decode_only, self._traits, self.par.tp,
                                       bool(self.model.attention_chunk_size), self.capture_tokens)

    def _rest_time_us(self, num_tokens: int, num_requests: int, decode_only: bool) -> tuple[float, ...]:
        key = (num_tokens, num_requests, decode_only)
        known = self.rest_times.get(key)
        if known is None:
            known = self.rest_times[key] = self._predict_rest_us(num_tokens, num_requests, decode_only)
        return known

    def _predict_rest_us(self, num_tokens: int, num_requests: int, decode_only: bool) -> tuple[float, ...]:
        if decode_only:  # any decode batch of this size launches the same kernels outside attention
            return self._outside_attention_us(BatchSpec(decodes=(1,) * num_requests))
        # A mixed step's kernels outside attention depend on its token count, but for those on the sampled rows
        # (one per request), so the two are timed apart: a new request count costs those few ops alone. One prompt
        # chunk and single-token decodes stand for any batch with these counts.
        body_us = self.mixed_bodies.get(num_tokens)
        if body_us is None:
            body_us = self.mixed_bodies[num_tokens] = self._mixed_body_times_us(num_tokens)
        proxy = BatchSpec((PrefillChunk(num_tokens - num_requests + 1),), (1,) * (num_requests - 1))
        sampled = self._step_part("sampled_rows", proxy)
        sampled_us = self._ops_time_us([(op, 1) for op in sampled], self.graph_plan(num_tokens, False).mode)
        return (*body_us[:-1], body_us[-1] + sampled_us)

    def _mixed_body_times_us(self, num_tokens: int) -> tuple[float, ...]:
        """Each stage's time outside attention of a mixed step of ``num_tokens`` tokens, less the ops on its
        sampled rows (:func:`servesim.kernels.expand.step_part`)."""
        proxy = BatchSpec((PrefillChunk(num_tokens),))
        return self._outside_attention_us(proxy, frozenset(self._step_part("sampled_rows", proxy)))

    def _outside_attention_us(self, batch: BatchSpec, without: frozenset[Op] = frozenset()) -> tuple[float, ...]:
        """Each stage's time of ``batch``'s kernels and collectives outside attention, but for the ops ``without``."""
        stage_us: list[float] = []
        for stage, alike in enumerate(self._stage_alike):
            if alike < stage:
                stage_us.append(stage_us[alike])
                continue
            step = self.expand_stage(batch, stage)
            stage_us.append(self._ops_time_us([(op, n) for op, n in step.op_counts if op not in without],
                                              step.graph_mode))
        return tuple(stage_us)

    def _ops_time_us(self, op_counts: Sequence[tuple[Op, int]], graph_mode: str) -> float:
        """The time of ops run the given numbers of times in a step of ``graph_mode``, attention left out."""
        kernels = [(op, n) for op, n in op_counts if isinstance(op, Kernel) and not _is_attention(op)]
        kernel_us = self.kernel_times_us([op for op, _ in kernels])
        eager = graph_mode == "none"
        collectives = [(op, n) for op, n in op_counts if isinstance(op, Collective)]
        comm_us = sum(self.collective_time_us(op, not eager) * n for op, n in collectives)
        gpu_us = float(kernel_us @ np.array([n for _, n in kernels])) + comm_us
        return max(gpu_us, self.launch_bound_us(sum(n for _, n in (*kernels, *collectives)))) if eager else gpu_us

    def launch_bound_us(self, launches: float, graph_mode: str = "none") -> float:
        """The least time ``launches`` eager launches take in a step of ``graph_mode`` (``none`` or ``piecewise``):
        the CPU issues them one after another while the GPU runs what it was given, so a stretch of eager kernels
        lasts their GPU time or the CPU's time to launch them, whichever is longer (a short kernel costs nothing
        extra while a long one keeps the GPU busy)."""
        return launches * (self.piecewise_launch_us if graph_mode == "piecewise" else self.launch_us)

    def layer_attention_us(self, batch: BatchSpec) -> tuple[float, float]:
        """One layer's attention time, µs, and its mean number of kernels (memoised)."""
        known = self.attention_by_batch.get(batch)
        return known if known is not None else self.layer_attentions_us((batch,))[0]

    def layer_attentions_us(self, batches: Sequence[BatchSpec]) -> list[tuple[float, float]]:
        """:meth:`layer_attention_us` of each batch, the kernels of those not seen before predicted in one
        estimator call: the fixed cost of a call (features, descriptors, the forward pass) is then paid once for
        the several batches a step interpolates between."""
        known = self.attention_by_batch
        new = [batch for batch in dict.fromkeys(batches) if batch not in known]
        if new:
            # Each batch's launched kernels, then (a mixed batch) its decodes' and its chunks' kernels apart.
            launched = [self.attention_ops(batch) for batch in new]
            apart = [self._attention_apart(batch) for batch in new]
            times_us = self.kernel_times_us([kernel for kernels in (*launched, *apart) for kernel in kernels])
            start = 0
            spans = []
            for kernels in (*launched, *apart):
                spans.append(times_us[start:start + len(kernels)])
                start += len(kernels)
            cycle = self.model.attention_cycle_layers
            for i, batch in enumerate(new):
                mode = self.graph_plan(batch.num_tokens, batch.is_decode_only).mode
                # Attention runs eagerly (between the captured pieces of a piecewise graph, or in an eager step):
                # it is launch-bound where its kernels are shorter than their launches.
                total_us = [max(float(span.sum()), self.launch_bound_us(len(span), mode)) if mode != "full"
                            else float(span.sum()) for span in (spans[i], spans[len(new) + i]) if len(span)]
                known[batch] = (min(total_us) / cycle, len(launched[i]) / cycle)
        return [known[batch] for batch in batches]

    def _attention_apart(self, batch: BatchSpec) -> tuple[Op, ...]:
        """A mixed batch's attention as separate launches for its decodes and its chunks (nothing for a batch of
        one kind). One varlen launch over both (vLLM's FlashAttention) takes no longer than these would: it saves
        the second launch's fixed cost and fills the SMs as well. The prefill network, trained on prompt-only
        launches, exceeds that bound where decode rows dominate (110 decodes of Llama-2-7B with one 19-token chunk
        came out 41 % slower than the decodes alone), so a mixed launch takes the smaller of the two times
        (docs/validation-results.md)."""
        if not (batch.prefills and batch.decodes):
            return ()
        return (*self.attention_ops(BatchSpec(decodes=batch.decodes)),
                *self.attention_ops(BatchSpec(prefills=batch.prefills)))

    def compose(self, rest_stage_us: tuple[float, ...], attention_us: float, attention_kernels: float,
                num_requests: int, graph_mode: str) -> StepTime:
        """A step's time from its parts: each stage's time outside attention, one layer's attention time and
        kernel count, the requests (host overhead, and the device time the kernels leave out, spread over the
        stages by their layers: :meth:`layer_device_us`) and the graph mode (:meth:`graph_launches`)."""
        device_us = self.layer_device_us(num_requests)
        stage_us = tuple(rest + layers * (attention_us + device_us)
                         for rest, layers in zip(rest_stage_us, self.stage_layers))
        return StepTime(stage_us, self.overhead.step_overhead_us(num_requests,
                                                                 self.graph_launches(attention_kernels, graph_mode)))

    def layer_device_us(self, num_requests: int) -> float:
        """The device time per layer that a step of ``num_requests`` requests spends outside its kernels."""
        return self.overhead.device_overhead_us(num_requests) / self.model.num_layers

    def graph_launches(self, attention_kernels: float, graph_mode: str) -> int:
        """CUDA-graph launches of a step in ``graph_mode`` whose layers launch ``attention_kernels`` attention
        kernels each: one per stage for a full graph; for a piecewise one, one per attention call plus one per
        stage; none for an eager step."""
        return {"none": 0, "full": self.par.pp,
                "piecewise": round(attention_kernels * sum(self.stage_layers)) + self.par.pp}[graph_mode]

    def _step_time_us(self, batch: BatchSpec) -> StepTime:
        rest_us = self.rest_time_us(batch.num_tokens, batch.num_requests, batch.is_decode_only)
        attention_us, attention_kernels = self.layer_attention_us(batch)
        return self.compose(rest_us, attention_us, attention_kernels, batch.num_requests,
                            self.graph_plan(batch.num_tokens, batch.is_decode_only).mode)
