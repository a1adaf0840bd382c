"""Fitting the host-overhead constants (``servesim.serving.overhead``) to measured serving runs.

In a closed-loop replay with one pipeline stage of an engine that schedules synchronously, every event falls on a
step boundary (a client sends its next request when a step delivers the last token of its previous one), so the
sequence of batches does not depend on how long the steps take. A request's TTFT is then the sum of the durations
of the steps from its sending to its first token, and its TPOT the sum over its decode span divided by
``output − 1``: both are linear in the per-step overhead ``step_us + per_seq_us × batch size``. One simulation
with both terms at zero therefore gives every row's mean TTFT and TPOT as a linear function of the two constants
(:func:`overhead_sensitivity`), and the fit is a non-negative least squares of the relative errors of TTFT and TPOT
over the training rows of one engine (:func:`fit_overhead`).

Under async scheduling a step lasts the longer of its host and GPU work, and which step an arrival joins depends on
when the host began scheduling, so neither holds. For an engine with such rows the least-squares answer is only
the starting point: :func:`fit_by_replay` minimises the TTFT plus TPOT MAPE by replaying the training rows under
candidate constants, the device-side terms (``device_step_us``, ``device_per_seq_us``: step time the kernel model
misses, which async scheduling cannot hide) among them (Nelder–Mead; the candidates share every kernel time, so a
replay costs only the simulation), and the predictions under the fitted constants come from one more replay. The launch terms stay at their priors: end-to-end means
cannot tell them from the step cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from servesim.errors import ServesimError
from servesim.serving.metrics import SimulationResult
from servesim.serving.overhead import HostOverhead, host_overhead
from servesim.validate.replay import ServingCase, Skipped, StepModels, case_deployment, case_row, replay_results

#: The split the shipped constants were fitted on: every H100 row trains, the other GPUs (H200) test, so the test
#: rows are on a GPU the fit never saw (and, for Llama-3.1-8B, a model it never saw).
TRAIN_GPUS = ("H100-SXM",)
TRAIN_RULE = "train = H100-SXM rows, test = every other GPU's rows"


def is_training_row(row: Mapping[str, object]) -> bool:
    """Whether a replayed row belongs to the calibration's training set (:data:`TRAIN_GPUS`)."""
    return row["gpu"] in TRAIN_GPUS


#: Columns :func:`calibration_frame` adds to a replayed row: the predictions with zero step and per-request
#: overhead, and their derivatives (ms of TTFT or TPOT per µs of ``step_us`` or ``per_seq_us``).
SENSITIVITY_COLUMNS = ("base_ttft_ms", "base_tpot_ms", "ttft_ms_per_step_us", "ttft_ms_per_seq_us",
                       "tpot_ms_per_step_us", "tpot_ms_per_seq_us")


def _window_sums(step_start_s: np.ndarray, step_end_s: np.ndarray, step_seqs: np.ndarray, begin_s: np.ndarray,
                 end_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per window [begin, end]: the number of steps that ran inside it and their summed batch sizes."""
    seqs_before = np.concatenate([[0], np.cumsum(step_seqs)])
    first = np.searchsorted(step_start_s, begin_s, side="left")
    last = np.searchsorted(step_end_s, end_s, side="right")
    last = np.maximum(last, first)
    return (last - first).astype(float), (seqs_before[last] - seqs_before[first]).astype(float)


def overhead_sensitivity(result: SimulationResult) -> dict[str, float]:
    """Mean TTFT and TPOT of a closed-loop, single-stage run and their derivatives by the per-step overhead terms.

    The steps of one replica run back to back, so the steps inside a request's window are a contiguous run found
    by binary search on the start and end times.
    """
    steps = result.steps
    if len(np.unique(steps.replica)) > 1 or (len(steps.start_s) > 1 and (np.diff(steps.start_s) < 0).any()):
        raise ServesimError("overhead sensitivities need one replica whose steps run one after the other (pp = 1)")
    ttft_steps, ttft_seqs = _window_sums(steps.start_s, steps.end_s, steps.num_requests, result.issue_s,
                                         result.first_token_s)
    tpot_steps, tpot_seqs = _window_sums(steps.start_s, steps.end_s, steps.num_requests, result.first_token_s,
                                         result.finish_s)
    decode_tokens = np.where(result.output_tokens > 1, result.output_tokens - 1, np.nan)
    us_to_ms = 1e-3
    return {
        "ttft_ms_per_step_us": float(ttft_steps.mean() * us_to_ms),
        "ttft_ms_per_seq_us": float(ttft_seqs.mean() * us_to_ms),
        "tpot_ms_per_step_us": float(np.nanmean(tpot_steps / decode_tokens) * us_to_ms),
        "tpot_ms_per_seq_us": float(np.nanmean(tpot_seqs / decode_tokens) * us_to_ms),
    }


def zero_step_overhead(engine: str) -> HostOverhead:
    """The engine's shipped constants with the two fitted terms at zero (the launch terms kept)."""
    from servesim.kernels.engines import get_engine_kernels

    return replace(host_overhead(engine, get_engine_kernels(engine).version), step_us=0.0, per_seq_us=0.0)


def zero_step_models(cases: Sequence[ServingCase], estimator: str) -> StepModels:
    """Step-time models for ``cases`` with each engine's per-step host terms at zero."""
    return StepModels(estimator, {engine: zero_step_overhead(engine) for engine in {case.engine for case in cases}})


def calibration_frame(
    cases: Sequence[ServingCase], estimator: str, on_case: Callable[[ServingCase], None] | None = None,
    models: StepModels | None = None,
) -> tuple[pd.DataFrame, list[Skipped]]:
    """Replay ``cases`` with zero step overhead (``models``: :func:`zero_step_models` to reuse): one row per case
    with :data:`SENSITIVITY_COLUMNS`."""
    if any(case.pp != 1 or case.concurrency is None for case in cases):
        raise ServesimError("calibration replays closed-loop runs with one pipeline stage only")
    models = models or zero_step_models(cases, estimator)
    rows, skipped = [], []
    for case, outcome in replay_results(cases, models, on_case):
        if isinstance(outcome, Skipped):
            skipped.append(outcome)
            continue
        row = case_row(case, outcome.summary())
        row.update(base_ttft_ms=row["predicted_ttft_ms"], base_tpot_ms=row["predicted_tpot_ms"],
                   **overhead_sensitivity(outcome))
        rows.append(row)
    return pd.DataFrame(rows), skipped


def predict_with(frame: pd.DataFrame, step_us: float, per_seq_us: float) -> pd.DataFrame:
    """``frame`` with predictions and errors for the given constants, from the sensitivities (no simulation)."""
    out = frame.copy()
    for metric in ("ttft", "tpot"):
        predicted = (out[f"base_{metric}_ms"] + step_us * out[f"{metric}_ms_per_step_us"]
                     + per_seq_us * out[f"{metric}_ms_per_seq_us"])
        out[f"predicted_{metric}_ms"] = predicted
        out[f"{metric}_error"] = predicted / out[f"measured_{metric}_ms"] - 1.0
    return out


def fit_overhead(frame: pd.DataFrame) -> tuple[float, float]:
    """Non-negative least squares of the relative TTFT and TPOT errors over ``frame``'s rows: (step_us,
    per_seq_us)."""
    from scipy.optimize import nnls

    if frame.empty:
        raise ServesimError("no training rows to fit the host overhead on")
    blocks_a, blocks_b = [], []
    for metric in ("ttft", "tpot"):
        measured = frame[f"measured_{metric}_ms"].to_numpy()
        blocks_a.append(np.column_stack([frame[f"{metric}_ms_per_step_us"], frame[f"{metric}_ms_per_seq_us"]])
                        / measured[:, None])
        blocks_b.append(1.0 - frame[f"base_{metric}_ms"].to_numpy() / measured)
    coefficients, _ = nnls(np.vstack(blocks_a), np.concatenate(blocks_b))
    return float(coefficients[0]), float(coefficients[1])


@dataclass(frozen=True)
class Calibration:
    """Fitted constants per engine and the rows with their split and predictions under them."""

    overheads: dict[str, HostOverhead]
    frame: pd.DataFrame  # calibration_frame columns + split + predictions/errors with the fitted constants
    train_rule: str


def calibrate(frame: pd.DataFrame, is_train: pd.Series, train_rule: str) -> Calibration:
    """Fit each engine's constants on the rows where ``is_train`` holds; predict every row with them."""
    parts, overheads = [], {}
    labelled = frame.assign(split=np.where(is_train, "train", "test"))
    for engine, rows in labelled.groupby("engine", sort=True):
        train = rows[rows["split"] == "train"]
        if train.empty:
            raise ServesimError(f"no {engine} row in the training set ({train_rule}); choose another split")
        step_us, per_seq_us = fit_overhead(train)
        overheads[engine] = replace(zero_step_overhead(engine), step_us=step_us, per_seq_us=per_seq_us)
        parts.append(predict_with(rows, step_us, per_seq_us))
    return Calibration(overheads, pd.concat(parts).sort_index(), train_rule)


def runs_synchronously(case: ServingCase) -> bool:
    """Whether the engine of ``case`` schedules each step after the previous one (no async scheduling)."""
    from servesim.hardware import get_gpu
    from servesim.models import get_model

    return not case_deployment(case, get_model(case.preset), get_gpu(case.gpu), "roofline").settings.async_scheduling


def replay_errors(cases: Sequence[ServingCase], models: StepModels) -> pd.DataFrame:
    """The replayed rows of ``cases`` (predictions and errors), the refused ones left out."""
    rows = [case_row(case, outcome.summary()) for case, outcome in replay_results(cases, models)
            if not isinstance(outcome, Skipped)]
    return pd.DataFrame(rows)


def replay_loss(frame: pd.DataFrame) -> float:
    """What a calibration minimises over replayed rows: their TTFT MAPE plus their TPOT MAPE (as fractions)."""
    return float(frame["ttft_error"].abs().mean() + frame["tpot_error"].abs().mean())


#: The constants :func:`fit_by_replay` fits, and the first simplex's step in each.
REPLAY_FIT_TERMS = (("step_us", 100.0), ("per_seq_us", 10.0), ("device_step_us", 100.0), ("device_per_seq_us", 10.0))


def fit_by_replay(cases: Sequence[ServingCase], engine: str, base: StepModels, start: HostOverhead,
                  evaluations: int = 80) -> HostOverhead:
    """The constants of :data:`REPLAY_FIT_TERMS` minimising the TTFT plus TPOT MAPE of ``cases`` (one engine's
    training rows) when they are replayed, from ``start`` (Nelder–Mead: a replay is piecewise in the constants);
    ``base`` holds the models whose kernel times every candidate reuses."""
    from scipy.optimize import minimize

    def candidate(x: np.ndarray) -> HostOverhead:
        return replace(start, **{name: float(v) for (name, _), v in zip(REPLAY_FIT_TERMS, x)})

    def loss(x: np.ndarray) -> float:
        if (x < 0).any():
            return math.inf
        return replay_loss(replay_errors(cases, StepModels(base.estimator_name, {engine: candidate(x)},
                                                           shares_with=base)))

    x0 = np.array([getattr(start, name) for name, _ in REPLAY_FIT_TERMS])
    simplex = [x0] + [x0 + np.eye(len(x0))[i] * step for i, (_, step) in enumerate(REPLAY_FIT_TERMS)]
    found = minimize(loss, x0, method="Nelder-Mead",
                     options={"maxfev": evaluations, "xatol": 0.5, "fatol": 1e-4, "initial_simplex": simplex})
    return candidate(found.x)


def calibrate_cases(cases: Sequence[ServingCase], estimator: str, is_train: Callable[[ServingCase], bool],
                    train_rule: str, on_case: Callable[[ServingCase], None] | None = None) -> tuple[Calibration,
                                                                                                   list[Skipped]]:
    """Fit each engine's constants on its training cases and predict every case with them: exactly by the linear
    sensitivities where every training case of the engine schedules synchronously, else by :func:`fit_by_replay`
    from the linear fit (adding the device-side terms), with predictions from a replay under the fitted
    constants."""
    base = zero_step_models(cases, estimator)
    frame, skipped = calibration_frame(cases, estimator, on_case, base)
    by_id = {case.case_id: case for case in cases}
    linear = calibrate(frame, frame["case_id"].map(lambda case_id: is_train(by_id[case_id])), train_rule)
    overheads, parts = dict(linear.overheads), []
    for engine, rows in linear.frame.groupby("engine", sort=True):
        engine_cases = [by_id[case_id] for case_id in rows["case_id"]]
        train = [case for case in engine_cases if is_train(case)]
        if all(runs_synchronously(case) for case in train):
            parts.append(rows)
            continue
        overheads[engine] = fit_by_replay(train, engine, base, overheads[engine])
        replayed = replay_errors(engine_cases, StepModels(estimator, {engine: overheads[engine]}, shares_with=base))
        predicted = replayed.set_index("case_id")[["predicted_ttft_ms", "predicted_tpot_ms", "ttft_error",
                                                  "tpot_error"]]
        rows = rows.copy()
        for column in predicted.columns:
            rows[column] = rows["case_id"].map(predicted[column])
        parts.append(rows)
    return Calibration(overheads, pd.concat(parts).sort_index(), train_rule), skipped
