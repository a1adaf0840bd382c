"""Accuracy of the communication model: MAPE per measured system and collective.

Scored rows are those of the newest engine release measured on each system (older releases only train).
*Seen*: five-fold cross-validation over the measured points (seeded random folds): forests fitted on 80% of the
points score the other 20%, so every point is scored once. A point (system, configuration, message size) is held
out in every release of its table, so a near-identical older timing never stands in for it. *Unseen*: leave one
system out, fit on the rest, score every row of the left-out system (Vidur's setups of the same GPU as an
aiconfigurator system are left out separately, so they are only unseen as a harness and topology).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from servesim.comm.analytical import IMPLEMENTATIONS, OPS
from servesim.comm.measurements import ENGINE_CODES, MeasurementTable, load_table
from servesim.comm.systems import HARNESSES, MEASURED_SYSTEMS
from servesim.training.comm_forest import fit_model

FOLDS = 5
#: Ways to split a system's rows in :func:`evaluate`.
BREAKDOWNS = ("collective", "gpus", "size")
#: Message-size bands of the ``size`` breakdown: (label, smallest bytes).
SIZE_BANDS = (("<1MiB", 0.0), ("1-16MiB", 2.0**20), (">=16MiB", 2.0**24))


def collective_labels(table: MeasurementTable) -> np.ndarray:
    """'all_reduce/nccl', 'all_reduce/custom_graph/vllm', … per row."""
    ops = np.array(OPS)[table.op]
    impls = np.array(IMPLEMENTATIONS)[table.implementation]
    engines = np.array(ENGINE_CODES)[table.engine]
    labels = np.char.add(np.char.add(ops.astype(str), "/"), impls.astype(str))
    return np.where(engines != "", np.char.add(np.char.add(labels, "/"), engines.astype(str)), labels)


def breakdown_labels(table: MeasurementTable, by: str) -> tuple[np.ndarray, list[str]]:
    """(label per row, labels in display order) for the ``by`` breakdown (one of :data:`BREAKDOWNS`)."""
    if by == "collective":
        labels = collective_labels(table)
        return labels, sorted(set(labels))
    if by == "gpus":
        labels = np.char.add(table.group_size.astype(str), " GPUs")
        return labels, [f"{n} GPUs" for n in sorted(set(table.group_size))]
    if by == "size":
        bands = np.searchsorted([low for _, low in SIZE_BANDS], table.message_bytes, side="right") - 1
        return np.array([label for label, _ in SIZE_BANDS])[bands], [label for label, _ in SIZE_BANDS]
    raise ValueError(f"unknown breakdown {by!r}; choose one of {', '.join(BREAKDOWNS)}")


def fold_of_rows(table: MeasurementTable, seed: int = 0) -> np.ndarray:
    """Seeded random fold (0 to :data:`FOLDS` - 1) of each row's measured point, the same in every release."""
    points = np.column_stack([table.system, table.op, table.implementation, table.engine, table.group_size,
                              table.nodes, table.message_bytes])
    unique, inverse = np.unique(points, axis=0, return_inverse=True)
    return np.random.default_rng(seed).integers(0, FOLDS, len(unique))[inverse.ravel()]


def percentage_errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(predicted - measured) / measured * 100.0


def seen_errors(table: MeasurementTable, seed: int = 0, folds: Iterable[int] = range(FOLDS)) -> np.ndarray:
    """APE % of every newest-release row of ``folds``, predicted by forests fitted without its fold (NaN for the
    other rows)."""
    fold_of_row = fold_of_rows(table, seed)
    errors = np.full(len(table), np.nan)
    for fold in folds:
        held_out = fold_of_row == fold
        test = held_out & table.newest
        model = fit_model(table.subset(~held_out), seed)
        errors[test] = percentage_errors(model.predict_table(table.subset(test)), table.latency_us[test])
    return errors


def unseen_errors(table: MeasurementTable, seed: int = 0) -> np.ndarray:
    """APE % of every newest-release row when its system is left out of training (NaN for older releases)."""
    errors = np.full(len(table), np.nan)
    for index in range(len(table.systems)):
        left_out = table.system == index
        test = left_out & table.newest
        model = fit_model(table.subset(~left_out), seed)
        errors[test] = percentage_errors(model.predict_table(table.subset(test)), table.latency_us[test])
    return errors


def evaluate(table: MeasurementTable | None = None, unseen: bool = True, seed: int = 0,
             by: str = "collective") -> list[dict]:
    """One row per system and ``by`` label (collective, group size or message-size band) with ``rows``,
    ``seen_mape_pct`` and ``unseen_mape_pct``, then one ``all`` row per system; last, one row per timing harness
    pooling its systems (system ``all <harness>``)."""
    table = load_table() if table is None else table
    labels, order = breakdown_labels(table, by)
    seen_all = seen_errors(table, seed)
    unseen_all = unseen_errors(table, seed) if unseen else np.full(len(table), np.nan)
    rows = []
    for index, system in enumerate(table.systems):
        in_system = (table.system == index) & table.newest
        for label in [*(label for label in order if np.any(in_system & (labels == label))), "all"]:
            mask = in_system & ((labels == label) | (label == "all"))
            rows.append({
                "system": system,
                by: label,
                "rows": int(mask.sum()),
                "seen_mape_pct": _nanmean(seen_all[mask]),
                "unseen_mape_pct": _nanmean(unseen_all[mask]),
            })
    harness_of_row = np.array([MEASURED_SYSTEMS[name].harness for name in table.systems])[table.system]
    for harness in HARNESSES:
        mask = table.newest & (harness_of_row == harness)
        if mask.any():
            rows.append({"system": f"all {harness}", by: "all", "rows": int(mask.sum()),
                         "seen_mape_pct": _nanmean(seen_all[mask]), "unseen_mape_pct": _nanmean(unseen_all[mask])})
    return rows


def _nanmean(values: np.ndarray) -> float:
    values = values[~np.isnan(values)]
    return float(values.mean()) if len(values) else float("nan")
