"""Result files a user brings: ``vllm bench serve --save-result`` JSON, GuideLLM benchmark reports (JSON) and
inference-perf report folders (``config.yaml`` beside ``stage_<i>_lifecycle_metrics.json``).

Each file becomes one :class:`~servesim.validate.replay.ServingCase` per benchmark run, replayed like the
silicon rows. A result file says what was sent and measured but not what served it: the model, GPU, engine,
layout and weight format come from :class:`Deployment` (the command line), else from the file (the model id;
``vllm bench serve --metadata gpu=H100-SXM tp=2 engine=vllm dtype=fp8``), else an error names what is missing.
docs/validation.md lists every field read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from servesim.errors import ServesimError
from servesim.validate.replay import ServingCase, Skipped, preset_for
from servesim.workloads.arrivals import ArrivalProcess, Burst, Gamma, Poisson, Replay
from servesim.workloads.prefix import UNIQUE, PromptSegments
from servesim.workloads.request import Workload


class _Unset:
    """A frozen dataclass of optional fields (``None``: not given) that the next source fills."""

    def filled_from(self, other):
        """This record with its unset fields taken from ``other``, a record of the same kind."""
        return replace(self, **{k: v for k, v in vars(other).items() if getattr(self, k) is None})


@dataclass(frozen=True)
class Deployment(_Unset):
    """What served the benchmark; ``None`` fields are read from the file or reported missing."""

    model: str | None = None
    gpu: str | None = None
    engine: str | None = None
    tp: int | None = None
    pp: int | None = None
    dtype: str | None = None


class _Doc:
    """A parsed result file whose missing or mistyped fields raise one-line errors naming the file and field."""

    def __init__(self, path: Path, data: Any, kind: str) -> None:
        self.path, self.data, self.kind = path, data, kind

    def get(self, *keys: str | int, default: Any = ..., node: Any = None) -> Any:
        value = self.data if node is None else node
        for key in keys:
            try:
                value = value[key]
            except (KeyError, IndexError, TypeError):
                if default is not ...:
                    return default
                raise ServesimError(f"{self.path}: field {'.'.join(map(str, keys))} is missing; is this a "
                                    f"{self.kind}?") from None
        return value

    def number(self, *keys: str | int, node: Any = None, positive: bool = True) -> float:
        value = self.get(*keys, node=node)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or (
                positive and value <= 0):
            raise ServesimError(f"{self.path}: field {'.'.join(map(str, keys))} must be a positive number, "
                                f"not {value!r}")
        return float(value)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ServesimError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ServesimError(f"{path}: not valid JSON ({exc}); give a vllm bench serve result or a GuideLLM "
                            f"JSON report") from None


@dataclass(frozen=True)
class ServerFlags(_Unset):
    """What the server and the benchmark ran with that a result file does not record (``None``: the defaults):
    the engine settings, and ``prompt_cycle``, the number of distinct prompts a benchmark sent in turn."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    prefix_caching: bool | None = None
    async_scheduling: bool | None = None
    prompt_cycle: int | None = None


@dataclass(frozen=True, eq=False)
class MeasuredRun:
    """One benchmark run as a result file describes it."""

    run_id: str
    file_format: str  # "vllm bench serve" | "guidellm"
    model_id: str | None
    prompt_tokens: np.ndarray  # per request
    output_tokens: np.ndarray
    concurrency: int | None  # closed loop when set
    arrivals: ArrivalProcess  # arrival times (burst for a pure closed loop)
    measured_ttft_ms: float
    measured_tpot_ms: float  # vLLM's TPOT: (E2E − TTFT) / (output − 1), mean over requests
    deployment: Deployment  # what the file says about the server
    measured_e2e_ms: float | None = None  # mean E2E, where the file gives it and it is compared
    prefixes: PromptSegments | None = None  # the benchmark's prompt identity, where the file says it
    server: ServerFlags = ServerFlags()  # what the file says about the server's settings
    not_comparable: str | None = None  # why the run is not replayed (a reason), else None


def _vllm_lengths(doc: _Doc, completed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-request lengths when the run was saved with --save-detailed (failed requests, output 0, dropped), else
    every request at the mean lengths."""
    inputs, outputs = doc.get("input_lens", default=None), doc.get("output_lens", default=None)
    if isinstance(inputs, list) and isinstance(outputs, list) and len(inputs) == len(outputs) and inputs:
        prompt, output = np.asarray(inputs, dtype=np.int64), np.asarray(outputs, dtype=np.int64)
        ok = output > 0
        return prompt[ok], output[ok]
    mean_in = doc.number("total_input_tokens") / completed
    mean_out = doc.number("total_output_tokens") / completed
    return np.full(completed, max(1, round(mean_in))), np.full(completed, max(1, round(mean_out)))


def _vllm_arrivals(doc: _Doc) -> ArrivalProcess:
    rate = doc.get("request_rate", default="inf")
    if rate in ("inf", None) or rate == float("inf"):
        return Burst()
    rate = doc.number("request_rate")
    burstiness = doc.number("burstiness") if doc.get("burstiness", default=None) is not None else 1.0
    # vllm bench serve draws gamma gaps with shape = burstiness: cv = 1 / sqrt(burstiness); 1 is Poisson.
    return Poisson(rate) if burstiness == 1.0 else Gamma(rate, 1.0 / np.sqrt(burstiness))


def _int_or_none(doc: _Doc, value: Any, field: str) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1 or (isinstance(value, float) and number != value):
        raise ServesimError(f"{doc.path}: field {field} must be a whole number of at least 1, not {value!r}")
    return number


def read_vllm_bench(path: Path, data: Mapping) -> list[MeasuredRun]:
    """A ``vllm bench serve --save-result`` file (vllm/benchmarks/serve.py; older benchmark_serving.py files
    have the same keys)."""
    doc = _Doc(path, data, "vllm bench serve result")
    completed = int(doc.number("completed"))
    prompt, output = _vllm_lengths(doc, completed)
    concurrency = _int_or_none(doc, doc.get("max_concurrency", default=None), "max_concurrency")
    metadata = Deployment(
        model=doc.get("model_id", default=None), gpu=doc.get("gpu", default=None),
        engine=doc.get("engine", default=None), tp=_int_or_none(doc, doc.get("tp", default=None), "tp"),
        pp=_int_or_none(doc, doc.get("pp", default=None), "pp"), dtype=doc.get("dtype", default=None),
    )
    return [MeasuredRun(
        run_id=path.name, file_format="vllm bench serve", model_id=metadata.model, prompt_tokens=prompt,
        output_tokens=output, concurrency=concurrency, arrivals=_vllm_arrivals(doc),
        measured_ttft_ms=doc.number("mean_ttft_ms"), measured_tpot_ms=doc.number("mean_tpot_ms"),
        deployment=metadata,
    )]


def _guidellm_strategy(doc: _Doc, index: int, count: int) -> tuple[int | None, ArrivalProcess, str]:
    """(closed-loop concurrency, arrivals of ``count`` requests, label) of benchmark ``index``
    (``config.strategy`` in reports of GuideLLM 0.4 and later, ``args.strategy`` in 0.3)."""
    bench = doc.get("benchmarks", index)
    strategy = doc.get("config", "strategy", default=None, node=bench) or doc.get("args", "strategy", node=bench)
    kind = doc.get("type_", node=strategy)
    where = f"benchmarks.{index}.strategy"
    if kind == "synchronous":
        return 1, Burst(), "synchronous"
    if kind == "concurrent":
        streams = int(doc.number("streams", node=strategy))
        return streams, Burst(), f"concurrent@{streams}"
    if kind == "throughput":
        return None, Burst(), "throughput"
    if kind in ("constant", "poisson"):
        rate = doc.number("rate", node=strategy)
        arrivals = Poisson(rate) if kind == "poisson" else Replay(np.arange(count) / rate)  # constant: even gaps
        return None, arrivals, f"{kind}@{rate:g}"
    raise ServesimError(f"{doc.path}: {where} type_ {kind!r} is not replayable; synchronous, concurrent, "
                        f"throughput, constant and poisson are")


def read_guidellm(path: Path, data: Mapping) -> list[MeasuredRun]:
    """A GuideLLM report (``--output kind=json`` / ``--output-path x.json``): one run per entry of
    ``benchmarks``. TPOT is GuideLLM's ``inter_token_latency_ms`` (its ``time_per_output_token_ms`` counts the
    first token too)."""
    doc = _Doc(path, data, "GuideLLM report")
    benchmarks = doc.get("benchmarks")
    if not isinstance(benchmarks, list) or not benchmarks:
        raise ServesimError(f"{path}: field benchmarks must be a non-empty list of benchmark runs")
    runs = []
    for index, bench in enumerate(benchmarks):
        metrics = doc.get("metrics", node=bench)
        count = int(doc.number("prompt_token_count", "successful", "count", node=metrics))
        mean_in = doc.number("prompt_token_count", "successful", "mean", node=metrics)
        mean_out = doc.number("output_token_count", "successful", "mean", node=metrics)
        concurrency, arrivals, label = _guidellm_strategy(doc, index, count)
        model = (doc.get("config", "backend", "model", default=None, node=bench)
                 or doc.get("worker", "backend_model", default=None, node=bench))
        runs.append(MeasuredRun(
            run_id=f"{path.name}#{index} {label}", file_format="guidellm", model_id=model,
            prompt_tokens=np.full(count, max(1, round(mean_in))), output_tokens=np.full(count, max(1, round(mean_out))),
            concurrency=concurrency, arrivals=arrivals,
            measured_ttft_ms=doc.number("time_to_first_token_ms", "successful", "mean", node=metrics),
            measured_tpot_ms=doc.number("inter_token_latency_ms", "successful", "mean", node=metrics),
            deployment=Deployment(model=model),
        ))
    return runs


def read_result_file(path: Path, seed: int = 0) -> list[MeasuredRun]:
    """The runs in a ``vllm bench serve`` result, a GuideLLM report (told apart by their keys) or an
    inference-perf report folder (``seed`` draws what that report does not record)."""
    from servesim.validate.inference_perf import is_report, read_inference_perf

    if is_report(path):
        return read_inference_perf(path, seed)
    data = _read_json(path)
    if isinstance(data, dict) and "mean_ttft_ms" in data:
        return read_vllm_bench(path, data)
    if isinstance(data, dict) and "benchmarks" in data:
        return read_guidellm(path, data)
    raise ServesimError(f"{path}: neither a vllm bench serve result (no mean_ttft_ms) nor a GuideLLM report (no "
                        f"benchmarks); for an inference-perf report give its folder")


def cycled_prompts(run: MeasuredRun, cycle: int) -> PromptSegments:
    """Prompt identity of a run whose benchmark sent ``cycle`` distinct prompts in turn: request ``i`` repeats
    request ``i - cycle``, which the recorded lengths must agree with."""
    prompts = run.prompt_tokens
    n = len(prompts)
    ids = np.arange(n) % cycle
    mismatch = np.flatnonzero(prompts != prompts[ids])
    if len(mismatch):
        i = int(mismatch[0])
        raise ServesimError(f"{run.run_id}: request {i} has {prompts[i]} prompt tokens but request {i % cycle}, "
                            f"which --prompt-cycle {cycle} says it repeats, has {prompts[i % cycle]}; give the "
                            f"number of distinct prompts the benchmark cycled through, or leave --prompt-cycle out")
    return PromptSegments(np.arange(n + 1), ids, prompts, np.full(n, UNIQUE))


def _required(deployment: Deployment, run: MeasuredRun, field: str, option: str) -> Any:
    value = getattr(deployment, field)
    if value is None:
        raise ServesimError(f"{run.run_id}: the {field} is not in the file; give {option}")
    return value


def model_ref(model_id: str) -> str | None:
    """What the simulator loads for a run's model: the preset of its architecture (:func:`preset_for`), else the
    model id itself when it is the path of a ``config.json``; None when neither."""
    preset = preset_for(model_id)
    if preset is None and Path(model_id).is_file():
        return model_id
    return preset


def _no_model(model_id: str) -> str:
    return (f"no servesim preset for model {model_id!r}; give --model with a preset ('servesim models' lists them) "
            f"or the path of its config.json")


def run_case(run: MeasuredRun, given: Deployment, seed: int = 0, flags: ServerFlags = ServerFlags()) -> ServingCase:
    """The simulation setup of ``run``: the deployment from ``given``, else the file, with ``flags``, else what
    the file says about the server."""
    deployment = given.filled_from(run.deployment)
    flags = flags.filled_from(run.server)
    model_id = _required(deployment, run, "model", "--model")
    preset = model_ref(model_id)
    if preset is None:
        raise ServesimError(f"{run.run_id}: {_no_model(model_id)}")
    rng = np.random.default_rng(seed)
    closed = run.concurrency is not None
    workload = Workload(
        name=run.run_id, prompt_tokens=run.prompt_tokens, output_tokens=run.output_tokens,
        arrival_s=run.arrivals.arrival_times_s(rng, len(run.prompt_tokens)),
        arrival_mode="closed" if closed else "open", concurrency=run.concurrency, seed=seed,
        prefixes=cycled_prompts(run, flags.prompt_cycle) if flags.prompt_cycle else run.prefixes,
    )
    gpu = _required(deployment, run, "gpu", "--gpu")
    engine, _, version = str(_required(deployment, run, "engine", "--engine")).partition("==")
    return ServingCase(
        case_id=run.run_id, model_id=model_id, preset=preset, gpu=gpu, engine=engine, engine_version=version,
        dtype=deployment.dtype or "bf16", tp=deployment.tp or 1, pp=deployment.pp or 1,
        isl=float(run.prompt_tokens.mean()), osl=float(run.output_tokens.mean()), concurrency=run.concurrency,
        workload=workload, measured_ttft_ms=run.measured_ttft_ms, measured_tpot_ms=run.measured_tpot_ms,
        measured_e2e_ms=run.measured_e2e_ms,
        source=run.file_format, max_num_seqs=flags.max_num_seqs,
        max_num_batched_tokens=flags.max_num_batched_tokens, async_scheduling=flags.async_scheduling,
        prefix_caching=flags.prefix_caching,
    )


def result_cases(paths: Sequence[Path], given: Deployment, seed: int = 0,
                 flags: ServerFlags = ServerFlags()) -> tuple[list[ServingCase], list[Skipped]]:
    """Every comparable run of every file as a case, and the runs that are not comparable, with the reason."""
    cases, skipped = [], []
    for path in paths:
        for run in read_result_file(Path(path), seed):
            model = given.model or run.model_id or ""
            unknown = model and model_ref(model) is None
            if run.not_comparable is None and not unknown:
                cases.append(run_case(run, given, seed, flags))
            else:
                skipped.append(Skipped(run.run_id, model, given.gpu or run.deployment.gpu or "",
                                       given.engine or run.deployment.engine or "",
                                       run.not_comparable or _no_model(model)))
    return cases, skipped
