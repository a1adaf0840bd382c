"""Replaying a measured serving run through the simulator: the shared core of ``silicon`` and ``results``.

A :class:`ServingCase` says what was served (model, GPU, engine, weights, layout), the request stream the
benchmark sent, and what it measured. :func:`replay` simulates each case and returns one row per case with the
measured and predicted mean TTFT and TPOT; cases the simulator cannot run are returned as :class:`Skipped` with
the reason, never dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from servesim.errors import ServesimError
from servesim.serving.metrics import SimulationResult
from servesim.serving.overhead import HostOverhead
from servesim.serving.step_time import StepTimeModel
from servesim.workloads.request import Workload

if TYPE_CHECKING:
    from servesim.planner.executor import LocalExecutor

#: Checkpoints of a preset's architecture published under another Hugging Face id (instruction-tuned or
#: quantised releases). Ids equal to a preset's own ``hf_id`` need no entry.
CHECKPOINT_PRESETS: Mapping[str, str] = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama3.1-8b",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "llama3.1-8b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama3.1-70b",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "llama3.1-70b",
    "nvidia/Llama-3.1-70B-Instruct-FP8": "llama3.1-70b",
    "Qwen/Qwen3-32B-FP8": "qwen3-32b",
    "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b",
    "Qwen/Qwen3.5-397B-A17B-FP8": "qwen3.5-397b-a17b",
    "Qwen/Qwen2.5-7B": "qwen2.5-7b",
    "meta-llama/Llama-2-7b-chat-hf": "llama2-7b",
    "meta-llama/Llama-2-70b-chat-hf": "llama2-70b",
    "codellama/CodeLlama-34b-hf": "codellama-34b",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b",
    "mistralai/Mixtral-8x22B-Instruct-v0.1": "mixtral-8x22b",
    "mistralai/Mistral-Nemo-Base-2407": "mistral-nemo-12b",
    "01-ai/Yi-34B-Chat": "yi-34b",
    "zhipuai/GLM-5": "glm-5",
    "deepseek-ai/DeepSeek-V2-Lite": "deepseek-v2-lite",
    "meta-llama/Llama-4-Scout-17B-16E": "llama4-scout",
    "RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic": "llama4-scout",
    "meta-llama/Llama-4-Maverick-17B-128E": "llama4-maverick",
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8": "llama4-maverick",
}


def preset_for(model_id: str) -> str | None:
    """The preset whose architecture ``model_id`` (a Hugging Face id or a preset name) has, or None."""
    from servesim.models.registry import preset_for_hf_id, preset_names

    if model_id.strip().lower() in preset_names():
        return model_id.strip().lower()
    if model_id in CHECKPOINT_PRESETS:
        return CHECKPOINT_PRESETS[model_id]
    return preset_for_hf_id(model_id)


@dataclass(frozen=True, eq=False)
class ServingCase:
    """One measured run to replay. ``isl``/``osl`` are the nominal lengths (means when they vary)."""

    case_id: str
    model_id: str  # as the source names it
    preset: str
    gpu: str
    engine: str
    engine_version: str  # as measured ("" when the source does not say)
    dtype: str  # weights: bf16, fp8, fp8-block
    tp: int
    pp: int
    isl: float
    osl: float
    concurrency: int | None  # None: open-loop arrivals
    workload: Workload
    measured_ttft_ms: float
    measured_tpot_ms: float
    source: str = ""
    extra: Mapping[str, object] = field(default_factory=dict)  # source-specific columns carried to the output
    kv_cache_dtype: str = "auto"  # the server's --kv-cache-dtype
    max_num_seqs: int | None = None  # the server's --max-num-seqs / --max-running-requests (None: the default)
    max_num_batched_tokens: int | None = None  # the server's token budget per step (None: the default)
    async_scheduling: bool | None = None  # the server's async scheduling (None: the release's default)
    prefix_caching: bool | None = None  # the server's prefix cache (None: the release's default)
    mxfp4_moe_backend: str = "auto"  # the MoE kernel of MXFP4 experts (auto: the engine's default for the GPU)
    moe_backend: str = "auto"  # the MoE kernel of BF16 and FP8 experts
    scheduler_recv_interval: int | None = None  # SGLang's --scheduler-recv-interval (None: the default, 1)
    max_cudagraph_capture_size: int | None = None  # vLLM's --max-cudagraph-capture-size (None: its default)
    memory_fraction: float | None = None  # --gpu-memory-utilization / --mem-fraction-static (None: the default)
    measured_e2e_ms: float | None = None  # mean E2E, where the source gives it
    ep: int = 1  # the GPUs of the TP group the experts are split over (vLLM --enable-expert-parallel, SGLang --ep-size)
    dp: int = 1  # attention data-parallel ranks of the TP group (docs/parallelism.md)
    #: The API server's time per prompt token of this run's prompt text, µs (None: the release's): tokenising text
    #: costs more per token for some clients' prompts than others (servesim/validate/silicon.py).
    per_prompt_token_us: float | None = None


@dataclass(frozen=True)
class Skipped:
    """A measured run that was not replayed, and why."""

    case_id: str
    model_id: str
    gpu: str
    engine: str
    reason: str


class StepModels:
    """One :class:`StepTimeModel` per (engine, model, GPU, layout, weights), shared by every case that needs it."""

    def __init__(self, estimator: str, overheads: Mapping[str, HostOverhead] | None = None,
                 shares_with: StepModels | None = None) -> None:
        """``shares_with``: models of the same estimator whose kernel and attention times these reuse (they differ
        only in the per-step host constants, as a calibration's candidates do)."""
        from servesim.estimator import get_estimator

        self.estimator = shares_with.estimator if shares_with is not None else get_estimator(estimator)
        self.estimator_name = estimator
        self.overheads = dict(overheads or {})
        self.shares_with = shares_with
        self._models: dict[tuple, StepTimeModel] = {}

    def get(self, case: ServingCase) -> StepTimeModel:
        """The step-time model of the case's deployment, shared by every case whose deployment times steps alike
        (``Deployment.timing_identity``, what the simulator checks a step-time model against)."""
        from servesim.hardware import get_gpu
        from servesim.models import get_model

        deployment = case_deployment(case, get_model(case.preset), get_gpu(case.gpu), self.estimator_name)
        key = (deployment.timing_identity(), case.per_prompt_token_us)
        if key not in self._models:
            if case.per_prompt_token_us is not None:
                base = self.get(replace(case, per_prompt_token_us=None))
                overhead = replace(base.overhead, per_prompt_token_us=case.per_prompt_token_us)
            else:
                base = self.shares_with.get(case) if self.shares_with is not None else None
                overhead = self.overheads.get(case.engine)
            self._models[key] = StepTimeModel(deployment, self.estimator, overhead=overhead, shares_with=base)
        return self._models[key]


def case_release(case: ServingCase) -> str:
    """The engine release a case is replayed with: the newest modelled one not newer than the release it was
    measured on (the oldest modelled for an older one), or the engine's newest when the source does not say or
    names a nightly build rather than a release (``nightly-5b8c30d6…``, newer than every modelled release)."""
    from servesim.serving.engines import get_engine, release_key

    engine = get_engine(case.engine)
    measured = release_key(case.engine_version)
    if not measured:
        return engine.default_release.label
    older = [r for r in engine.releases if release_key(r.version) <= measured]
    return (older[-1] if older else engine.releases[0]).label


def case_deployment(case: ServingCase, model, gpu, estimator: str):
    """The deployment ``case`` measured: the engine's defaults for its GPU and layout, with the case's settings."""
    from servesim.models.parallel import Parallelism
    from servesim.serving.deployment import build_deployment

    return build_deployment(model, gpu, Parallelism(case.tp, case.pp, case.ep, case.dp), case_release(case), case.dtype,
                            estimator, kv_cache_dtype=case.kv_cache_dtype, max_num_seqs=case.max_num_seqs,
                            max_num_batched_tokens=case.max_num_batched_tokens,
                            async_scheduling=case.async_scheduling, enable_prefix_caching=case.prefix_caching,
                            mxfp4_moe_backend=case.mxfp4_moe_backend, moe_backend=case.moe_backend,
                            scheduler_recv_interval=case.scheduler_recv_interval, memory_fraction=case.memory_fraction,
                            max_cudagraph_capture_size=case.max_cudagraph_capture_size)


def simulate_case(case: ServingCase, step_model: StepTimeModel) -> SimulationResult:
    """Simulate ``case`` with the engine's defaults for its GPU and layout."""
    from servesim.serving.simulator import simulate

    deployment = case_deployment(case, step_model.model, step_model.gpu, step_model.deployment.estimator)
    return simulate(deployment, case.workload, step_model=step_model)


def _error(predicted: float, measured: float) -> float:
    return predicted / measured - 1.0


def case_row(case: ServingCase, summary: Mapping[str, float]) -> dict[str, object]:
    """The output row of a replayed case: identity, measured and predicted means, signed relative errors."""
    ttft, tpot = summary["ttft_mean_ms"], summary["tpot_mean_ms"]
    return {
        "case_id": case.case_id, "model_id": case.model_id, "preset": case.preset, "gpu": case.gpu,
        "engine": case.engine, "engine_version": case.engine_version, "dtype": case.dtype, "tp": case.tp,
        "pp": case.pp, "ep": case.ep, "dp": case.dp, "isl": case.isl, "osl": case.osl, "concurrency": case.concurrency,
        "requests": len(case.workload),
        "measured_ttft_ms": case.measured_ttft_ms, "predicted_ttft_ms": ttft,
        "ttft_error": _error(ttft, case.measured_ttft_ms),
        "measured_tpot_ms": case.measured_tpot_ms, "predicted_tpot_ms": tpot,
        "tpot_error": _error(tpot, case.measured_tpot_ms),
        **({"measured_e2e_ms": case.measured_e2e_ms, "predicted_e2e_ms": summary["e2e_mean_ms"],
            "e2e_error": _error(summary["e2e_mean_ms"], case.measured_e2e_ms)}
           if case.measured_e2e_ms is not None else {}),
        "kv_cache_dtype": case.kv_cache_dtype,
        "mean_batch_size": summary["mean_batch_size"], "preemptions": summary["preemptions"],
        **case.extra, "source": case.source,
    }


def replay(
    cases: Sequence[ServingCase],
    estimator: str,
    overheads: Mapping[str, HostOverhead] | None = None,
    on_case: Callable[[ServingCase], None] | None = None,
    step_models: StepModels | None = None,
    jobs: int | None = 1,
) -> tuple[list[dict[str, object]], list[Skipped]]:
    """Replay every case; returns the rows of the simulated ones and the cases the simulator refused, both in the
    order of ``cases``.

    ``overheads`` (engine -> constants) overrides the shipped host-overhead table; ``on_case`` is called after
    each case (progress reporting). Pass ``step_models`` to reuse step-time memos across calls. ``jobs`` above 1
    (None: the CPU count) replays on that many processes (:func:`replay_groups`), with the same rows.
    """
    from servesim.planner.executor import LocalExecutor

    executor = LocalExecutor(jobs)
    if executor.workers > 1 and step_models is None:
        outcomes = replay_groups(cases, estimator, overheads, executor, on_case)
    else:
        outcomes = [_outcome(case, result)
                    for case, result in replay_results(cases, step_models or StepModels(estimator, overheads), on_case)]
    rows = [outcome for outcome in outcomes if not isinstance(outcome, Skipped)]
    return rows, [outcome for outcome in outcomes if isinstance(outcome, Skipped)]


def _outcome(case: ServingCase, result: SimulationResult | Skipped) -> dict[str, object] | Skipped:
    return result if isinstance(result, Skipped) else case_row(case, result.summary())


def _timing_group(case: ServingCase) -> tuple:
    """What decides which step-time model a case uses (:meth:`StepModels.get`), read without building it, but for
    vLLM's CUDA-graph limit, which also follows the case's max_num_seqs and token budget: a process replays a whole
    group, whose cases share their kernel and step-time memos wherever that limit agrees."""
    return (case.engine, case_release(case), case.preset, case.gpu, case.tp, case.pp, case.ep, case.dp, case.dtype,
            case.kv_cache_dtype, case.mxfp4_moe_backend, case.moe_backend)


def _replay_group(task: tuple[Sequence[ServingCase], str, Mapping[str, HostOverhead] | None]
                  ) -> list[dict[str, object] | Skipped]:
    cases, estimator, overheads = task
    return [_outcome(case, result) for case, result in replay_results(cases, StepModels(estimator, overheads))]


def replay_groups(cases: Sequence[ServingCase], estimator: str, overheads: Mapping[str, HostOverhead] | None,
                  executor: LocalExecutor, on_case: Callable[[ServingCase], None] | None = None
                  ) -> list[dict[str, object] | Skipped]:
    """The outcome of each case (its row, or why it was refused), in the order of ``cases``, replayed by
    ``executor``'s processes: one task per group of cases that time steps alike (:func:`_timing_group`), the
    largest first, so each step-time model is built once and the processes finish together. Every simulation is
    deterministic, so the rows equal a replay in one process."""
    groups: dict[tuple, list[int]] = {}
    for index, case in enumerate(cases):
        groups.setdefault(_timing_group(case), []).append(index)
    members = sorted(groups.values(), key=len, reverse=True)
    tasks = [([cases[i] for i in indices], estimator, overheads) for indices in members]

    def done(task_index: int) -> None:
        if on_case is not None:
            for i in members[task_index]:
                on_case(cases[i])

    outcomes: list[dict[str, object] | Skipped | None] = [None] * len(cases)
    for indices, results in zip(members, executor.map(_replay_group, tasks, on_done=done)):
        for i, outcome in zip(indices, results):
            outcomes[i] = outcome
    return outcomes


def replay_results(
    cases: Sequence[ServingCase], step_models: StepModels, on_case: Callable[[ServingCase], None] | None = None
) -> Iterator[tuple[ServingCase, SimulationResult | Skipped]]:
    """Each case with its simulation result, or the reason the simulator refused it."""
    for case in cases:
        try:
            yield case, simulate_case(case, step_models.get(case))
        except ServesimError as exc:
            yield case, Skipped(case.case_id, case.model_id, case.gpu, case.engine, str(exc))
        if on_case is not None:
            on_case(case)
