"""Where a learned estimator's predictions for a GPU stand on measurements: which GPUs its networks were trained on,
and, for a GPU that is not one of them, which of its specification figures lie outside the trained GPUs' range.

A GPU nobody measured is predicted from its specification sheet, which is the point of servesim, but how far the
prediction carries depends on where the GPU sits: an H800 (an H100's SMs, memory and clocks) is inside the measured
range, an H20 (a quarter of any trained Hopper's Tensor rate per SM) is not, and there networks that differ only in
their training seed disagree by tens of percent (docs/accuracy.md, "Retraining and GPUs nobody measured"). Plans say
so next to the numbers rather than leave the user to find out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace

from servesim.errors import ServesimError
from servesim.estimator.base import KernelEstimator
from servesim.estimator.roofline import TENSOR_CATEGORIES
from servesim.hardware.catalogue import get_gpu
from servesim.hardware.spec import GpuSpec
from servesim.kernels.expand import kernel_categories
from servesim.kernels.types import Kernel
from servesim.models.config import ModelConfig

#: Where docs explain what extrapolated predictions are worth.
ACCURACY_DOC = 'docs/accuracy.md, "Retraining and GPUs nobody measured"'
#: Where docs say when a network's training GPUs bracket a GPU, and what times the kernels where they do not.
BRACKET_DOC = 'docs/estimator.md, "GPUs a network\'s training does not bracket"'


@dataclass(frozen=True)
class OutOfRange:
    """One specification figure of a GPU outside the range its estimator was trained on."""

    quantity: str
    value: float
    trained_min: float
    trained_max: float

    def describe(self) -> str:
        return (f"{self.quantity} {_figure(self.value)} (measured {_figure(self.trained_min)}–"
                f"{_figure(self.trained_max)})")


def _figure(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


@dataclass(frozen=True)
class Coverage:
    """How a GPU stands on an estimator's training data."""

    gpu: str
    measured: bool
    trained_gpus: tuple[str, ...]
    out_of_range: tuple[OutOfRange, ...]
    #: The categories it launches whose networks learned from other GPUs only, and the GPUs the networks that time
    #: them here learned from.
    extrapolated_categories: tuple[str, ...] = ()
    extrapolated_from: tuple[str, ...] = ()
    #: Of those, the categories whose networks' training GPUs do not bracket this GPU, which the roofline times
    #: on it instead (:meth:`servesim.estimator.base.BoundedEstimator.falls_back`), and their networks' GPUs.
    roofline_categories: tuple[str, ...] = ()
    roofline_trained_gpus: tuple[str, ...] = ()

    def _roofline_clause(self) -> str:
        return (f"{', '.join(self.roofline_categories)} timed by the roofline, their networks' GPUs "
                f"({', '.join(self.roofline_trained_gpus)}) not bracketing it ({BRACKET_DOC})")

    def note(self) -> str | None:
        """One line for command output, or None for a GPU whose kernels were all measured."""
        learned = [c for c in self.extrapolated_categories if c not in self.roofline_categories]
        if self.measured:
            parts = []
            if learned:
                parts.append(f"{', '.join(learned)} kernels not measured on it; their times extrapolated from "
                             f"{', '.join(self.extrapolated_from)}")
            if self.roofline_categories:
                parts.append(self._roofline_clause())
            return f"{self.gpu}: {'; '.join(parts)}" if parts else None
        if self.extrapolated_categories and not learned:
            return f"{self.gpu}: not measured; {self._roofline_clause()}"
        what = f"{', '.join(learned)} kernel times" if learned else "kernel times"
        head = f"{self.gpu}: not measured; {what} extrapolated from {len(self.trained_gpus)} measured GPUs"
        tail = f"; {self._roofline_clause()}" if self.roofline_categories else ""
        if not self.out_of_range:
            return f"{head}, every figure checked within their range{tail}"
        return (f"{head}, outside their range in {', '.join(o.describe() for o in self.out_of_range)}; read "
                f"them as uncertain ({ACCURACY_DOC}){tail}")

    def to_json(self) -> dict:
        return {"gpu": self.gpu, "measured": self.measured, "trained_gpus": list(self.trained_gpus),
                "out_of_range": [asdict(o) for o in self.out_of_range],
                "extrapolated_categories": list(self.extrapolated_categories),
                "extrapolated_from": list(self.extrapolated_from),
                "roofline_categories": list(self.roofline_categories),
                "roofline_trained_gpus": list(self.roofline_trained_gpus)}


def tensor_dtype(weights_dtype: str) -> str:
    """The Tensor-pipe dtype a model's linears run in: ``fp8-block`` weights run FP8 MMAs like ``fp8`` ones."""
    return "fp8" if weights_dtype.startswith("fp8") else weights_dtype


def _checked_figures(dtype: str | None) -> tuple[tuple[str, Callable[[GpuSpec], float]], ...]:
    """The figures the estimator's inputs scale with: SMs, clock, the Tensor rate of ``dtype`` (None: no Tensor
    work) and the DRAM bandwidth per SM (per clock, so that a GPU with more SMs on the same memory is told apart)."""
    tensor = () if dtype is None else (
        (f"{dtype.upper()} Tensor FLOPs/SM/clock", lambda g: g.tensor_flops_per_sm_per_cycle.get(dtype, 0.0)),)
    return (
        ("SMs", lambda g: float(g.sm_count)),
        ("sustained clock MHz", lambda g: g.sustained_clock_mhz),
        *tensor,
        ("DRAM bytes/SM/clock", lambda g: g.dram_bandwidth_gbps * 1e9 / (g.sm_count * g.clock_hz())),
        ("L2 MiB", lambda g: g.l2_cache_mib),
    )


def coverage(gpu: GpuSpec, trained: Iterable[GpuSpec], weights_dtype: str | None) -> Coverage:
    """How ``gpu`` stands on GPUs ``trained`` on, for a model with ``weights_dtype`` weights (None: for work that
    does not use the Tensor cores). Figures are compared with the trained GPUs that have them (the A100 has no FP8
    Tensor rate, so it does not widen FP8's); a figure ``gpu`` lacks is not compared (the kernels then come from
    another path, or the model does not run)."""
    trained = tuple(trained)
    names = tuple(g.name for g in trained)
    if gpu.name in names:
        return Coverage(gpu.name, True, names, ())
    outside = []
    for quantity, figure in _checked_figures(None if weights_dtype is None else tensor_dtype(weights_dtype)):
        values = [v for v in map(figure, trained) if v > 0]
        value = figure(gpu)
        if values and value > 0 and not min(values) <= value <= max(values):
            outside.append(OutOfRange(quantity, value, min(values), max(values)))
    return Coverage(gpu.name, False, names, tuple(outside))


def _trained_specs(estimator: KernelEstimator, category: str | None = None) -> tuple[GpuSpec, ...]:
    """The catalogue specs of :meth:`KernelEstimator.trained_gpus`."""
    return tuple(get_gpu(name) for name in estimator.trained_gpus(category))


def estimator_coverage(estimator: KernelEstimator, gpus: Iterable[GpuSpec], weights_dtype: str,
                       launched: Callable[[GpuSpec], Iterable[str]] = lambda gpu: ()) -> tuple[Coverage, ...]:
    """:func:`coverage` of each of ``gpus`` on what ``estimator`` learned from; empty for an analytical estimator,
    whose predictions stand on no measurement. A measured GPU also names the categories it ``launched`` whose
    networks never saw it (the element-wise networks learned from the A100 and H100 alone)."""
    trained = _trained_specs(estimator)
    if not trained:
        return ()
    falls_back = getattr(estimator, "falls_back", lambda category, gpu: False)
    result = []
    for gpu in dict.fromkeys(gpus):
        covered = coverage(gpu, trained, weights_dtype)
        by_category = {c: estimator.trained_gpus(c) for c in sorted(launched(gpu))}
        missing = {c: names for c, names in by_category.items() if names and gpu.name not in names}
        roofline = {c: names for c, names in missing.items() if falls_back(c, gpu)}
        learned = [names for c, names in missing.items() if c not in roofline]
        covered = replace(covered, extrapolated_categories=tuple(missing),
                          extrapolated_from=tuple(sorted({n for names in learned for n in names})),
                          roofline_categories=tuple(roofline),
                          roofline_trained_gpus=tuple(sorted({n for names in roofline.values() for n in names})))
        result.append(covered)
    return tuple(result)


def launched_by(engine: str, model: ModelConfig, weights_dtype: str) -> Callable[[GpuSpec], frozenset[str]]:
    """For :func:`estimator_coverage`: the kernel categories a GPU launches serving ``model``; none on a GPU that
    cannot run it (FP8 weights on an A100), which the command reports on its own."""

    def launched(gpu: GpuSpec) -> frozenset[str]:
        try:
            return kernel_categories(engine, model, gpu, weights_dtype)
        except ServesimError:
            return frozenset()

    return launched


def coverage_notes(coverages: Iterable[Coverage]) -> list[str]:
    """The output lines of the GPUs whose kernels were not measured."""
    return [note for c in coverages if (note := c.note()) is not None]


def kernel_coverage(estimator: KernelEstimator, kernel: Kernel, gpu: GpuSpec) -> Coverage | None:
    """:func:`coverage` of ``gpu`` on the GPUs that trained the network of ``kernel``'s category; None where no
    network times it (an analytical estimator, or a category the roofline times)."""
    trained = _trained_specs(estimator, kernel.category)
    if not trained:
        return None
    covered = coverage(gpu, trained, kernel.dtype if kernel.category in TENSOR_CATEGORIES else None)
    falls_back = getattr(estimator, "falls_back", lambda category, gpu: False)
    if not covered.measured:
        covered = replace(covered, extrapolated_categories=(kernel.category,))
        if falls_back(kernel.category, gpu):
            covered = replace(covered, roofline_categories=(kernel.category,),
                              roofline_trained_gpus=covered.trained_gpus)
        else:
            covered = replace(covered, extrapolated_from=covered.trained_gpus)
    return covered
