"""The discrete-event serving simulator: requests arrive, a router hands them to replicas, each replica's engine
scheduler forms steps, the step-time model times them, and finished steps emit tokens.

Events are arrivals and step completions, processed in time order; replicas form their next steps once every
event of the instant is in (so a step that ends as a request arrives already sees it, and a burst is one batch).
A replica has ``pp`` pipeline stages and keeps up to ``pp`` micro-batches in flight: a new one is formed as soon
as fewer are in flight, from the requests not already in the pipeline (a request needs its previous token before
its next step). A micro-batch first takes the host overhead (the CPU is
shared by the micro-batches, one after the other), then passes the stages in turn, waiting for each stage to be
free. With ``pp = 1`` a step therefore lasts ``StepTime.latency_us``, and with many micro-batches the pipeline
issues one per bottleneck stage time. Stretches where a replica only relaunches the same decode micro-batches are
run in one go (servesim/serving/fast_forward.py), with the same results; one vLLM or SGLang replica
runs the whole loop compiled (servesim/serving/compiled_loop.py), again with the same results.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

import numpy as np

from servesim.errors import ServesimError
from servesim.models.config import check_context
from servesim.serving import compiled_loop
from servesim.serving.deployment import Deployment
from servesim.serving.fast_forward import RelaunchBatch, fast_forward
from servesim.serving.metrics import TOKEN_TIMES_MAX_TOKENS, SimulationResult, StepRecord
from servesim.serving.router import make_router
from servesim.serving.scheduler import Scheduler
from servesim.serving.state import RequestLog, RequestState, Step, StepLog, finish_step
from servesim.serving.scheduler_dp import ranked_step_time_us
from servesim.serving.step_time import StepTimeModel
from servesim.serving.stop import StopRule, StoppedEarly, ViolationCounter
from servesim.workloads.request import Workload

class _Replica:
    """One engine instance (a TP×PP group): its scheduler, its pipeline and the steps in flight."""

    def __init__(self, index: int, scheduler: Scheduler, step_model: StepTimeModel, async_scheduling: bool) -> None:
        self.index = index
        self.scheduler = scheduler
        self.step_model = step_model
        self.pp = step_model.par.pp
        self.flights: list[tuple[float, Step]] = []  # (end time, step) of micro-batches in flight, in order
        self.relaunching: dict[Step, RelaunchBatch] = {}  # the decode steps the last fast-forward left in flight
        self.cpu_free_s = 0.0
        self.stage_free_s = [0.0] * self.pp
        self.async_scheduling = async_scheduling  # only with one stage (build_deployment checks)
        self.gpu_start_s = 0.0  # when the last step began on the GPU
        self.front_end_free_s = 0.0  # when the API server finishes the requests it has

    def front_end(self, sent_s: float, prompt_tokens: int) -> float:
        """When a request sent at ``sent_s`` reaches the engine: the API server handles requests one at a time,
        and the way between client and engine adds its latency whatever the load."""
        overhead = self.step_model.overhead
        start_s = sent_s if sent_s > self.front_end_free_s else self.front_end_free_s
        self.front_end_free_s = start_s + overhead.front_end_us(prompt_tokens) * 1e-6
        return self.front_end_free_s + overhead.request_latency_us * 1e-6

    def occupy(self, now_s: float, overhead_us: float, stages_us: tuple[float, ...]) -> tuple[float, float]:
        """Run a micro-batch formed at ``now_s``: the host's overhead once it is free, then each stage once it is
        free. Returns its start and end."""
        start_s = now_s if now_s > self.cpu_free_s else self.cpu_free_s
        t_s = self.cpu_free_s = start_s + overhead_us * 1e-6
        free_s = self.stage_free_s
        for stage, stage_us in enumerate(stages_us):  # conditionals, not max(): this runs for every launch
            t_s = free_s[stage] = (t_s if t_s > free_s[stage] else free_s[stage]) + stage_us * 1e-6
        return start_s, t_s

    def occupy_async(self, now_s: float, host_start_s: float, overhead_us: float,
                     stage_us: float) -> tuple[float, float]:
        """Run a step whose host work began at ``host_start_s`` (async scheduling, one stage): the GPU starts it
        once the host is done and the GPU is free, at ``now_s`` at the earliest. Returns its GPU start and end."""
        ready_s = self.cpu_free_s = host_start_s + overhead_us * 1e-6
        start_s = now_s if now_s > ready_s else ready_s
        if self.stage_free_s[0] > start_s:
            start_s = self.stage_free_s[0]
        self.gpu_start_s = start_s
        end_s = self.stage_free_s[0] = start_s + stage_us * 1e-6
        return start_s, end_s

    def host_start_s(self, now_s: float) -> float:
        """When the host begins scheduling a step launched at ``now_s`` under async scheduling: while the step
        before it runs on the GPU when the two follow back to back (the host schedules step n+1 as step n starts),
        else at ``now_s``; never before the host is free."""
        earliest_s = self.gpu_start_s if self.stage_free_s[0] >= now_s else now_s
        return earliest_s if earliest_s > self.cpu_free_s else self.cpu_free_s

    def _schedule(self, now_s: float) -> tuple[Step | None, float]:
        """The next step and, under async scheduling, when the host began scheduling it. Requests that arrived
        after that wait for a later step, unless nothing else would run: then the host schedules them at once."""
        if not self.async_scheduling:
            return self.scheduler.schedule(), now_s
        host_start_s = self.host_start_s(now_s)
        self.scheduler.admit_before_s = host_start_s
        step = self.scheduler.schedule()
        if step is None and host_start_s < now_s and self.scheduler.waiting:
            host_start_s = now_s if now_s > self.cpu_free_s else self.cpu_free_s
            self.scheduler.admit_before_s = math.inf
            step = self.scheduler.schedule()
        return step, host_start_s

    def launch(self, now_s: float, log: StepLog) -> list[tuple[float, Step]]:
        """Form and time micro-batches while the pipeline has room; returns (end time, step) of each."""
        launched = []
        while len(self.flights) < self.pp:
            step, host_start_s = self._schedule(now_s)
            if step is None:
                break
            for req in step.admitted:  # the scheduler marked the step's requests in flight
                if req.first_scheduled_s < 0:
                    req.first_scheduled_s = now_s
            overhead_us, stages_us = ranked_step_time_us(self.step_model, step)
            if self.async_scheduling:
                start_s, end_s = self.occupy_async(now_s, host_start_s, overhead_us, stages_us[0])
            else:
                start_s, end_s = self.occupy(now_s, overhead_us, stages_us)
            self.flights.append((end_s, step))
            launched.append((end_s, step))
            prefill_tokens = sum(p.new_tokens for p in step.prefills)
            log.append((self.index, start_s, end_s, len(step.requests), prefill_tokens + step.num_decodes,
                        prefill_tokens, step.num_decodes, self.scheduler.kv_used_tokens))
        return launched

    def complete(self, step: Step) -> bool:
        """Take ``step`` out of the pipeline; False when a fast-forward replaced it (a stale event)."""
        if not self.flights or self.flights[0][1] is not step:
            return False
        del self.flights[0]
        return True


def _check_fits(scheduler: Scheduler, workload: Workload) -> None:
    total = workload.prompt_tokens + workload.output_tokens
    too_long = int((total > scheduler.request_capacity_tokens).sum())
    if too_long:
        raise ServesimError(
            f"{too_long} request(s) need more KV cache than the replica has ({scheduler.request_capacity_tokens:,} "
            f"tokens{' a rank' if scheduler.request_capacity_tokens < scheduler.kv_capacity_tokens else ''}; "
            f"longest request {int(total.max()):,}); cap lengths in the workload (servesim workload SOURCE "
            f"--max-prompt-tokens N --max-output-tokens N --out FILE, adding --qps R or --concurrency C for a generated "
            f"workload), raise the memory fraction or use more GPUs per replica (--tp/--pp)"
        )


def simulate(
    deployment: Deployment,
    workload: Workload,
    step_model: StepTimeModel | None = None,
    replicas: int = 1,
    router: str = "round_robin",
    seed: int = 0,
    fast_forward_decodes: bool = True,
    stop_rules: Sequence[StopRule] = (),
    token_times: bool | None = None,
    progress: Callable[[int], None] | None = None,
) -> SimulationResult:
    """Serve ``workload`` with ``replicas`` copies of ``deployment`` behind ``router``. A deployment with attention
    data parallelism is ``par.dp`` engine ranks stepping together, each with its own scheduler and KV cache
    (servesim/serving/scheduler_dp.py); the router picks the replica, the engine the rank.

    Pass the same ``step_model`` (one of this deployment, or of one that differs only in engine settings that
    leave step times alone) to many calls, as a capacity search does: its memo of step times carries over.
    ``seed`` drives the random router; everything else is deterministic. ``fast_forward_decodes=False`` takes
    every engine step through the Python scheduler, which is slower and gives the same result; otherwise one vLLM
    or SGLang replica runs the compiled loop (servesim/serving/compiled_loop.py) and several replicas or
    attention data-parallel ranks the Python loop with decode stretches fast-forwarded. With ``stop_rules`` the
    run raises :class:`servesim.serving.stop.StoppedEarly` as soon as one of them is known to break.

    ``token_times`` keeps every output token's time in the result (``token_times_s``, ``itl_s``,
    ``request_itl_ms``); None keeps them when the workload has at most
    :data:`~servesim.serving.metrics.TOKEN_TIMES_MAX_TOKENS` output tokens. Without them the result counts the
    inter-token gaps instead, which gives the same ITL statistics (:class:`~servesim.serving.metrics.GapCounts`)
    in memory that does not grow with the tokens. ``progress`` is called with the number of requests finished
    so far, about every 1 % of the workload.
    """
    if replicas < 1:
        raise ServesimError(f"replicas must be at least 1 (got {replicas})")
    model, gpu, par, cfg = deployment.model, deployment.gpu, deployment.par, deployment.settings
    check_context(model, workload.prompt_tokens + workload.output_tokens)
    if step_model is None:
        step_model = StepTimeModel(deployment)
    elif step_model.deployment.timing_identity() != deployment.timing_identity():
        raise ServesimError(f"the step-time model times {step_model.deployment.label()} but the engine serves "
                            f"{deployment.label()} (another model, GPU, layout, engine, dtype or KV cache); build "
                            f"the step-time model from the same deployment")
    if not deployment.memory.fits:
        raise ServesimError(
            f"{model.name} does not fit {gpu.name} with {par} under {cfg.engine} (memory fraction "
            f"{cfg.memory_fraction}); use more GPUs per replica (--tp/--pp), a larger GPU or a larger memory "
            f"fraction"
        )
    fleet = [_Replica(i, deployment.make_scheduler(), step_model, cfg.async_scheduling) for i in range(replicas)]
    _check_fits(fleet[0].scheduler, workload)
    if token_times is None:
        token_times = int(workload.output_tokens.sum()) <= TOKEN_TIMES_MAX_TOKENS
    requests = RequestLog(workload.output_tokens, token_times, cfg.stream_interval)
    prefix_identity = workload.prefixes is not None and fleet[0].scheduler.cache is not None
    steps = StepLog()
    try:
        if fast_forward_decodes and compiled_loop.eligible(fleet, workload):
            compiled_loop.run(fleet[0], workload, requests, steps, tuple(stop_rules), progress, prefix_identity)
        else:
            _run(fleet, workload, requests, steps, make_router(router, seed), fast_forward_decodes,
                 ViolationCounter(stop_rules) if stop_rules else None, progress)
    except StoppedEarly as stop:
        kv_used_tokens = steps.column("kv_used_tokens")
        stop.peak_kv_occupancy = float(kv_used_tokens.max(initial=0)) / fleet[0].scheduler.kv_capacity_tokens
        raise
    info = {
        "model": model.name, "gpu": gpu.name, "tp": par.tp, "pp": par.pp, "engine": cfg.engine,
        "engine_version": cfg.version, "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "max_num_seqs": cfg.max_num_seqs, "memory_fraction": cfg.memory_fraction,
        "kv_cache_dtype": cfg.kv_cache_dtype, "prefix_caching": cfg.enable_prefix_caching,
        "async_scheduling": cfg.async_scheduling, "mxfp4_moe_backend": deployment.mxfp4_moe_backend,
        "moe_backend": deployment.moe_backend, "stream_interval": cfg.stream_interval,
        "kv_tokens_per_replica": fleet[0].scheduler.kv_capacity_tokens, "replicas": replicas,
        "dp": par.dp, "router": router,
        "workload": workload.name, "arrival_mode": workload.arrival_mode, "concurrency": workload.concurrency,
    }
    return _result(workload, requests, steps, fleet[0].scheduler.kv_capacity_tokens, info)


def _run(fleet: Sequence[_Replica], workload: Workload, requests: RequestLog, log: StepLog, route,
         fast_forward_decodes: bool, violations: ViolationCounter | None,
         progress: Callable[[int], None] | None) -> None:
    """The event loop. Records every request in ``requests`` as it finishes and every step in ``log``; a
    :class:`StoppedEarly` it raises carries the preemptions so far.

    Arrivals and step completions wait in two heaps; at equal times arrivals come first, and events of one kind
    in the order they were made. A completion whose step a fast-forward replaced is skipped. With API-server costs
    or latency (``HostOverhead.front_end_us``, ``request_latency_us``) a request arrives twice: sent by its client,
    then handed to its replica's engine once the API server is done with it and the latency has passed. The workload's own sends, in time order, join the arrival heap
    one at a time (the next one whenever one leaves it), so that the heap holds what is due soon rather than every
    request of the run; only requests in the system have a :class:`RequestState`.
    """
    n = len(workload)
    prompt_tokens, output_tokens, arrivals_s = workload.prompt_tokens, workload.output_tokens, workload.arrival_s
    prefixes = workload.prefixes if fleet[0].scheduler.cache is not None else None
    states: dict[int, RequestState] = {}  # requests sent and not yet finished
    closed = workload.arrival_mode == "closed"
    issued = min(workload.concurrency, n) if closed else n
    sends = issued  # the workload's sends at its own times: requests 0 .. sends - 1, tie-breaker = request id
    # (time, tie-breaker, request, replica): a client's send (replica -1), or the request reaching that replica's
    # engine from its API server.
    arrivals = [(float(arrivals_s[0]), 0, 0, -1)] if sends else []
    front_end = fleet[0].step_model.overhead.has_front_end
    completions: list[tuple[float, int, _Replica, Step]] = []
    seq = issued  # tie-breaker: events of one time and kind in the order they were made
    report_every = max(1, n // 100)
    report_at = min(report_every, n)  # progress is reported once this many requests finished, and at the last

    def horizon_s(replica: _Replica) -> float:
        """When something outside ``replica`` happens next."""
        if len(fleet) == 1:
            return arrivals[0][0] if arrivals else math.inf
        others = [event[0] for event in completions if event[2] is not replica]
        return min(arrivals[0][0] if arrivals else math.inf, min(others, default=math.inf))

    def push(replica: _Replica, launched: list[tuple[float, Step]]) -> None:
        nonlocal seq
        for end_s, step in launched:
            heapq.heappush(completions, (end_s, seq, replica, step))
            seq += 1

    ready: list[_Replica] = []  # replicas with something new, launched once every event of this instant is in
    try:
        while arrivals or completions:
            if arrivals and (not completions or arrivals[0][0] <= completions[0][0]):
                now_s, tie, rid, at = heapq.heappop(arrivals)
                if at < 0:
                    if tie + 1 < sends:  # one of the workload's sends (tie-breaker = id): the next takes its place
                        heapq.heappush(arrivals, (float(arrivals_s[tie + 1]), tie + 1, tie + 1, -1))
                    prompt = int(prompt_tokens[rid])
                    req = states[rid] = RequestState(rid, prompt, int(output_tokens[rid]), now_s)
                    if prefixes is not None:
                        req.segment_ids, req.segment_tokens = prefixes.segments(rid)
                        req.output_id = int(prefixes.output_ids[rid])
                    replica = fleet[route([r.scheduler.outstanding() for r in fleet])]
                    requests.replica[rid] = replica.index
                    if front_end:  # it reaches the engine later
                        heapq.heappush(arrivals, (replica.front_end(now_s, prompt), seq, rid, replica.index))
                        seq += 1
                        replica = None
                else:
                    req, replica = states[rid], fleet[at]
                    req.reached_s = now_s
                if replica is not None:
                    replica.scheduler.add(req)
                    if replica not in ready:
                        ready.append(replica)
            else:
                now_s, _, replica, step = heapq.heappop(completions)
                if replica.complete(step):
                    finished = finish_step(step, now_s)
                    if prefixes is not None:
                        replica.scheduler.step_done(step)
                    if violations:
                        violations.step_done(step, finished, now_s)
                    for req in finished:
                        replica.scheduler.release(req)
                        requests.finish(req)
                        del states[req.rid]
                        if closed and issued < n:
                            heapq.heappush(arrivals, (max(now_s, float(arrivals_s[issued])), seq, issued, -1))
                            seq += 1
                            issued += 1
                    if progress is not None and requests.finished >= report_at:
                        progress(requests.finished)
                        report_at = min(requests.finished + report_every, n)
                    if replica not in ready:
                        ready.append(replica)
            next_s = min(arrivals[0][0] if arrivals else math.inf, completions[0][0] if completions else math.inf)
            if next_s > now_s:
                for replica in ready:
                    push(replica, replica.launch(now_s, log))
                if fast_forward_decodes:  # once every replica's launches of this instant bound the others' runs
                    for replica in ready:
                        push(replica, fast_forward(replica, horizon_s(replica), log))
                ready.clear()
    except StoppedEarly as stop:
        stop.preemptions = int(requests.preemptions.sum()) + sum(state.preemptions for state in states.values())
        raise


def _result(workload: Workload, requests: RequestLog, log: StepLog, kv_capacity: int,
            info: dict) -> SimulationResult:
    replica = log.column("replica")
    # Replica by replica, each in launch order; launch order already is that with one replica.
    order = None if (np.diff(replica) >= 0).all() else np.argsort(replica, kind="stable")

    def column(name: str) -> np.ndarray:
        return log.column(name) if order is None else log.column(name)[order]

    steps = StepRecord(
        replica=column("replica"),
        start_s=column("start_s"),
        end_s=column("end_s"),
        num_requests=column("num_requests"),
        num_tokens=column("num_tokens"),
        prefill_tokens=column("prefill_tokens"),
        num_decodes=column("num_decodes"),
        kv_used_tokens=column("kv_used_tokens"),
        kv_capacity_tokens=kv_capacity,
    )
    return SimulationResult(
        issue_s=requests.issue_s,
        prompt_tokens=workload.prompt_tokens,
        output_tokens=workload.output_tokens,
        replica=requests.replica,
        first_scheduled_s=requests.first_scheduled_s,
        first_token_s=requests.first_token_s,
        finish_s=requests.finish_s,
        preemptions=requests.preemptions,
        cached_tokens=requests.cached_tokens,
        token_offsets=requests.token_offsets,
        token_times_s=requests.token_times_s,
        steps=steps,
        info=info,
        itl_counts=None if requests.gaps is None else requests.gaps.counts(),
        stream_interval=requests.stream_interval,
    )
