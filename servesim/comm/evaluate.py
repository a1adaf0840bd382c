"""Accuracy of the communication model: MAPE per measured system and collective.

*Seen*: one forest fitted on a seeded random 80% of all rows, scored on the other 20%. *Unseen*: leave one system
out, fit on the rest, score every row of the left-out system (Vidur's setups of the same GPU as an aiconfigurator
system are left out separately, so they are only unseen as a harness and topology).
"""

from __future__ import annotations

import numpy as np

from servesim.comm.analytical import IMPLEMENTATIONS, OPS
from servesim.comm.measurements import ENGINE_CODES, MeasurementTable, load_table
from servesim.comm.model import fit_model

HOLDOUT_FRACTION = 0.2


def collective_labels(table: MeasurementTable) -> np.ndarray:
    """'all_reduce/nccl', 'all_reduce/custom_graph/vllm', … per row."""
    ops = np.array(OPS)[table.op]
    impls = np.array(IMPLEMENTATIONS)[table.implementation]
    engines = np.array(ENGINE_CODES)[table.engine]
    labels = np.char.add(np.char.add(ops.astype(str), "/"), impls.astype(str))
    return np.where(engines != "", np.char.add(np.char.add(labels, "/"), engines.astype(str)), labels)


def holdout_mask(table: MeasurementTable, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(len(table)) < HOLDOUT_FRACTION


def percentage_errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(predicted - measured) / measured * 100.0


def seen_errors(table: MeasurementTable, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(held-out mask, APE % of the held-out rows) of a forest fitted on the rest."""
    test = holdout_mask(table, seed)
    model = fit_model(table.subset(~test), seed)
    return test, percentage_errors(model.predict_table(table.subset(test)), table.latency_us[test])


def unseen_errors(table: MeasurementTable, seed: int = 0) -> np.ndarray:
    """APE % of every row when its system is left out of training."""
    errors = np.empty(len(table))
    for index in range(len(table.systems)):
        test = table.system == index
        model = fit_model(table.subset(~test), seed)
        errors[test] = percentage_errors(model.predict_table(table.subset(test)), table.latency_us[test])
    return errors


def evaluate(table: MeasurementTable | None = None, unseen: bool = True, seed: int = 0) -> list[dict]:
    """One row per (system, collective) with ``rows``, ``seen_mape_pct`` and ``unseen_mape_pct``, then one
    ``all`` row per system."""
    table = load_table() if table is None else table
    test, seen = seen_errors(table, seed)
    seen_all = np.full(len(table), np.nan)
    seen_all[test] = seen
    unseen_all = unseen_errors(table, seed) if unseen else np.full(len(table), np.nan)
    labels = collective_labels(table)
    rows = []
    for index, system in enumerate(table.systems):
        in_system = table.system == index
        for label in [*sorted(set(labels[in_system])), "all"]:
            mask = in_system & ((labels == label) | (label == "all"))
            rows.append({
                "system": system,
                "collective": label,
                "rows": int(mask.sum()),
                "seen_mape_pct": _nanmean(seen_all[mask]),
                "unseen_mape_pct": _nanmean(unseen_all[mask]),
            })
    return rows


def _nanmean(values: np.ndarray) -> float:
    values = values[~np.isnan(values)]
    return float(values.mean()) if len(values) else float("nan")
