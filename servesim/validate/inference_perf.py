"""inference-perf report folders (kubernetes-sigs/inference-perf): one measured run per load stage.

inference-perf writes its resolved configuration (``config.yaml``) beside one ``stage_<i>_lifecycle_metrics.json``
per load stage. What the replay takes from them, as inference-perf v0.4.0 (2026-02-06) generates and measures:

- **Prompts** (``data.type: shared_prefix``, ``inference_perf/datagen/shared_prefix_datagen.py``):
  ``num_groups × num_prompts_per_group`` distinct prompts, each its group's random system prompt, a space, then
  its own random question. The prompts are shuffled once and stage request ``k`` sends prompt ``k mod count``
  (each stage draws from a fresh generator, so it starts the cycle again). Random token ids are decoded to text
  and the server tokenises that text again, which changes the count; the report's ``prompt_len`` is the client's
  count with the model's tokenizer, so the replay scales both parts to that mean. ``max_tokens`` is
  ``output_len``; with ``server.ignore_eos`` every request generates exactly that many tokens.
- **Arrivals** (``inference_perf/loadgen/load_timer.py``): a stage sends ``int(rate × duration)`` requests;
  ``load.type: constant`` draws exponential gaps and scales them to add up to the duration, ``poisson`` draws
  them at ``rate``. A stage starts once the previous one's requests have all finished, so stages are replayed
  apart.
- **Measured**: the mean TTFT and E2E of the stage's successful requests. inference-perf's own
  ``time_per_output_token`` divides by the number of streamed events, not tokens (in the public runs of
  inference-sim/training there are two events per generated token), so the per-token time compared is
  ``(E2E − TTFT) / (output_len − 1)`` of the means, which with equal output lengths is the mean over requests of
  vLLM's TPOT.

The serving side is not in the report. A harness's ``exp-config.yaml`` one folder up (the layout of
inference-sim's published runs: ``model``, ``tensor_parallelism``, ``max_num_batched_tokens``,
``max_num_seqs``) is read when present; the command line overrides it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servesim.errors import ServesimError
from servesim.validate.results import Deployment, MeasuredRun, ServerFlags, _Doc, _int_or_none, _read_json
from servesim.workloads.arrivals import ArrivalProcess, Poisson
from servesim.workloads.generators import SharedPrefix
from servesim.workloads.lengths import Fixed
from servesim.workloads.prefix import PromptSegments

CONFIG_FILE = "config.yaml"
HARNESS_FILE = "exp-config.yaml"
_METRICS_FILE = re.compile(r"^(stage_\d+|summary)_lifecycle_metrics\.json$")


def is_report(path: Path) -> bool:
    """Whether ``path`` is an inference-perf report folder or one of its lifecycle-metrics files."""
    return path.is_dir() or bool(_METRICS_FILE.match(path.name))


@dataclass(frozen=True)
class ScaledExponential:
    """inference-perf's ``constant`` load: ``n`` exponential gaps at ``rate_per_s``, scaled to add up to
    ``duration_s`` (so the stage ends on time whatever the draw)."""

    rate_per_s: float
    duration_s: float

    def arrival_times_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        gaps = rng.exponential(1.0 / self.rate_per_s, n)
        return np.cumsum(gaps * (self.duration_s / gaps.sum())) if n else np.zeros(0)


def _read_yaml(path: Path, what: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ServesimError(f"{path}: no such file; give an inference-perf report folder (it holds {CONFIG_FILE} "
                            f"and stage_<i>_lifecycle_metrics.json)") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ServesimError(f"{path}: not valid YAML ({str(exc).splitlines()[0]}); is this {what}?") from None


def _harness(folder: Path) -> tuple[Deployment, ServerFlags]:
    """The deployment and server flags of a harness's ``exp-config.yaml`` beside the report folder, if any."""
    path = folder.parent / HARNESS_FILE
    if not path.is_file():
        return Deployment(), ServerFlags()
    doc = _Doc(path, _read_yaml(path, "a harness's server config"), "server config")
    number = lambda key: _int_or_none(doc, doc.get(key, default=None), key)  # noqa: E731
    return (Deployment(model=doc.get("model", default=None), tp=number("tensor_parallelism")),
            ServerFlags(max_num_seqs=number("max_num_seqs"), max_num_batched_tokens=number("max_num_batched_tokens")))


@dataclass(frozen=True)
class SharedPrefixData:
    """The ``shared_prefix`` section of an inference-perf config."""

    groups: int
    prompts_per_group: int
    system_tokens: int
    question_tokens: int
    output_tokens: int

    @classmethod
    def read(cls, doc: _Doc) -> SharedPrefixData:
        kind = doc.get("data", "type")
        if kind != "shared_prefix":
            raise ServesimError(f"{doc.path}: data type {kind!r} is not replayable; shared_prefix is (its prompts "
                                f"say which text repeats)")
        section = doc.get("data", "shared_prefix")
        for key in ("question_distribution", "output_distribution"):
            if doc.get(key, default=None, node=section):
                raise ServesimError(f"{doc.path}: data.shared_prefix.{key} is not replayable; fixed question_len "
                                    f"and output_len are")
        whole = lambda key: int(doc.number(key, node=section))  # noqa: E731
        return cls(whole("num_groups"), whole("num_prompts_per_group"), whole("system_prompt_len"),
                   whole("question_len"), whole("output_len"))

    def prompts(self, rng: np.random.Generator, n: int, mean_prompt_tokens: float) -> PromptSegments:
        """Segments of a stage's ``n`` requests: the shuffled prompts in turn, both parts scaled so that a prompt
        has ``mean_prompt_tokens`` tokens."""
        distinct = self.groups * self.prompts_per_group
        total = max(2, round(mean_prompt_tokens))
        system = min(total - 1, max(1, round(self.system_tokens * total / (self.system_tokens + self.question_tokens))))
        generator = SharedPrefix(self.groups, self.prompts_per_group, Fixed(system), Fixed(total - system),
                                 Fixed(self.output_tokens))
        prompt = rng.permutation(distinct)[np.arange(n) % distinct]
        return generator.segments(prompt, np.full(self.groups, system), np.full(distinct, total - system))


def _arrivals(doc: _Doc, kind: str, rate: float, duration: float) -> ArrivalProcess:
    if kind == "constant":
        return ScaledExponential(rate, duration)
    if kind == "poisson":
        return Poisson(rate)
    raise ServesimError(f"{doc.path}: load type {kind!r} is not replayable; constant and poisson are")


def _stage_run(folder: Path, index: int, stage: Any, config: _Doc, data: SharedPrefixData, seed_rng,
               deployment: Deployment, server: ServerFlags, name: str) -> MeasuredRun:
    rate = config.number("rate", node=stage)
    duration = config.number("duration", node=stage)
    kind = config.get("load", "type")
    run_id = f"{name}#{index} {kind}@{rate:g}"
    path = folder / f"stage_{index}_lifecycle_metrics.json"
    doc = _Doc(path, _read_json(path), "inference-perf stage report")
    successes = doc.get("successes")
    count = int(doc.get("count", node=successes))
    failed = int(doc.get("failures", "count", default=0) or 0)
    sent = int(rate * duration)
    output = data.output_tokens
    if count:
        latency = doc.get("latency", node=successes)
        ttft_ms = doc.number("time_to_first_token", "mean", node=latency) * 1e3
        e2e_ms = doc.number("request_latency", "mean", node=latency) * 1e3
        mean_prompt = doc.number("prompt_len", "mean", node=successes)
    else:
        ttft_ms = e2e_ms = float("nan")
        mean_prompt = data.system_tokens + data.question_tokens
    if not count:
        reason = "no request succeeded"
    elif failed:
        reason = (f"{failed} of {failed + count} requests failed (the server could not keep up); the means cover "
                  f"only the successes")
    elif not config.get("server", "ignore_eos", default=False):
        reason = "sent without ignore_eos, so the generated lengths are not recorded"
    elif output < 2:
        reason = "output_len below 2 has no time per output token"
    else:
        reason = None
    return measured_stage(run_id, data, _arrivals(config, kind, rate, duration), sent, ttft_ms, e2e_ms, mean_prompt,
                          np.random.default_rng(seed_rng.integers(2**63)), deployment, server, reason)


def measured_stage(run_id: str, data: SharedPrefixData, arrivals: ArrivalProcess, sent: int, ttft_ms: float,
                   e2e_ms: float, mean_prompt: float, rng: np.random.Generator, deployment: Deployment,
                   server: ServerFlags, not_comparable: str | None = None) -> MeasuredRun:
    """One load stage of ``data``'s prompts as a measured run: ``sent`` requests at ``arrivals`` whose prompts
    average ``mean_prompt`` tokens (``rng`` shuffles them), and the stage's mean TTFT and E2E."""
    output = data.output_tokens
    return MeasuredRun(
        run_id=run_id, file_format="inference-perf", model_id=deployment.model,
        prompt_tokens=np.full(sent, max(2, round(mean_prompt))), output_tokens=np.full(sent, output),
        concurrency=None, arrivals=arrivals,
        measured_ttft_ms=ttft_ms, measured_tpot_ms=(e2e_ms - ttft_ms) / max(1, output - 1), deployment=deployment,
        measured_e2e_ms=e2e_ms, prefixes=data.prompts(rng, sent, mean_prompt), server=server,
        not_comparable=not_comparable,
    )


def read_inference_perf(path: Path, seed: int = 0) -> list[MeasuredRun]:
    """One run per load stage of the inference-perf report at ``path`` (its folder or one of its metrics files).
    ``seed`` draws the prompt order and arrival gaps, which the report does not record."""
    folder = path if path.is_dir() else path.parent
    config = _Doc(folder / CONFIG_FILE, _read_yaml(folder / CONFIG_FILE, "an inference-perf config"),
                  "inference-perf config")
    if not config.get("api", "streaming", default=False):
        raise ServesimError(f"{config.path}: api.streaming is off, so the report has no time to first token; "
                            f"replay a streamed run")
    data = SharedPrefixData.read(config)
    harness, server = _harness(folder)
    engine = config.get("server", "type", default=None)
    deployment = Deployment(model=harness.model or config.get("server", "model_name", default=None), tp=harness.tp,
                            engine=engine if engine in ("vllm", "sglang") else None)
    stages = config.get("load", "stages")
    if not isinstance(stages, list) or not stages:
        raise ServesimError(f"{config.path}: load.stages must be a non-empty list of rate and duration")
    name = folder.parent.name if folder.name == "results" else folder.name
    seeds = np.random.default_rng(seed)
    return [_stage_run(folder, i, stage, config, data, seeds, deployment, server, name)
            for i, stage in enumerate(stages)]
