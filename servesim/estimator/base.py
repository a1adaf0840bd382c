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


class BoundedEstimator:
    """The base of every estimator: :meth:`predict_us` is the subclass's :meth:`_predict_us` held at or above each
    kernel's physical lower bound (:func:`servesim.estimator.bounds.lower_bound_us`: compulsory traffic at peak
    bandwidth, FLOPs at the pipe's peak), so that no estimator predicts a kernel faster than the GPU can run it.
    :func:`get_estimator` wraps a registered estimator that does not derive from it in :class:`Bounded`."""

    name: str = ""
    label: str = ""

    def trained_gpus(self, category: str | None = None) -> tuple[str, ...]:
        return ()

    def falls_back(self, category: str, gpu: GpuSpec) -> bool:
        """Whether ``category`` has a network that does not time it on ``gpu`` because its training GPUs do not
        bracket ``gpu`` (docs/estimator.md, "GPUs a network's training does not bracket"); the roofline does."""
        return False

    def _predict_us(self, kernels: Sequence[Kernel], gpu: GpuSpec) -> np.ndarray:
        raise NotImplementedError

    def predict_us(self, kernels: Sequence[Kernel], gpu: GpuSpec) -> np.ndarray:
        from servesim.estimator.bounds import lower_bound_us

        times = np.asarray(self._predict_us(kernels, gpu), dtype=float)
        return np.maximum(times, lower_bound_us(kernels, gpu))


class Bounded(BoundedEstimator):
    """Any :class:`KernelEstimator` with its predictions held at the physical lower bound."""

    def __init__(self, inner: KernelEstimator) -> None:
        self.inner = inner
        self.name = inner.name
        self.label = inner.label

    def trained_gpus(self, category: str | None = None) -> tuple[str, ...]:
        return self.inner.trained_gpus(category)

    def falls_back(self, category: str, gpu: GpuSpec) -> bool:
        falls_back = getattr(self.inner, "falls_back", None)
        return bool(falls_back(category, gpu)) if falls_back is not None else False

    def _predict_us(self, kernels: Sequence[Kernel], gpu: GpuSpec) -> np.ndarray:
        return self.inner.predict_us(kernels, gpu)


def bounded(estimator: KernelEstimator) -> BoundedEstimator:
    """``estimator`` itself if it holds its predictions at the lower bound, else wrapped so that it does."""
    return estimator if isinstance(estimator, BoundedEstimator) else Bounded(estimator)


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


def get_estimator(name: str) -> BoundedEstimator:
    """A new estimator of ``name``, its predictions never below a kernel's physical lower bound. The compiled loops
    its kernels go through are compiled first where their cache is cold, on every core (servesim/precompile.py)."""
    from servesim.precompile import compile_cold_loops

    compile_cold_loops()
    return bounded(ESTIMATORS[check_estimator_name(name)]())
