"""The Python front door: :func:`plan`, :func:`plan_payload`, :func:`simulate` and :func:`deployment`, re-exported
from :mod:`servesim`.

Each function takes names where the command line takes them (model presets, config.json paths or Hugging Face ids;
GPU names or aliases) or the objects they resolve to, and returns the library's own result objects. They build the
same requests as ``servesim plan`` and ``servesim simulate`` from the same library pieces, so a script and the
command line predict alike. Heavy modules are imported inside the functions, so ``import servesim`` stays light.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from servesim.errors import ServesimError

if TYPE_CHECKING:
    from servesim.hardware.spec import GpuSpec
    from servesim.models.config import ModelConfig
    from servesim.planner.plan import Plan
    from servesim.planner.slo import Slo
    from servesim.serving.deployment import Deployment
    from servesim.serving.metrics import SimulationResult
    from servesim.workloads.request import Workload

_SLO_KEY = re.compile(r"(ttft|tpot|e2e)_p(\d+(?:\.\d+)?)")


def _model(model: str | ModelConfig) -> ModelConfig:
    from servesim.models import get_model

    return get_model(model) if isinstance(model, str) else model


def _gpu(gpu: str | GpuSpec) -> GpuSpec:
    from servesim.hardware import get_gpu

    return get_gpu(gpu) if isinstance(gpu, str) else gpu


def _gpus(gpus: str | GpuSpec | Iterable[str | GpuSpec]) -> list[GpuSpec]:
    """``"H100,L40S"``, ``"all"``, a list of names or GpuSpecs -> GpuSpecs."""
    from servesim.hardware import parse_gpu_list

    if isinstance(gpus, str):
        return list(parse_gpu_list(gpus))
    if not isinstance(gpus, Iterable):
        return [gpus]
    return [spec for gpu in gpus for spec in (parse_gpu_list(gpu) if isinstance(gpu, str) else [gpu])]


def _priced(gpus: list[GpuSpec], prices: str | Mapping[str, float] | None) -> list[GpuSpec]:
    """Prices from a CSV file (as ``--prices``) or ``{gpu: usd_per_gpu_hour}`` (as ``--price GPU=USD``)."""
    from datetime import date

    from servesim.hardware import apply_prices, get_gpu, load_prices
    from servesim.hardware.catalogue import parse_price

    if prices is None:
        return gpus
    if isinstance(prices, str):
        return apply_prices(gpus, load_prices(prices), f"user price file {prices}")
    today = str(date.today())
    table = {get_gpu(name).name: (parse_price(str(usd), f"price of {name}"), today) for name, usd in prices.items()}
    return apply_prices(gpus, table, "prices given to servesim.plan")


def _slos(slos: Mapping[str, float] | Iterable[Slo] | None) -> tuple[Slo, ...]:
    """``{"ttft_p90": 2000, "tpot_p99": 100}`` (milliseconds) or Slo objects; None: the default SLOs."""
    from servesim.planner.slo import slos_from_limits

    if slos is None:
        return slos_from_limits({})
    if not isinstance(slos, Mapping):
        return tuple(slos)
    limits: dict[tuple[str, float], float | None] = {}
    for key, limit in slos.items():
        match = _SLO_KEY.fullmatch(key)
        if not match:
            raise ServesimError(f"cannot read SLO {key!r}; write METRIC_pPERCENTILE, e.g. ttft_p90, tpot_p99, e2e_p50")
        limits[(match[1], float(match[2]))] = limit
    return slos_from_limits(limits)


def plan(
    model: str | ModelConfig,
    gpus: str | GpuSpec | Iterable[str | GpuSpec] = "H100",
    *,
    tp: int | None = None,
    pp: int | None = None,
    ep: int | None = 1,
    engine: str = "vllm",
    dtype: str = "bf16",
    workload: str | Workload = "splitwise-conv",
    num_requests: int | None = None,
    arrival: str | None = None,
    seed: int = 0,
    qps: float | None = None,
    concurrency: int | None = None,
    slos: Mapping[str, float] | Iterable[Slo] | None = None,
    prices: str | Mapping[str, float] | None = None,
    gpu_budget: int | None = None,
    tolerance: float = 0.05,
    estimator: str = "mlp",
    jobs: int | None = None,
    **settings: Any,
) -> Plan:
    """Search, per GPU and TP/PP layout, the highest load one replica serves within the SLOs; then replicas for
    the target load, GPUs, $/h and $ per 1M output tokens, ranked by cost, with a recommendation — what
    ``servesim plan`` prints.

    ``model``: a preset name, config.json path, Hugging Face id or ModelConfig. ``gpus``: ``"H100,L40S"``,
    ``"all"``, or a list of names or GpuSpecs. ``tp``/``pp``: fixed, or None to try every layout within a node.
    ``ep``: the GPUs of each layout's TP group a MoE model's experts are split over (1: none), or None to try each
    layout without and with its experts over all its TP GPUs.
    ``engine``: ``vllm``, ``sglang`` or a release such as ``vllm==0.12.0``. ``workload``: a profile, generator
    preset (``chat-shared-prefix``), length spec or trace path (see :func:`servesim.workloads.build_workload`),
    with ``num_requests`` requests per load and ``arrival`` ``poisson`` (default) or ``trace``; a Workload object
    is used as given (open loop at 1 request/s, or one client when ``concurrency`` is set). ``qps`` (open loop)
    or ``concurrency`` (closed loop): the total load to serve, or neither for one replica per option. ``slos``:
    ``{"ttft_p90": 2000, "tpot_p90": 100}`` in milliseconds (these are the defaults). ``prices``: a CSV path or
    ``{gpu: usd_per_gpu_hour}`` overriding the catalogue. ``estimator``: ``mlp`` or ``roofline`` and the other
    baselines. ``jobs``: parallel processes (default: the CPU count). ``settings``: engine settings of
    :func:`servesim.build_deployment` (``max_num_seqs``, ``enable_prefix_caching`` ...).

    Returns the planner's :class:`servesim.planner.plan.Plan`: ``plan.recommended`` (None when nothing meets the
    SLOs, then ``plan.infeasible`` says why), ``plan.explanation`` and every option in ``plan.options``;
    :func:`plan_payload` gives the dict of ``servesim plan --json``.

    >>> p = servesim.plan("llama3-8b", "H100,L40S", tp=1, pp=1, qps=10, estimator="roofline")
    >>> p.recommended.result.task.deployment.launch_command()
    """
    from servesim.cli.plan import _base_workload
    from servesim.models.config import check_context
    from servesim.planner.executor import make_executor
    from servesim.planner.plan import PlanRequest, run_plan

    if qps is not None and concurrency is not None:
        raise ServesimError("give a target as qps (open loop) or concurrency (closed loop), not both")
    mode = "concurrency" if concurrency is not None else "qps"
    model = _model(model)
    if isinstance(workload, str):
        workload = _base_workload(workload, num_requests, arrival, seed, mode)
    request = PlanRequest(
        model=model,
        gpus=tuple(_priced(_gpus(gpus), prices)),
        engine=engine,
        workload=workload,
        slos=_slos(slos),
        tp=tp,
        pp=pp,
        ep=ep,
        dtype=dtype,
        estimator=estimator,
        engine_overrides=tuple(settings.items()),
        mode=mode,
        target=qps if mode == "qps" else concurrency,
        tolerance=tolerance,
        gpu_budget=gpu_budget,
    )
    check_context(model, workload.prompt_tokens + workload.output_tokens)
    executor = make_executor("local", jobs)
    try:
        return run_plan(request, executor)
    finally:
        executor.close()


def plan_payload(plan: Plan) -> dict:
    """The dict ``servesim plan --json`` prints for ``plan`` (docs/planner.md lists every key):
    ``payload["recommendation"]["launch_command"]``, ``payload["options"]`` with capacity, replicas and cost..."""
    from servesim.estimator import get_estimator
    from servesim.estimator.coverage import estimator_coverage, launched_by
    from servesim.planner.plan import plan_payload as payload

    request = plan.request
    estimator = get_estimator(request.estimator)
    coverages = estimator_coverage(estimator, request.gpus, request.dtype,
                                   launched_by(request.engine_name, request.model, request.dtype))
    return payload(plan, estimator.label, coverages)


def deployment(
    model: str | ModelConfig,
    gpu: str | GpuSpec = "H100",
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    engine: str = "vllm",
    dtype: str = "bf16",
    estimator: str = "mlp",
    **settings: Any,
) -> Deployment:
    """:func:`servesim.build_deployment` with names: ``model`` and ``gpu`` as names or objects, the layout as
    ``tp``, ``pp`` and ``ep`` (experts split over that many of the TP GPUs). ``settings``: ``max_num_seqs``, ``max_num_batched_tokens``, ``memory_fraction``,
    ``kv_cache_dtype``, ``enable_prefix_caching``, ``async_scheduling`` (None keeps the release's default).

    >>> dep = servesim.deployment("llama3-8b", "H100", enable_prefix_caching=False)
    >>> dep.memory.kv_tokens, dep.launch_command()
    """
    from servesim.models.parallel import Parallelism
    from servesim.serving.deployment import build_deployment

    return build_deployment(_model(model), _gpu(gpu), Parallelism(tp, pp, ep), engine, dtype, estimator, **settings)


def simulate(
    model: str | ModelConfig | Deployment,
    gpu: str | GpuSpec = "H100",
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    engine: str = "vllm",
    dtype: str = "bf16",
    estimator: str = "mlp",
    workload: str | Workload = "splitwise-conv",
    qps: float | None = None,
    concurrency: int | None = None,
    num_requests: int | None = None,
    arrival: str | None = None,
    seed: int = 0,
    replicas: int = 1,
    router: str = "round_robin",
    token_times: bool | None = None,
    **settings: Any,
) -> SimulationResult:
    """Serve a workload and return the per-request and per-step record — what ``servesim simulate`` prints.

    ``model`` with ``gpu``, ``tp``, ``pp``, ``ep``, ``engine``, ``dtype``, ``estimator`` and ``settings`` describe the
    deployment as in :func:`deployment`; or pass a built Deployment as ``model`` (and none of those).
    ``workload``: a profile, preset, length spec or trace path (:func:`servesim.workloads.build_workload`, with
    ``num_requests``, ``qps`` or ``concurrency``, ``arrival`` and ``seed``) or a Workload object. ``replicas``
    engine copies behind ``router`` (``round_robin``, ``least_outstanding``, ``random``). ``token_times`` keeps
    every token's time (``result.request_itl_ms``); None keeps them for runs of up to 4 million output tokens
    (:func:`servesim.serving.simulator.simulate`).

    Returns :class:`servesim.serving.metrics.SimulationResult`: ``result.summary()`` has ``ttft_p90_ms``,
    ``tpot_p99_ms``, throughputs, ``prefix_cache_hit_ratio`` ...; ``result.requests`` is a DataFrame per request.

    >>> result = servesim.simulate("llama3-8b", "H100", workload="chat-shared-prefix", qps=4, num_requests=200)
    >>> result.summary()["ttft_p90_ms"]
    """
    from servesim.serving.deployment import Deployment
    from servesim.serving.simulator import simulate as run
    from servesim.workloads import build_workload

    if isinstance(model, Deployment):
        given = {name for name, value, default in (("gpu", gpu, "H100"), ("tp", tp, 1), ("pp", pp, 1), ("ep", ep, 1),
                                                   ("engine", engine, "vllm"), ("dtype", dtype, "bf16"),
                                                   ("estimator", estimator, "mlp")) if value != default}
        if given or settings:
            raise ServesimError(f"a Deployment already fixes {', '.join(sorted(given | set(settings)))}; build "
                                f"another deployment to change them")
        dep = model
    else:
        dep = deployment(model, gpu, tp=tp, pp=pp, ep=ep, engine=engine, dtype=dtype, estimator=estimator, **settings)
    if isinstance(workload, str):
        workload = build_workload(workload, num_requests, qps=qps, concurrency=concurrency, seed=seed,
                                  arrival=arrival)
    return run(dep, workload, replicas=replicas, router=router, seed=seed, token_times=token_times)
