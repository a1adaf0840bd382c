"""The estimator interface: many kernels of one GPU in, one time each out (µs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from servesim.errors import ServesimError, suggest
from servesim.hardware import get_gpu
from servesim.hardware.spec import GpuSpec
from servesim.kernels.types import Kernel


class KernelEstimator(Protocol):
    """Predicts kernel times; implementations vectorise over the kernels they are given."""

    name: str
    label: str  # one line for output headers, e.g. "roofline (analytical, no learned correction)"

    def predict_us(self, kernels: Sequence[Kernel], gpu: GpuSpec) -> np.ndarray: ...

    def trained_gpus(self, category: str | None = None) -> tuple[str, ...]:
        """Catalogue names of the GPUs whose measured kernels it learned from, for one kernel category or (None)
        any; empty for an analytical estimator or category."""
        ...


def predict_per_gpu_us(estimator: KernelEstimator, kernels: Sequence[Kernel], gpu_names: Sequence[str]) -> np.ndarray:
    """``estimator``'s time of each of ``kernels`` on its own row's GPU (``gpu_names[i]``), one batch per GPU."""
    names = np.asarray(gpu_names, dtype=str)
    out = np.empty(len(kernels))
    for gpu_name in np.unique(names):
        rows = np.flatnonzero(names == gpu_name)
        out[rows] = estimator.predict_us([kernels[i] for i in rows], get_gpu(str(gpu_name)))
    return out


def _roofline() -> KernelEstimator:
    from servesim.estimator.roofline import RooflineEstimator

    return RooflineEstimator()


def _mlp() -> KernelEstimator:
    from servesim.estimator.mlp import MlpEstimator

    return MlpEstimator()


#: Estimator factories by the name users pass to ``--estimator``.
ESTIMATORS: dict[str, Callable[[], KernelEstimator]] = {"roofline": _roofline, "mlp": _mlp}

#: The estimator every command uses unless told otherwise (docs/estimator.md).
DEFAULT_ESTIMATOR = "mlp"


def check_estimator_name(name: str) -> str:
    """``name`` if it names an estimator, else an error that suggests the nearest name."""
    if name not in ESTIMATORS:
        raise ServesimError(
            f"unknown estimator {name!r}.{suggest(name, ESTIMATORS)} Choose one of {', '.join(ESTIMATORS)}."
        )
    return name


def get_estimator(name: str) -> KernelEstimator:
    return ESTIMATORS[check_estimator_name(name)]()
