"""PNG plots of a plan: latency percentiles against load for each option, and the cost-vs-TPOT Pareto front.

matplotlib is an optional dependency (``pip install 'servesim[plots]'``), imported only here.
"""

from __future__ import annotations

import re
from pathlib import Path

from servesim.errors import ServesimError
from servesim.planner.plan import OptionPlan, Plan
from servesim.planner.slo import METRIC_LABELS, METRICS


def require_matplotlib():
    """matplotlib's pyplot on a file-only backend, or a one-line error saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise ServesimError("--plot needs matplotlib, which is not installed: pip install 'servesim[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _file_stem(option: OptionPlan) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "_", f"{option.result.task.gpu.name}_{option.result.task.par}")


def _latency_figure(plt, plan: Plan, option: OptionPlan, path: Path) -> None:
    request, result = plan.request, option.result
    unit = "requests/s" if request.mode == "qps" else "clients"
    measured = [p for p in result.probes if p.stopped_by is None]  # runs that stopped early have no percentiles
    loads = [p.load for p in measured]
    fig, axes = plt.subplots(1, len(METRICS), figsize=(13, 3.8))
    for ax, metric in zip(axes, METRICS):
        for percentile, style in ((50, ":"), (90, "--"), (99, "-")):
            ax.plot(loads, [p.latency_ms[f"{metric}_p{percentile}_ms"] for p in measured], style, marker="o",
                    markersize=3, label=f"p{percentile}")
        for slo in request.slos:
            if slo.metric == metric:
                ax.axhline(slo.limit_ms, color="red", linewidth=1, label=f"SLO p{slo.percentile:g}")
        if result.capacity is not None:
            ax.axvline(result.capacity.load, color="green", linewidth=1, label="capacity")
        ax.set_xlabel(f"load ({unit} per replica)")
        ax.set_ylabel(f"{METRIC_LABELS[metric]} (ms)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{request.model.name} on {option.label}, {request.engine}: latency vs load")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def pareto_points(plan: Plan) -> list[tuple[float, float, str]]:
    """(TPOT percentile ms, $ per 1M output tokens, option) for every simulated load that met the SLOs, taking the
    plan's TPOT SLO percentile (p90 without one); cost at a load is one replica's price over its output."""
    tpot = next((s for s in plan.request.slos if s.metric == "tpot"), None)
    key = f"tpot_p{tpot.percentile:g}_ms" if tpot and tpot.percentile in (50, 90, 99) else "tpot_p90_ms"
    points = []
    for option in plan.options:
        task = option.result.task
        usd_per_hour = task.gpu.price_usd_per_gpu_hour * task.par.num_gpus
        for probe in option.result.probes:
            if probe.meets_slos and probe.output_tokens_per_s > 0:
                points.append((probe.latency_ms[key], usd_per_hour / (probe.output_tokens_per_s * 3600) * 1e6,
                               option.label))
    return points


def pareto_front(points: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The points no other point beats on both TPOT and cost, by increasing TPOT."""
    front, best_cost = [], float("inf")
    for point in sorted(points):
        if point[1] < best_cost:
            front.append(point)
            best_cost = point[1]
    return front


def _pareto_figure(plt, plan: Plan, path: Path) -> None:
    points = pareto_points(plan)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for label in dict.fromkeys(p[2] for p in points):
        mine = [p for p in points if p[2] == label]
        ax.scatter([p[0] for p in mine], [p[1] for p in mine], s=14, label=label)
    front = pareto_front(points)
    ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="black", linewidth=1,
            label="Pareto front")
    previous = None
    for tpot_ms, cost, label in front:
        if label != previous:  # name each option once, where it enters the front
            ax.annotate(label, (tpot_ms, cost), fontsize=7, xytext=(3, 3), textcoords="offset points")
        previous = label
    ax.set_xlabel("TPOT (ms) at the load")
    ax.set_ylabel("$ per 1M output tokens")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"{plan.request.model.name}: cost vs TPOT at loads that meet the SLOs")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_plots(plan: Plan, directory: Path) -> list[Path]:
    """Write ``latency_<gpu>_<layout>.png`` for each searched option and ``pareto_cost_vs_tpot.png``."""
    plt = require_matplotlib()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ServesimError(f"cannot create the plot folder {directory}: {exc.strerror}") from None
    written = []
    for option in plan.options:
        if option.result.probes:
            path = directory / f"latency_{_file_stem(option)}.png"
            _latency_figure(plt, plan, option, path)
            written.append(path)
    path = directory / "pareto_cost_vs_tpot.png"
    _pareto_figure(plt, plan, path)
    written.append(path)
    return written
