"""The SLO capacity plan: every (GPU, layout) option searched for its capacity, then replicas for the target load,
cost, a ranking among the options that meet the SLOs, and a recommendation in words.

The search itself (servesim/planner/search.py) does not depend on prices, the target or the GPU budget, which
are applied afterwards: changing them never changes a capacity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from servesim.errors import ServesimError
from servesim.estimator.base import DEFAULT_ESTIMATOR
from servesim.estimator.coverage import Coverage
from servesim.hardware.spec import GpuSpec
from servesim.limits import MAX_REPLICAS
from servesim.models.config import ModelConfig
from servesim.models.memory import GIB
from servesim.models.parallel import Parallelism, check_layout, validate_parallelism
from servesim.planner.executor import Executor
from servesim.planner.search import (
    BRACKET_FACTOR,
    MIN_TOLERANCE,
    OptionResult,
    OptionTask,
    Probe,
    search_capacity,
    step_model,
)
from servesim.planner.slo import METRIC_LABELS, Slo, ms
from servesim.planner.step_store import kept_step_times
from servesim.serving.deployment import Deployment, build_deployment, served_kv_cache_dtype
from servesim.serving.engines import Release, parse_engine
from servesim.serving.step_time import StepTimeModel
from servesim.workloads.request import Workload

#: Version of the JSON document ``servesim plan --json`` prints (docs/planner.md); bumped when a key changes
#: meaning or goes away.
SCHEMA_VERSION = 1

#: Fewest requests an open-loop search should simulate (the default -n). The sustained test compares completions
#: with arrivals over the second half of the run; with m requests there it varies by about sqrt(2 / m), and telling
#: SUSTAIN_FRACTION (0.8) from 1 needs that to be a third of the gap or less: m >= 450, so about 1,000 in all.
SAMPLE_REQUESTS = 1000


@dataclass(frozen=True)
class PlanRequest:
    """What to plan: the model, the GPUs and layouts to consider, the traffic, the SLOs and the money."""

    model: ModelConfig
    gpus: tuple[GpuSpec, ...]
    engine: str
    workload: Workload | None  # open loop at 1 request/s, or one client (mode "concurrency"); None: --quick
    slos: tuple[Slo, ...]
    tp: int | None = None  # None: searched (candidate_layouts)
    pp: int | None = None
    ep: int | None = 1  # None: searched, none and over all TP GPUs (MoE models)
    dp: int | None = 1  # None: searched, none and one rank per TP GPU (MoE models)
    dtype: str = "bf16"
    estimator: str = DEFAULT_ESTIMATOR
    engine_overrides: tuple[tuple[str, int | float | str | None], ...] = ()  # build_deployment's settings
    mode: str = "qps"  # qps | concurrency
    target: float | None = None  # requests/s (qps) or clients (concurrency) to serve in total
    tolerance: float = 0.05
    gpu_budget: int | None = None

    def __post_init__(self) -> None:
        if not MIN_TOLERANCE <= self.tolerance <= 1:
            raise ServesimError(f"the search tolerance must be between {MIN_TOLERANCE:g} and 1, not "
                                f"{self.tolerance:g} (0.05: within 5 %)")

    @property
    def kv_cache_dtype(self) -> str:
        """The KV-cache dtype the deployments are served with (:func:`served_kv_cache_dtype`)."""
        requested = dict(self.engine_overrides).get("kv_cache_dtype") or "auto"
        return served_kv_cache_dtype(parse_engine(self.engine)[0], self.dtype, requested)

    @property
    def engine_name(self) -> str:
        """The engine, without the release ``engine`` may name (``vllm==0.12.0``)."""
        return self.engine.partition("==")[0]

    @property
    def release(self) -> Release:
        """The engine release modelled."""
        return parse_engine(self.engine)[1]

    def deployment(self, gpu: GpuSpec, par: Parallelism) -> Deployment:
        return build_deployment(self.model, gpu, par, self.engine, self.dtype, self.estimator,
                                **dict(self.engine_overrides))


@dataclass(frozen=True)
class OptionPlan:
    """One option's search result with replicas and cost applied. Throughputs and cost are at capacity."""

    result: OptionResult
    status: str  # ok | over_budget | too_large | no_fit | slo_unmet
    replicas: int | None = None
    total_gpus: int | None = None
    usd_per_hour: float | None = None  # all replicas
    usd_per_million_output_tokens: float | None = None
    output_tokens_per_s_per_gpu: float | None = None
    rank: int | None = None
    note: str = ""  # why the status, when costing set it (too_large); else the search's note

    @property
    def label(self) -> str:
        return self.result.task.label

    @property
    def capacity_qps(self) -> float | None:
        """Requests/s one replica serves within the SLOs."""
        return self.result.capacity.request_rate_per_s if self.result.capacity else None


@dataclass(frozen=True)
class Plan:
    request: PlanRequest
    options: tuple[OptionPlan, ...]  # ranked options first, then the rest in search order
    explanation: str | None  # why the first option wins; None when nothing meets the SLOs
    infeasible: str | None  # what would make the plan feasible, when no option is

    @property
    def recommended(self) -> OptionPlan | None:
        return self.options[0] if self.options and self.options[0].rank == 1 else None


def candidate_layouts(model: ModelConfig, gpu: GpuSpec, tp: int | None, pp: int | None,
                      ep: int | None = 1, dp: int | None = 1) -> list[Parallelism]:
    """The layouts to try on ``gpu``: the given TP and PP, or for each one left open every divisor of the GPUs in a
    node, keeping TP × PP within a node (so that a node holds whole replicas) and the layouts the engines accept.
    ``ep`` splits the experts of each layout whose TP it divides (1: none); None tries each TP layout of a MoE model
    both without and with its experts over all its TP GPUs. ``dp`` likewise makes attention data-parallel ranks
    (None: none, and one per TP GPU)."""
    node = gpu.gpus_per_node
    if tp is not None:
        check_layout(model, gpu, Parallelism(tp, 1, ep if ep is not None else 1, dp if dp is not None else 1))
    if pp is not None:
        check_layout(model, gpu, Parallelism(tp or 1, pp))
    divisors = [d for d in range(1, node + 1) if node % d == 0]
    layouts = []
    for t in [tp] if tp is not None else divisors:
        for p in [pp] if pp is not None else divisors:
            for e in _splits(model, t, ep):
                for d in _splits(model, t, dp):
                    if t * p <= node and _passes(validate_parallelism, model, Parallelism(t, p, e, d)):
                        layouts.append(Parallelism(t, p, e, d))
    if not layouts:
        for flag, degree, what in (("--ep", ep, "EP"), ("--dp", dp, "DP")):
            if degree in (None, 1):
                continue
            if not model.is_moe:  # the layout check's own refusal of the flag for a dense model
                validate_parallelism(model, Parallelism(degree, **{flag[2:]: degree}))
            working = [d for d in divisors if d > 1 and _degree_fits(model, gpu, tp, pp, flag, d)]
            fix = f"{flag} {' or '.join(map(str, working))}, or {flag} 1" if working else f"{flag} 1"
            raise ServesimError(f"no layout of {model.name} within one {gpu.name} node ({node} GPUs) has a TP that "
                                f"{what}={degree} divides; use {fix}")
    return layouts


def _degree_fits(model: ModelConfig, gpu: GpuSpec, tp: int | None, pp: int | None, flag: str, degree: int) -> bool:
    """Whether some layout of :func:`candidate_layouts` has expert-parallel (``--ep``) or attention data-parallel
    (``--dp``) degree ``degree``, the other degree left at 1."""
    ep, dp = (degree, 1) if flag == "--ep" else (1, degree)
    return bool(candidate_layouts(model, gpu, tp, pp, ep, dp))


def _splits(model: ModelConfig, tp: int, degree: int | None) -> list[int]:
    """The expert-parallel or attention data-parallel degrees tried with ``tp``: ``degree`` itself, or with None, 1
    and (MoE models) ``tp``."""
    if degree is not None:
        return [degree]
    return [1, tp] if model.is_moe and tp > 1 else [1]


def _passes(check: Callable[..., None], *args: object) -> bool:
    """Whether ``check(*args)`` passes, i.e. raises no :class:`ServesimError`."""
    try:
        check(*args)
    except ServesimError:
        return False
    return True


def option_refusal(request: PlanRequest, gpu: GpuSpec, par: Parallelism) -> str | None:
    """Why the engine cannot run the request's model and dtype on ``gpu`` at all (an FP8 model on a GPU without
    FP8 Tensor cores, an architecture the engine has no attention backend for), or None. Other GPUs of the same
    plan may still run it, so such an option is reported as ``unsupported`` rather than stopping the plan."""
    from servesim.kernels.batch import BatchSpec, PrefillChunk
    from servesim.kernels.expand import expand

    try:
        deployment = request.deployment(gpu, par)
        expand(request.engine_name, request.model, gpu, BatchSpec(prefills=(PrefillChunk(1, 0),)), par.tp, par.pp,
               0, deployment.dtype, deployment.kv_cache_dtype, ep=par.ep, dp=par.dp)
    except ServesimError as exc:
        return str(exc)
    return None


def _engine_layouts(request: PlanRequest, layouts: list[Parallelism]) -> list[Parallelism]:
    """The layouts whose expert split the request's engine runs (vLLM: none or over all TP GPUs); raises the
    engine's refusal when it runs none of them."""
    engine = parse_engine(request.engine)[0]
    kept = [par for par in layouts if _passes(engine.check_expert_parallel, par)]
    if layouts and not kept:
        engine.check_expert_parallel(layouts[0])
    return kept


def all_options(request: PlanRequest) -> list[tuple[GpuSpec, Parallelism, str | None]]:
    """Every (GPU, layout) the plan weighs, GPU by GPU, each with :func:`option_refusal`."""
    options = []
    for gpu in request.gpus:
        layouts = _engine_layouts(request, candidate_layouts(request.model, gpu, request.tp, request.pp, request.ep,
                                                             request.dp))
        refusal = option_refusal(request, gpu, layouts[0]) if layouts else None
        options += [(gpu, par, refusal if refusal is None else option_refusal(request, gpu, par))
                    for par in layouts]
    return options


def unsupported_options(request: PlanRequest) -> list[tuple[GpuSpec, Parallelism, str]]:
    """The options of :func:`all_options` the engine cannot run, with the reason."""
    return [(gpu, par, why) for gpu, par, why in all_options(request) if why is not None]


def plan_options(request: PlanRequest) -> list[tuple[GpuSpec, Parallelism]]:
    """Every (GPU, layout) the plan weighs and the engine can run, GPU by GPU; an error when there is none."""
    options = all_options(request)
    if not options:
        raise ServesimError(f"no TP/PP layout of {request.model.name} fits in one node of "
                            f"{', '.join(g.name for g in request.gpus)}; leave --tp/--pp open")
    runnable = [(gpu, par) for gpu, par, why in options if why is None]
    if not runnable:
        raise ServesimError("; ".join(dict.fromkeys(why for _, _, why in options if why is not None)))
    return runnable


def unsupported_payload(gpu: GpuSpec, par: Parallelism, reason: str) -> dict:
    """An option the engine cannot run, as ``servesim plan --json`` lists it: status ``unsupported``, the reason
    in ``note`` and no measurements."""
    return {
        "rank": None, "gpu": gpu.name, "layout": str(par), "tp": par.tp, "pp": par.pp, "ep": par.ep, "dp": par.dp,
        "gpus_per_replica": par.num_gpus,
        "status": "unsupported", "capacity_qps": None, "capacity_concurrency": None, "slo_values_ms": None,
        "binding": None, "replicas": None, "total_gpus": None, "usd_per_gpu_hour": gpu.price_usd_per_gpu_hour,
        "price_date": gpu.price_date, "usd_per_hour": None, "usd_per_million_output_tokens": None,
        "output_tokens_per_s_per_gpu": None, "weights_gib_per_gpu": None, "kv_tokens": None, "unloaded_ms": None,
        "simulations": 0, "note": reason, "sample_warning": None, "launch_command": None, "probes": [],
    }


def option_tasks(request: PlanRequest) -> list[OptionTask]:
    """One search task per (GPU, layout), GPU by GPU."""
    return [
        OptionTask(request.deployment(gpu, par), request.workload, request.slos, request.mode, request.tolerance)
        for gpu, par in plan_options(request)
    ]


def _search_groups(tasks: list[OptionTask], workers: int) -> list[list[int]]:
    """Task indices grouped by GPU, TP, EP and DP, each group searched in one process (:func:`search_options`), the
    likely slowest first so that a pool of workers finishes together. While there are fewer groups than
    ``workers``, the group of most work gives its slowest option a group of its own, so that grouping never leaves
    a worker idle."""
    by_layout: dict[tuple[str, int, int, int], list[int]] = {}
    for i in sorted(range(len(tasks)), key=lambda i: (-_relative_work(tasks[i]), i)):
        by_layout.setdefault((tasks[i].gpu.name, tasks[i].par.tp, tasks[i].par.ep, tasks[i].par.dp), []).append(i)
    groups = list(by_layout.values())

    def work(group: list[int]) -> float:
        return sum(_relative_work(tasks[i]) for i in group)

    while len(groups) < min(workers, len(tasks)):
        largest = max((group for group in groups if len(group) > 1), key=work)
        groups.remove(largest)
        groups += [largest[:1], largest[1:]]
    return sorted(groups, key=lambda group: -work(group))


def _relative_work(task: OptionTask) -> float:
    """How long an option's search likely takes, relative to others: more stages and less TP simulate more, smaller
    steps."""
    return task.par.pp / task.par.tp


def search_options(tasks: Sequence[OptionTask]) -> list[OptionResult]:
    """:func:`search_capacity` of each task in turn. Options of one GPU, TP, EP and DP launch the same kernels in every
    layer and the same attention kernels for many of their batches: their step-time models share those times
    (``StepTimeModel(shares_with=...)``), so the second and later options of a process time only the batches the
    first did not meet, besides their own pipeline stages' times. Each model also starts from the step times earlier
    plans kept for its deployment, and keeps those it added (servesim/planner/step_store.py)."""
    first: dict[tuple, StepTimeModel] = {}
    results = []
    for task in tasks:
        key = task.deployment.layer_identity(), task.deployment.estimator
        steps = step_model(task, shares_with=first.get(key))
        first.setdefault(key, steps)
        with kept_step_times(steps):
            results.append(search_capacity(task, steps))
    return results


def run_plan(request: PlanRequest, executor: Executor, on_done: Callable[[int], None] | None = None,
             tasks: list[OptionTask] | None = None) -> Plan:
    """Search every option on ``executor`` and turn the results into a ranked plan. ``on_done`` is called with the
    number of options searched as each group of them finishes."""
    tasks = option_tasks(request) if tasks is None else tasks
    groups = _search_groups(tasks, executor.workers)
    found = executor.map(search_options, [[tasks[i] for i in group] for group in groups],
                         (lambda g: on_done(len(groups[g]))) if on_done else None)
    results: list[OptionResult] = [None] * len(tasks)  # type: ignore[list-item]
    for group, group_results in zip(groups, found):
        for i, result in zip(group, group_results):
            results[i] = result
    return build_plan(request, results)


def cost_option(result: OptionResult, target: float | None, gpu_budget: int | None) -> OptionPlan:
    """Replicas for the target (one without a target), GPUs, $/h, $ per 1M output tokens and output tokens/s per
    GPU at capacity. An option that needs more than :data:`servesim.limits.MAX_REPLICAS` replicas is ``too_large``:
    no deployment runs that many, and none of its numbers is a plan."""
    if result.status != "ok":
        return OptionPlan(result, result.status, note=result.note)
    task, capacity = result.task, result.capacity
    assert capacity is not None
    per_replica = capacity.load  # requests/s or clients
    replicas = 1 if target is None else max(1, math.ceil(target / per_replica))
    if target is not None and replicas * per_replica < target:  # floating-point rounding of the division
        replicas += 1
    gpus_per_replica = task.par.num_gpus
    if replicas > MAX_REPLICAS:
        unit = "req/s" if task.mode == "qps" else "clients"
        return OptionPlan(
            result, "too_large", replicas=replicas,
            note=(f"the target needs {replicas:,} replicas of {per_replica:,.3g} {unit}, more than the "
                  f"{MAX_REPLICAS:,} servesim plans for; a target up to {MAX_REPLICAS * per_replica:,.4g} {unit} "
                  f"fits"))
    replica_usd_per_hour = task.gpu.price_usd_per_gpu_hour * gpus_per_replica
    tokens_per_s = capacity.output_tokens_per_s
    total_gpus = replicas * gpus_per_replica
    within = gpu_budget is None or total_gpus <= gpu_budget
    return OptionPlan(
        result,
        "ok" if within else "over_budget",
        replicas=replicas,
        total_gpus=total_gpus,
        usd_per_hour=replicas * replica_usd_per_hour,
        usd_per_million_output_tokens=replica_usd_per_hour / (tokens_per_s * 3600) * 1e6 if tokens_per_s else None,
        output_tokens_per_s_per_gpu=tokens_per_s / gpus_per_replica,
    )


def _rank_key(option: OptionPlan, has_target: bool) -> tuple:
    per_token = option.usd_per_million_output_tokens
    per_token = math.inf if per_token is None else per_token
    return ((option.usd_per_hour if has_target else per_token), per_token, option.total_gpus, option.label)


def build_plan(request: PlanRequest, results: list[OptionResult]) -> Plan:
    """Cost, rank and explain searched options (in the order of ``results``)."""
    costed = [cost_option(r, request.target, request.gpu_budget) for r in results]
    has_target = request.target is not None
    ranked = sorted((o for o in costed if o.status == "ok"), key=lambda o: _rank_key(o, has_target))
    ranked = [_with_rank(o, i + 1) for i, o in enumerate(ranked)]
    rest = [o for o in costed if o.status != "ok"]
    options = tuple(ranked + rest)
    if not ranked:
        return Plan(request, options, None, infeasible_reason(request, costed))
    runner_up = ranked[1] if len(ranked) > 1 else None
    return Plan(request, options, explain(request, ranked[0], runner_up), None)


def _with_rank(option: OptionPlan, rank: int) -> OptionPlan:
    return replace(option, rank=rank)


def _load_unit(request: PlanRequest) -> str:
    return "req/s" if request.mode == "qps" else "clients"


def binding_text(request: PlanRequest, option: OptionPlan) -> str:
    """Which constraint gives way first just above the option's capacity, in words."""
    result = option.result
    above, capacity = result.above, result.capacity
    unit = _load_unit(request)
    if result.binding == "none" or above is None or capacity is None:
        return f"no SLO binds up to {capacity.load:,.3g} {unit}, where the search stops" if capacity else ""
    load = f"{capacity.load:,.3g} {unit} per replica"
    if result.binding == "throughput":
        return (f"throughput binds: above {load} the engine falls behind (in the second half of the run requests "
                f"complete {above.completion_ratio:.0%} as often as they arrive)")
    if result.binding == "memory":
        return (f"memory binds: above {load} the KV cache fills (peak {above.peak_kv_occupancy:.0%}, "
                f"{above.preemptions} preemptions) and requests queue for it")
    slo = next(s for s in request.slos if s.metric == result.binding)
    value = above.slo_values_ms[request.slos.index(slo)]
    name = f"{METRIC_LABELS[slo.metric]} p{slo.percentile:g}"
    limit = f"{slo.limit_ms:g} ms"
    reaches = f"exceeds {limit}" if math.isnan(value) else f"reaches {ms(value)} (limit {limit})"
    return f"{METRIC_LABELS[slo.metric]} binds: above {load} {name} {reaches}"


def explain(request: PlanRequest, winner: OptionPlan, runner_up: OptionPlan | None) -> str:
    """One or two sentences: why ``winner`` beats ``runner_up`` and what limits it."""
    assert winner.usd_per_million_output_tokens is not None and winner.output_tokens_per_s_per_gpu is not None
    serve = (f"to serve {request.target:g} {_load_unit(request)}" if request.target is not None
             else "per output token")
    first = (f"{winner.label} is the cheapest option {serve} within {slo_list(request.slos)}: "
             f"{count(winner.replicas, 'replica')} of {count(winner.result.task.par.num_gpus, 'GPU')} at "
             f"${winner.usd_per_hour:,.2f}/h, "
             f"${winner.usd_per_million_output_tokens:,.3f} per 1M output tokens")
    if runner_up is None:
        first += ", the only option that meets the SLOs"
    else:
        assert runner_up.usd_per_million_output_tokens is not None and runner_up.output_tokens_per_s_per_gpu
        cheaper = 1 - winner.usd_per_million_output_tokens / runner_up.usd_per_million_output_tokens
        faster = winner.output_tokens_per_s_per_gpu / runner_up.output_tokens_per_s_per_gpu
        first += (f", {abs(cheaper):.0%} {'cheaper' if cheaper >= 0 else 'dearer'} per token than the next option, "
                  f"{runner_up.label} (${runner_up.usd_per_million_output_tokens:,.3f}), with {faster:.2f}× its "
                  f"output tokens/s per GPU")
    return f"{first}. {_capitalise(binding_text(request, winner))}."


def count(n: int, noun: str) -> str:
    """``1 GPU``, ``4 GPUs``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _capitalise(text: str) -> str:
    return text[:1].upper() + text[1:]


def slo_list(slos: tuple[Slo, ...]) -> str:
    labels = [s.label for s in slos]
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def infeasible_reason(request: PlanRequest, options: list[OptionPlan]) -> str:
    """One line saying why no option is recommended and what would change that."""
    model = f"{request.model.name} ({request.dtype})"
    if all(o.status == "no_fit" for o in options):
        largest = max(options, key=lambda o: o.result.task.par.num_gpus)
        return (f"{model} fits no layout tried (up to {largest.label}: {largest.result.note}). "
                f"{_fitting_suggestion(request)}")
    unmet = [o for o in options if o.status == "slo_unmet"]
    if unmet and not any(o.status in ("over_budget", "too_large") for o in options):
        return _slo_suggestion(request, unmet)
    if not any(o.status == "over_budget" for o in options):
        return _too_large_reason(request, [o for o in options if o.status == "too_large"])
    over = [o for o in options if o.status == "over_budget"]
    fewest = min(over, key=lambda o: (o.total_gpus, o.usd_per_hour))
    return (f"no option meets the target within the budget of {request.gpu_budget} GPUs: the fewest needed are "
            f"{fewest.total_gpus} ({fewest.replicas} × {fewest.label}); raise --gpu-budget to {fewest.total_gpus} "
            f"or lower the target")


def _too_large_reason(request: PlanRequest, large: list[OptionPlan]) -> str:
    """Every option that meets the SLOs needs more than :data:`MAX_REPLICAS` replicas: the largest target that
    fits, rounded down to two significant digits so that it fits for sure."""
    best = max(large, key=lambda o: o.result.capacity.load if o.result.capacity else 0.0)
    assert best.result.capacity is not None
    most = MAX_REPLICAS * best.result.capacity.load
    flag = "--qps" if request.mode == "qps" else "--concurrency"
    if request.mode == "qps":
        scale = 10.0 ** (math.floor(math.log10(most)) - 1)
        fits = f"{math.floor(most / scale) * scale:g}"
    else:
        fits = f"{int(most)}"
    return (f"the target of {request.target:g} {_load_unit(request)} needs {best.replicas:,} replicas even of "
            f"{best.label}, more than the {MAX_REPLICAS:,} servesim plans for; lower {flag} to at most {fits}")


def _slo_suggestion(request: PlanRequest, unmet: list[OptionPlan]) -> str:
    """Tightest unloaded value per SLO over the options: the loosest each SLO must be to be feasible."""
    parts = []
    for i, slo in enumerate(request.slos):
        values = [(o.result.unloaded_ms[i], o.label) for o in unmet if o.result.unloaded_ms is not None]
        if not values:
            continue
        best, label = min(values)
        if best > slo.limit_ms:
            flag = f"--{slo.metric}-p{slo.percentile:g}"
            parts.append(f"{slo.label} is tighter than the unloaded latency of every option (best {ms(best)}, "
                         f"{label}); loosen {flag} to at least {_round_up(best)}")
    if not parts:
        notes = "; ".join(f"{o.label}: {o.result.note}" for o in unmet)
        return f"no option meets {slo_list(request.slos)} ({notes}); loosen the SLOs"
    return "; ".join(parts) + " or pick a faster GPU or layout"


def _round_up(value_ms: float) -> str:
    """``value_ms`` rounded up to two significant digits."""
    scale = 10.0 ** (math.floor(math.log10(value_ms)) - 1)
    return f"{math.ceil(value_ms / scale) * scale:g} ms"


def _fitting_suggestion(request: PlanRequest) -> str:
    """Which catalogue GPU holds the model within one node, with the fewest GPUs."""
    from servesim.hardware import load_catalogue

    model = request.model
    fits = []
    for gpu in load_catalogue().values():
        for par in candidate_layouts(model, gpu, None, 1):
            if request.deployment(gpu, par).memory.fits and option_refusal(request, gpu, par) is None:
                fits.append((par.num_gpus, gpu.memory_gib, gpu.name, str(par)))
                break
    if not fits:
        return "No GPU in the catalogue holds it within one node; use fp8 weights or a smaller model"
    gpus, _, name, layout = min(fits)
    hint = "" if request.dtype.startswith("fp8") else "fp8 weights (--dtype fp8), "
    return (f"Use {hint}more GPUs per replica, or a GPU with more memory: it fits {name} with {layout} "
            f"({count(gpus, 'GPU')})")


def weights_gib_per_gpu(result: OptionResult) -> float:
    return result.estimate.memory.weight_bytes / GIB


def _known(value: float) -> float | None:
    """JSON has no NaN: what a run that stopped early never measured is null."""
    return None if math.isnan(value) else value


def sample_warning(option: OptionPlan, request: PlanRequest) -> str | None:
    """Why the option's capacity may be understated because the open-loop run has fewer than
    :data:`SAMPLE_REQUESTS` requests, with a ``-n`` that avoids it; None when the run is long enough, closed loop,
    or without a capacity. (A run shorter than a few request latencies is no sign on its own: at a capacity bound
    by throughput the latency grows with the run, and 1,000 requests of fixed:512:64 measure the capacity of 5,000
    though they last under three latencies.)"""
    capacity, workload = option.result.capacity, request.workload
    if request.mode != "qps" or capacity is None or workload is None or len(workload) >= SAMPLE_REQUESTS:
        return None
    duration_s = len(workload) / capacity.load
    return (f"{len(workload):,} requests (a run of {duration_s:,.3g} s at capacity) are too few to tell a sustained "
            f"load from noise, so the capacity may be understated; use -n {SAMPLE_REQUESTS} or more")


def probe_payload(probe: Probe, slos: tuple[Slo, ...]) -> dict:
    return {
        "load": probe.load,
        "meets_slos": probe.meets_slos,
        "stopped_by": probe.stopped_by,
        "sustained": probe.sustained,
        "request_rate_per_s": _known(probe.request_rate_per_s),
        "completion_ratio": _known(probe.completion_ratio),
        "output_tokens_per_s": _known(probe.output_tokens_per_s),
        "slo_values_ms": {slo.name: _known(value) for slo, value in zip(slos, probe.slo_values_ms)},
        "latency_ms": {key: _known(value) for key, value in probe.latency_ms.items()},
        "peak_kv_occupancy": probe.peak_kv_occupancy,
        "preemptions": probe.preemptions,
    }


def option_payload(option: OptionPlan, request: PlanRequest) -> dict:
    """One option as ``servesim plan --json`` prints it (docs/planner.md lists every key)."""
    result, task = option.result, option.result.task
    capacity = result.capacity
    slos = request.slos
    return {
        "rank": option.rank,
        "gpu": task.gpu.name,
        "layout": str(task.par),
        "tp": task.par.tp,
        "pp": task.par.pp,
        "ep": task.par.ep,
        "dp": task.par.dp,
        "gpus_per_replica": task.par.num_gpus,
        "status": option.status,
        "capacity_qps": option.capacity_qps,
        "capacity_concurrency": int(capacity.load) if capacity and request.mode == "concurrency" else None,
        "slo_values_ms": ({slo.name: v for slo, v in zip(slos, capacity.slo_values_ms)} if capacity else None),
        "binding": result.binding,
        "replicas": option.replicas,
        "total_gpus": option.total_gpus,
        "usd_per_gpu_hour": task.gpu.price_usd_per_gpu_hour,
        "price_date": task.gpu.price_date,
        "usd_per_hour": option.usd_per_hour,
        "usd_per_million_output_tokens": option.usd_per_million_output_tokens,
        "output_tokens_per_s_per_gpu": option.output_tokens_per_s_per_gpu,
        "weights_gib_per_gpu": weights_gib_per_gpu(result),
        "kv_tokens": result.estimate.kv_tokens,
        "unloaded_ms": ({slo.name: v for slo, v in zip(slos, result.unloaded_ms)}
                        if result.unloaded_ms is not None else None),
        "simulations": len(result.probes) + (result.unloaded_ms is not None),
        "note": option.note or result.note or None,
        "sample_warning": sample_warning(option, request),
        "launch_command": task.deployment.launch_command(),
        "probes": [probe_payload(p, slos) for p in result.probes],
    }


def plan_payload(plan: Plan, estimator_label: str, coverages: Sequence[Coverage] = ()) -> dict:
    """The whole plan as ``servesim plan --json`` prints it (docs/planner.md lists every key); ``coverages``: how
    each planned GPU stands on the estimator's measured GPUs
    (:func:`servesim.estimator.coverage.estimator_coverage`)."""
    request = plan.request
    workload = request.workload
    recommended = plan.recommended
    return {
        "schema_version": SCHEMA_VERSION,
        "model": request.model.name,
        "dtype": request.dtype,
        "kv_cache_dtype": request.kv_cache_dtype,
        "engine": request.engine,
        "engine_release": request.release.label,
        "estimator": request.estimator,
        "estimator_label": estimator_label,
        "estimator_coverage": [c.to_json() for c in coverages],
        "workload": {
            "name": workload.name,
            "requests": len(workload),
            "arrival": workload.arrival_process,
            "seed": workload.seed,
            "mean_prompt_tokens": float(workload.prompt_tokens.mean()),
            "mean_output_tokens": float(workload.output_tokens.mean()),
        },
        "search": {"variable": request.mode, "tolerance": request.tolerance, "bracket_factor": BRACKET_FACTOR},
        "target": {"qps": request.target if request.mode == "qps" else None,
                   "concurrency": request.target if request.mode == "concurrency" else None},
        "slos": [{"name": s.name, "metric": s.metric, "percentile": s.percentile, "limit_ms": s.limit_ms}
                 for s in request.slos],
        "gpu_budget": request.gpu_budget,
        "recommendation": ({"gpu": recommended.result.task.gpu.name, "layout": str(recommended.result.task.par),
                            "explanation": plan.explanation,
                            "launch_command": recommended.result.task.deployment.launch_command()}
                           if recommended else None),
        "infeasible": plan.infeasible,
        "options": [option_payload(o, request) for o in plan.options]
                   + [unsupported_payload(gpu, par, why) for gpu, par, why in unsupported_options(request)],
    }
