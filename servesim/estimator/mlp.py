"""The SynPerf-style estimator: one MLP per kernel category predicts an efficiency from the kernel's analytical
features; the predicted time is the kernel's base time over that efficiency.

The base time is the SynPerf theoretical time (the busiest SM's slowest pipe) plus the category's latency floor
``latency_floor_us``, the time its smallest measured kernels take on a typical GPU (launch, first wave, drain).
With the bare theoretical time, a kernel whose time is all launch and ramp has an efficiency proportional to its
theoretical time, so the network has to learn each GPU's floor from the GPU's identity, and a GPU left out of
training (an H200 next to an H100) gets the floor of whichever GPU its specification resembles; with the floor
added, such kernels have an efficiency near 1 on every GPU. For long kernels the floor is negligible.

Inference is numpy, batched over all kernels of a category. Weights ship as ``weights/<category>.npz`` with the
batch norms folded into the linear layers, so the forward pass is ``relu(x @ W + b)`` per hidden layer and a
scaled sigmoid at the end. Categories without weights fall back to the roofline estimator, and ``label`` says
which ones do; so does a category on a GPU its network's training GPUs do not bracket (:func:`brackets`).

The output is ``efficiency_max * sigmoid(z)`` rather than a bare sigmoid: the analytical theoretical time is
above the measured time for many kernels (tile and L2 models that are pessimistic on some GPUs, benchmarks that
hit in L2), so the efficiency target exceeds 1 on a share of rows; ``efficiency_max`` is stored with the weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from servesim.errors import ServesimError
from servesim.estimator.base import BoundedEstimator
from servesim.estimator.inputs import estimator_inputs
from servesim.features import FeatureMatrix
from servesim.hardware import get_gpu
from servesim.hardware.spec import GpuSpec
from servesim.kernels.types import Kernel

WEIGHTS_DIR = Path(__file__).parent / "weights"

#: Logits are clipped here so that far-out inputs give a tiny positive efficiency, never 0 or an overflow.
_LOGIT_LIMIT = 40.0
#: The forward pass multiplies blocks of this many rows (a stack of small matrix products). A float32 matrix
#: product over a whole batch rounds a row differently with the number of rows beside it (a one-row pass and a
#: many-row one differ in the last bits for most rows), which made a kernel's predicted time depend on the kernels
#: predicted with it, hence on the order in which a process met them. Fixed blocks, zero-padded, round every row
#: alike, so a prediction depends on the kernel alone, and a plan's output does not depend on how its options are
#: grouped into processes.
FORWARD_BLOCK_ROWS = 4


@dataclass(frozen=True, eq=False)
class MlpWeights:
    """One category's network. ``layers[i] = (W [in, out], b [out])``; all but the last are followed by ReLU."""

    category: str
    feature_names: tuple[str, ...]
    input_mean: np.ndarray
    input_scale: np.ndarray
    #: Per input, the normalised value every training row had where the feature never varied in training, NaN
    #: where it did (see :func:`forward_efficiency`).
    fixed_inputs: np.ndarray
    layers: tuple[tuple[np.ndarray, np.ndarray], ...]
    efficiency_max: float
    latency_floor_us: float  # added to the theoretical time to make the base time
    metadata: dict[str, str]  # how the weights were made: seed, GPUs, rows, training seconds

    def base_time_us(self, theoretical_us: np.ndarray) -> np.ndarray:
        """What the predicted efficiency divides: theoretical time plus the category's latency floor."""
        return theoretical_us + self.latency_floor_us


def transform_inputs(features: np.ndarray) -> np.ndarray:
    """Features span ten orders of magnitude (bytes, ops, counts): the network sees ``log1p`` of them."""
    return np.log1p(np.maximum(features, 0.0))


def forward_efficiency(weights: MlpWeights, features: np.ndarray) -> np.ndarray:
    """Predicted efficiency of each row of raw ``features`` (columns ``weights.feature_names``).

    An input that never varied in training (the Vidur element-wise rows all come from GPUs with the same XU rate;
    every FP8 GEMM tile runs one CTA per SM) taught the network nothing about itself, and its spread there is
    zero or a rounding residue (1e-14): normalised by it, another GPU's value would be ten orders of magnitude out
    and drive the efficiency to its floor or ceiling. Such inputs keep their training value
    (``weights.fixed_inputs``)."""
    x = (transform_inputs(features) - weights.input_mean) / weights.input_scale
    # C order whatever the features' order: numpy multiplies blocks with strides BLAS cannot take (a column-major
    # batch of several rows) by its own loop, which rounds otherwise than a one-row batch's BLAS call.
    x = np.where(np.isnan(weights.fixed_inputs), x, weights.fixed_inputs).astype(np.float32, order="C")
    # Blocks of FORWARD_BLOCK_ROWS rows, the last padded with zeros: see FORWARD_BLOCK_ROWS.
    rows = len(x)
    blocks = -(-rows // FORWARD_BLOCK_ROWS)
    x = np.concatenate([x, np.zeros((blocks * FORWARD_BLOCK_ROWS - rows, x.shape[1]), dtype=np.float32)])
    x = x.reshape(blocks, FORWARD_BLOCK_ROWS, x.shape[1])
    *hidden, (w_out, b_out) = weights.layers
    for w, b in hidden:
        x = np.maximum(x @ w + b, 0.0)
    z = np.clip((x @ w_out + b_out).reshape(-1)[:rows].astype(np.float64), -_LOGIT_LIMIT, _LOGIT_LIMIT)
    return weights.efficiency_max / (1.0 + np.exp(-z))


def save_weights(weights: MlpWeights, path: Path) -> None:
    arrays: dict[str, np.ndarray] = {
        "category": np.array(weights.category),
        "feature_names": np.array(weights.feature_names),
        "input_mean": weights.input_mean,
        "input_scale": weights.input_scale,
        "fixed_inputs": weights.fixed_inputs,
        "efficiency_max": np.array(weights.efficiency_max),
        "latency_floor_us": np.array(weights.latency_floor_us),
        "metadata_keys": np.array(list(weights.metadata), dtype=str),
        "metadata_values": np.array(list(weights.metadata.values()), dtype=str),
    }
    for i, (w, b) in enumerate(weights.layers):
        arrays[f"w{i}"], arrays[f"b{i}"] = w.astype(np.float32), b.astype(np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


def load_weights(path: Path) -> MlpWeights:
    with np.load(path, allow_pickle=False) as f:
        count = sum(1 for name in f.files if name.startswith("w"))
        return MlpWeights(
            category=str(f["category"]),
            feature_names=tuple(str(n) for n in f["feature_names"]),
            input_mean=f["input_mean"],
            input_scale=f["input_scale"],
            fixed_inputs=f["fixed_inputs"],
            layers=tuple((f[f"w{i}"], f[f"b{i}"]) for i in range(count)),
            efficiency_max=float(f["efficiency_max"]),
            latency_floor_us=float(f["latency_floor_us"]),
            metadata=dict(zip((str(k) for k in f["metadata_keys"]), (str(v) for v in f["metadata_values"]))),
        )


@lru_cache(maxsize=1)
def shipped_weights() -> dict[str, MlpWeights]:
    """The weights that ship with servesim, by category."""
    return {path.stem: load_weights(path) for path in sorted(WEIGHTS_DIR.glob("*.npz"))}


def predict_from_inputs_us(weights: MlpWeights, inputs: FeatureMatrix) -> np.ndarray:
    """Base time over predicted efficiency, from a matrix holding (at least) the inputs the weights were trained
    on: the shipped estimator's, measured samples' candidate inputs, or a trial's."""
    efficiency = forward_efficiency(weights, inputs.select(weights.feature_names).values)
    return weights.base_time_us(inputs.column("theoretical_time_us")) / efficiency


def predict_category_us(weights: MlpWeights, kernels: Sequence[Kernel], gpu: GpuSpec) -> np.ndarray:
    """Times of kernels of ``weights.category`` on ``gpu``: base time over predicted efficiency."""
    if not kernels:
        return np.zeros(0)
    matrix = estimator_inputs(kernels, gpu)
    if matrix.names != weights.feature_names:
        raise ServesimError(
            f"the {weights.category} estimator weights were trained on other features than servesim computes "
            "now; retrain them with `servesim train`"
        )
    return predict_from_inputs_us(weights, matrix)


def brackets(gpu: GpuSpec, trained: Sequence[GpuSpec]) -> bool:
    """Whether GPUs ``trained`` on bracket ``gpu``: it is of an architecture one of them is of (none recorded:
    nothing to judge by, so yes). See docs/estimator.md, "GPUs a network's training does not bracket"."""
    return not trained or gpu.architecture in {g.architecture for g in trained}


class MlpEstimator(BoundedEstimator):
    """Per-category MLPs where weights exist and their training GPUs bracket the GPU, the roofline elsewhere."""

    name = "mlp"

    def __init__(self, weights: dict[str, MlpWeights] | None = None) -> None:
        from servesim.estimator.roofline import RooflineEstimator

        self._weights = shipped_weights() if weights is None else weights
        self._fallback = RooflineEstimator()
        self._trained_specs: dict[str, tuple[GpuSpec, ...]] = {}

    @property
    def label(self) -> str:
        learned = ", ".join(sorted(self._weights)) or "none"
        return f"mlp (per-category MLP on SynPerf features for {learned}; roofline for other categories)"

    def trained_gpus(self, category: str | None = None) -> tuple[str, ...]:
        """The GPUs ``category``'s network (None: any network) was trained on, as its weights record them; none for
        a category the roofline times."""
        if category is None:
            weights = list(self._weights.values())
        else:
            weights = [self._weights[category]] if category in self._weights else []
        return tuple(sorted({name for w in weights for name in w.metadata.get("gpus", "").split(",") if name}))

    def falls_back(self, category: str, gpu: GpuSpec) -> bool:
        """Whether ``category`` has a network whose training GPUs do not bracket ``gpu`` (:func:`brackets`), so the
        roofline times its kernels there."""
        if category not in self._weights:
            return False
        if category not in self._trained_specs:
            self._trained_specs[category] = tuple(get_gpu(name) for name in self.trained_gpus(category))
        return not brackets(gpu, self._trained_specs[category])

    def _predict_us(self, kernels: Sequence[Kernel], gpu: GpuSpec) -> np.ndarray:
        """Each distinct kernel is predicted once (a step repeats its layers' kernels), batched per category."""
        distinct: dict[Kernel, int] = {}
        index = np.fromiter((distinct.setdefault(k, len(distinct)) for k in kernels), dtype=np.int64,
                            count=len(kernels))
        by_category: dict[str, list[Kernel]] = {}
        for kernel in distinct:
            by_category.setdefault(kernel.category, []).append(kernel)
        times = np.empty(len(distinct))
        for category, batch in by_category.items():
            weights = None if self.falls_back(category, gpu) else self._weights.get(category)
            times[[distinct[k] for k in batch]] = (self._fallback.predict_us(batch, gpu) if weights is None
                                                   else predict_category_us(weights, batch, gpu))
        return times[index]
