"""The capacity of one option (a GPU, a layout, an engine): the highest load whose SLO percentiles hold.

The load is an arrival rate (requests/s, open loop) or a number of clients (closed loop). The search simulates the
same requests at every load — common random numbers: one seeded workload whose arrival times are divided by the rate
— so that latency grows smoothly with load and the search is stable. It brackets the capacity starting one step
below the quick analytical estimate (multiplying or dividing the load by :data:`BRACKET_FACTOR` until the SLOs flip;
closed loop, never above the workload's number of requests), then splits the bracket until it is within the relative
tolerance. A load passes when every SLO percentile is within its limit and, open loop, the engine keeps up with the
arrivals (:func:`completion_ratio`). When the first load fails, a run of one request at a time tells an SLO tighter
than the unloaded latency. One :class:`StepTimeModel` serves every simulation of the option, so step times predicted
at one load are reused at the next. A run ends as soon as enough requests are over an SLO limit for its percentile
to fail (servesim/serving/stop.py); such a probe knows which SLO broke but not the final percentiles. Only
bracketing runs stop early: they are the furthest from the capacity, and the splits' percentiles steer the next
split.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from servesim.estimator import get_estimator
from servesim.hardware.spec import GpuSpec
from servesim.models.config import ModelConfig
from servesim.models.parallel import Parallelism
from servesim.planner.estimate import GpuEstimate, estimate_gpu
from servesim.planner.slo import METRIC_LABELS, Slo, measure, meets, ms, ratios, worst
from servesim.serving.deployment import Deployment
from servesim.serving.metrics import SimulationResult
from servesim.serving.simulator import simulate
from servesim.serving.step_time import StepTimeModel
from servesim.serving.stop import StopRule, StoppedEarly, violations_to_fail
from servesim.workloads.request import Workload

SEARCH_MODES = ("qps", "concurrency")
#: Bracketing multiplies or divides the load by this until the SLOs flip.
BRACKET_FACTOR = 1.5
#: A split stays at least this fraction of the bracket (in log load) away from either end.
SPLIT_MARGIN = 0.1
#: The finest search tolerance: a bracket split much finer would reach the resolution of a float, where a split
#: lands on an end and the search never closes.
MIN_TOLERANCE = 1e-4
#: Bracketing gives up after this many steps either way (2^12 = 4096 times the start).
MAX_BRACKET_STEPS = 12
#: Requests of the unloaded run (one at a time), which tells an SLO tighter than the unloaded latency.
UNLOADED_REQUESTS = 100
#: An open-loop load counts as sustained when, over the second half of the arrival window, requests complete at
#: least this fraction as often as they arrive. Past the engine's throughput the backlog grows and the fraction
#: drops towards throughput / load; a finite run can otherwise meet latency percentiles at such a load when its
#: requests are few enough to be served as one burst. It needs the run to last longer than about twice a
#: request's latency; shorter runs understate the capacity.
SUSTAIN_FRACTION = 0.8
#: KV occupancy from which the cache counts as full when naming the binding constraint.
KV_FULL = 0.97
#: Latency percentiles kept per simulated load (for reports and latency-vs-load plots).
LATENCY_KEYS = tuple(f"{m}_p{p}_ms" for m in ("ttft", "tpot", "e2e") for p in (50, 90, 99))


@dataclass(frozen=True)
class OptionTask:
    """Everything one option's search needs; picklable, so a process or a Ray worker can run it."""

    deployment: Deployment
    workload: Workload  # open loop: arrivals at 1 request/s; closed loop: concurrency 1
    slos: tuple[Slo, ...]
    mode: str = "qps"  # qps | concurrency
    tolerance: float = 0.05  # relative width of the final bracket

    @property
    def model(self) -> ModelConfig:
        return self.deployment.model

    @property
    def gpu(self) -> GpuSpec:
        return self.deployment.gpu

    @property
    def par(self) -> Parallelism:
        return self.deployment.par

    @property
    def label(self) -> str:
        return f"{self.gpu.name} {self.par}"


@dataclass(frozen=True)
class Probe:
    """One simulated load: whether every SLO held, the SLO percentiles and what the engine did.

    A run that stopped early (``stopped_by``: the SLO known to fail) has NaN for every percentile, the
    completion ratio and the throughput, and the peak KV occupancy and preemptions up to the stop."""

    load: float  # requests/s offered (open loop) or clients (closed loop)
    meets_slos: bool  # every SLO percentile within its limit, and (open loop) the load sustained
    sustained: bool  # open loop: completion_ratio >= SUSTAIN_FRACTION; closed loop, or stopped early: True
    slo_values_ms: tuple[float, ...]  # in the order of the task's SLOs
    latency_ms: dict[str, float]  # LATENCY_KEYS
    request_rate_per_s: float  # the offered rate (open loop) or the measured one (closed loop)
    completion_ratio: float  # requests completed / arrived in the second half of the arrival window (open loop)
    output_tokens_per_s: float
    peak_kv_occupancy: float
    preemptions: int
    stopped_by: str | None = None  # the name of the SLO whose failure ended the run early


@dataclass(frozen=True)
class OptionResult:
    """The outcome of one option's search. ``status``: ``ok`` (a capacity was found), ``no_fit`` (memory) or
    ``slo_unmet`` (the SLOs fail even at the lowest load)."""

    task: OptionTask
    status: str
    estimate: GpuEstimate
    probes: tuple[Probe, ...] = ()  # sorted by load
    capacity: Probe | None = None  # the highest load that met the SLOs
    above: Probe | None = None  # the lowest load that did not
    unloaded_ms: tuple[float, ...] | None = None  # SLO percentiles one request at a time (when measured)
    binding: str | None = None  # ttft | tpot | e2e | memory | throughput | none (see binding_constraint)
    note: str = ""


def shortfall(estimate: GpuEstimate, dtype: str) -> str:
    """:meth:`GpuEstimate.shortfall` without advice the deployment already follows (FP8 when it runs ``dtype``
    FP8)."""
    text = estimate.shortfall()
    return text.replace(" or use FP8", "") if dtype.startswith("fp8") else text


def at_load(workload: Workload, mode: str, load: float) -> Workload:
    """The task's workload at ``load``: arrival times divided by the rate, or ``load`` clients."""
    if mode == "qps":
        return dataclasses.replace(workload, arrival_s=workload.arrival_s / load)
    return dataclasses.replace(workload, concurrency=int(load))


def unloaded_workload(workload: Workload) -> Workload:
    """The first :data:`UNLOADED_REQUESTS` requests, one at a time."""
    n = min(len(workload), UNLOADED_REQUESTS)
    prefixes = None if workload.prefixes is None else workload.prefixes.take(np.arange(n))
    return Workload(workload.name, workload.prompt_tokens[:n], workload.output_tokens[:n], workload.arrival_s[:n] * 0,
                    arrival_mode="closed", concurrency=1, seed=workload.seed, arrival_process="burst",
                    prefixes=prefixes)


def stop_rules(slos: tuple[Slo, ...], workload: Workload) -> tuple[StopRule, ...]:
    """A rule per SLO that ends a run once its percentile is known to fail (TPOT counts requests of two or more
    output tokens, as the percentile does)."""
    rules = []
    for slo in slos:
        values = int((workload.output_tokens > 1).sum()) if slo.metric == "tpot" else len(workload)
        if values:
            rules.append(StopRule(slo.name, slo.metric, slo.limit_ms, violations_to_fail(values, slo.percentile)))
    return tuple(rules)


def _probe(task: OptionTask, steps: StepTimeModel, workload: Workload, load: float, stop_early: bool = True) -> Probe:
    nan = float("nan")
    try:
        result = simulate(task.deployment, workload, step_model=steps,
                          stop_rules=stop_rules(task.slos, workload) if stop_early else ())
    except StoppedEarly as stop:
        return Probe(load=load, meets_slos=False, sustained=True, slo_values_ms=(nan,) * len(task.slos),
                     latency_ms=dict.fromkeys(LATENCY_KEYS, nan), request_rate_per_s=nan, completion_ratio=nan,
                     output_tokens_per_s=nan, peak_kv_occupancy=stop.peak_kv_occupancy,
                     preemptions=stop.preemptions, stopped_by=stop.rule.name)
    summary = result.summary()
    values = measure(result, task.slos)
    open_loop = workload.arrival_mode == "open"
    ratio = completion_ratio(result) if open_loop else 1.0
    sustained = ratio >= SUSTAIN_FRACTION
    return Probe(
        load=load,
        meets_slos=sustained and meets(values, task.slos),
        sustained=sustained,
        slo_values_ms=values,
        latency_ms={key: summary[key] for key in LATENCY_KEYS},
        request_rate_per_s=load if open_loop else summary["request_throughput_per_s"],
        completion_ratio=ratio,
        output_tokens_per_s=(load * float(workload.output_tokens.mean()) if open_loop
                             else summary["output_throughput_tok_per_s"]),
        peak_kv_occupancy=summary["peak_kv_occupancy"],
        preemptions=summary["preemptions"],
    )


def completion_ratio(result: SimulationResult) -> float:
    """Requests completed over requests arrived during the second half of the arrival window (1 when every
    request arrives at once, which leaves no window)."""
    last_arrival_s = float(result.issue_s.max())
    if last_arrival_s <= 0:
        return 1.0
    half_s = last_arrival_s / 2
    arrived = int((result.issue_s >= half_s).sum())
    completed = int(((result.finish_s >= half_s) & (result.finish_s <= last_arrival_s)).sum())
    return completed / arrived


def binding_constraint(above: Probe, slos: tuple[Slo, ...]) -> str:
    """What gives way first just above capacity: the SLO furthest over its limit, or ``memory`` when that SLO is
    a waiting time (TTFT, E2E) and the KV cache was full (requests queue for memory, not for compute), or
    ``throughput`` when every SLO held but the engine fell behind the arrivals."""
    if above.stopped_by is None and meets(above.slo_values_ms, slos):
        return "throughput"
    metric = failing_metric(above, slos)
    kv_full = above.preemptions > 0 or above.peak_kv_occupancy >= KV_FULL
    return "memory" if kv_full and metric in ("ttft", "e2e") else metric


def failing_metric(probe: Probe, slos: tuple[Slo, ...]) -> str:
    """The metric of the SLO that ended the probe's run, or else of the one furthest over its limit."""
    if probe.stopped_by is not None:
        return next(slo.metric for slo in slos if slo.name == probe.stopped_by)
    return worst(probe.slo_values_ms, slos).metric


def start_load(estimate: GpuEstimate, mode: str) -> float:
    """The bracket's first load: one bracketing step below the quick estimate's steady-state rate, or a quarter of
    the batch the KV cache holds (closed loop). The steady-state rate ignores the SLOs, so the capacity is nearly
    always below it (at 0.5 to 1 times it for llama3-70b on H100, H200, H20 and A100), and a first load that
    meets the SLOs needs neither the unloaded run nor a second step down. Lowering it further by simple models of
    the SLOs (M/D/1 queueing against a TTFT limit, the batch a TPOT limit allows) did not save simulations:
    prefill interference and queueing at the SLO percentiles, which set the capacity, are what those models
    miss."""
    if mode == "qps":
        return estimate.output_tokens_per_s / estimate.output_len / BRACKET_FACTOR
    return float(max(1, estimate.loaded_batch // 4))


class _Bracket:
    """Where to probe next: bracketing steps, then splits of the bracket ``[low, high]`` (low met the SLOs, high
    did not) until it is within the tolerance, over a continuous rate or a whole number of clients.

    A split goes to a target load (:func:`_crossing_load`: where the worst SLO ratio crosses 1), kept inside the
    middle of the bracket, or to the bracket's geometric midpoint when there is no target; a split next to an end
    is moved one tolerance away from it, so that one more probe can close the bracket.
    """

    def __init__(self, integer: bool, tolerance: float, most: float = math.inf) -> None:
        self.integer = integer
        self.tolerance = tolerance
        self.most = most  # every load above this one simulates the same as it

    def grow(self, load: float) -> float:
        return min(float(math.ceil(load * BRACKET_FACTOR)) if self.integer else load * BRACKET_FACTOR, self.most)

    def shrink(self, load: float) -> float:
        return float(max(1, math.floor(load / BRACKET_FACTOR))) if self.integer else load / BRACKET_FACTOR

    def converged(self, low: float, high: float) -> bool:
        if self.integer:
            return high - low <= max(1.0, math.floor(self.tolerance * low))
        return high <= low * (1 + self.tolerance)

    def split(self, low: float, high: float, target: float | None) -> float:
        span = math.log(high / low)
        t = 0.5 if target is None else min(max(math.log(target / low) / span, SPLIT_MARGIN), 1 - SPLIT_MARGIN)
        step = math.log1p(self.tolerance)
        offset = min(max(t * span, step), span - step) if span > 2 * step else span / 2
        load = low * math.exp(offset)
        if self.integer:
            load = float(min(max(round(load), int(low) + 1), int(high) - 1))
        return load


def _crossing_load(probes: dict[float, Probe], low: float, high: float, slos: tuple[Slo, ...]) -> float | None:
    """Where the worst SLO ratio (percentile / limit), taken as log-linear in the load, reaches 1: between the
    bracket's ends (regula falsi), or, when the high end has no percentiles (its run stopped early) or failed for
    throughput alone, extrapolated from the two highest loads that met the SLOs (the secant). None when the two
    points do not rise towards 1. A crossing beyond ``high`` is given as ``high`` (the split keeps inside the
    bracket anyway): a ratio that barely rises would put it too far for a float."""
    below = _ratio(probes[low], slos)
    above = _ratio(probes[high], slos)
    if above > 1:
        points = ((low, below), (high, above))
    else:
        ratios = ((load, _ratio(p, slos)) for load, p in probes.items() if load < low)
        known = [(load, ratio) for load, ratio in ratios if math.isfinite(ratio)]
        if not known:
            return None
        points = (max(known), (low, below))
    (load_a, ratio_a), (load_b, ratio_b) = points
    if not 0 < ratio_a < ratio_b:
        return None
    slope = math.log(ratio_b / ratio_a) / math.log(load_b / load_a)
    return load_a * math.exp(min(-math.log(ratio_a) / slope, math.log(high / load_a)))


def step_model(task: OptionTask, shares_with: StepTimeModel | None = None) -> StepTimeModel:
    """The step-time model of the task's option, sharing the per-layer times of ``shares_with`` (an option of the
    same GPU and TP under the same plan) when given."""
    estimator = get_estimator(task.deployment.estimator) if shares_with is None else shares_with.estimator
    return StepTimeModel(task.deployment, estimator, shares_with=shares_with)


def search_capacity(task: OptionTask, steps: StepTimeModel | None = None) -> OptionResult:
    """Find the option's capacity under the task's SLOs (see the module docstring), timing steps with ``steps``
    (by default the task's own :func:`step_model`)."""
    steps = steps or step_model(task)
    estimator = steps.estimator
    mean_prompt = float(task.workload.prompt_tokens.mean())
    mean_output = float(task.workload.output_tokens.mean())
    estimate = estimate_gpu(task.deployment, estimator, max(1, round(mean_prompt)), max(1, round(mean_output)),
                            step_model=steps)

    def finish(status: str, **fields) -> OptionResult:
        return OptionResult(task, status, estimate, **fields)

    if not estimate.fits:
        return finish("no_fit", binding="memory", note=shortfall(estimate, task.deployment.dtype))
    longest = int((task.workload.prompt_tokens + task.workload.output_tokens).max())
    if longest > estimate.memory.kv_tokens:
        return finish("no_fit", binding="memory",
                      note=f"the KV cache holds {estimate.memory.kv_tokens:,} tokens, less than the longest request "
                           f"({longest:,}); use more GPUs per replica or cap lengths in the workload")
    probes: dict[float, Probe] = {}

    def probe(load: float, stop_early: bool = True) -> Probe:
        if load not in probes:
            probes[load] = _probe(task, steps, at_load(task.workload, task.mode, load), load, stop_early)
        return probes[load]

    closed = task.mode == "concurrency"
    # Clients beyond the workload's requests change nothing: every request is in flight at once.
    search = _Bracket(closed, task.tolerance, float(len(task.workload)) if closed else math.inf)
    load = min(start_load(estimate, task.mode), search.most)
    first = probe(load)
    unloaded = None
    if not first.meets_slos:
        unloaded = _probe(task, steps, unloaded_workload(task.workload), 1.0, stop_early=False)
        if not unloaded.meets_slos:
            return finish("slo_unmet", probes=_sorted(probes), unloaded_ms=unloaded.slo_values_ms,
                          binding=worst(unloaded.slo_values_ms, task.slos).metric,
                          note=_unmet_note(task, unloaded.slo_values_ms))
    low, high = (load, None) if first.meets_slos else (None, load)
    for _ in range(MAX_BRACKET_STEPS):
        if low is not None and (high is not None or low == search.most):
            break
        load = search.grow(load) if high is None else search.shrink(load)
        if probe(load).meets_slos:
            low = load
        else:
            high = load
    if low is None:
        lowest = min(probes)
        return finish("slo_unmet", probes=_sorted(probes),
                      unloaded_ms=unloaded.slo_values_ms if unloaded else None,
                      binding=failing_metric(probes[lowest], task.slos),
                      note=f"the SLOs fail even at {_load_text(task.mode, lowest)}")
    if high is None:
        where = (f"with all {len(task.workload):,} requests in flight at once; give more requests (-n) to find the "
                 "capacity" if low == search.most else f"at {_load_text(task.mode, low)}, where the search stops")
        return finish("ok", probes=_sorted(probes), capacity=probes[low], binding="none",
                      note=f"the SLOs still hold {where}")
    widths = [math.log(high / low)]
    while not search.converged(low, high):
        # Interpolation unless the last two splits left the bracket more than half as wide in log load (then the
        # geometric midpoint, which halves it): about twice as many splits as bisection at worst, usually fewer.
        interpolate = len(widths) < 3 or widths[-1] <= 0.5 * widths[-3] + 1e-12
        load = search.split(low, high, _crossing_load(probes, low, high, task.slos) if interpolate else None)
        if probe(load, stop_early=False).meets_slos:  # percentiles above the limit steer the next split
            low = load
        else:
            high = load
        widths.append(math.log(high / low))
    above = probes[high]
    return finish("ok", probes=_sorted(probes), capacity=probes[low], above=above,
                  unloaded_ms=unloaded.slo_values_ms if unloaded else None,
                  binding=binding_constraint(above, task.slos))


def _ratio(probe: Probe, slos: tuple[Slo, ...]) -> float:
    """The worst SLO percentile relative to its limit (above 1: violated)."""
    return max(ratios(probe.slo_values_ms, slos))


def _sorted(probes: dict[float, Probe]) -> tuple[Probe, ...]:
    return tuple(probes[load] for load in sorted(probes))


def _load_text(mode: str, load: float) -> str:
    return f"{load:,.3g} requests/s" if mode == "qps" else f"concurrency {int(load)}"


def _unmet_note(task: OptionTask, unloaded_ms: tuple[float, ...]) -> str:
    failing = [f"{METRIC_LABELS[slo.metric]} p{slo.percentile:g} is {ms(value)} unloaded (SLO {slo.limit_ms:g} ms)"
               for slo, value in zip(task.slos, unloaded_ms) if value > slo.limit_ms]
    return "; ".join(failing)
