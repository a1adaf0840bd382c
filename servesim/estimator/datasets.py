"""Training samples for the kernel estimator: measured kernel tables turned into kernel objects, their SynPerf
feature matrices and efficiency targets (theoretical time / measured time).

Rows are split by *shape*, not by row: a shape's measurements on every GPU and by every engine fall on the same
side, so "seen GPU, held-out shape" accuracy never scores a shape the model trained on. The split of a shape is
a hash of its values and the seed, so it does not depend on which other rows were loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from servesim.errors import ServesimError
from servesim.features import FeatureMatrix, kernel_features
from servesim.hardware import get_gpu
from servesim.kernels.types import Gemm, Kernel


@dataclass(frozen=True, eq=False)
class KernelSamples:
    """Measured kernels of one category: row i is ``kernels[i]`` timed on ``gpu[i]`` in ``measured_us[i]``."""

    category: str
    kernels: tuple[Kernel, ...]
    gpu: np.ndarray  # catalogue GPU name per row
    shape_id: np.ndarray  # uint64 hash of the shape's values, equal across GPUs and engines
    features: FeatureMatrix
    measured_us: np.ndarray

    def __len__(self) -> int:
        return len(self.kernels)

    @property
    def theoretical_us(self) -> np.ndarray:
        return self.features.column("theoretical_time_us")

    @property
    def efficiency(self) -> np.ndarray:
        """The estimator's target: theoretical time / measured time (above 1 where the model is pessimistic)."""
        return self.theoretical_us / self.measured_us

    def subset(self, mask: np.ndarray) -> KernelSamples:
        rows = np.flatnonzero(mask)
        return KernelSamples(
            category=self.category,
            kernels=tuple(self.kernels[i] for i in rows),
            gpu=self.gpu[rows],
            shape_id=self.shape_id[rows],
            features=FeatureMatrix(self.features.names, self.features.values[rows]),
            measured_us=self.measured_us[rows],
        )


@dataclass(frozen=True)
class ShapeSplit:
    """Boolean row masks of a split by shape."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


def split_by_shape(shape_id: np.ndarray, seed: int, val_fraction: float = 0.1,
                   test_fraction: float = 0.1) -> ShapeSplit:
    """Assign each shape to train, validation or test from a hash of (shape, seed)."""
    salted = pd.util.hash_array(shape_id.astype(np.uint64) ^ np.uint64(seed * 0x9E3779B97F4A7C15 % 2**64))
    u = salted.astype(np.float64) / 2.0**64
    test = u < test_fraction
    val = (u >= test_fraction) & (u < test_fraction + val_fraction)
    return ShapeSplit(train=~(test | val), val=val, test=test)


def _gemm_kernels(frame: pd.DataFrame) -> list[Kernel]:
    return [Gemm(m=int(m), n=int(n), k=int(k), dtype=str(d))
            for m, n, k, d in zip(frame["m"], frame["n"], frame["k"], frame["dtype"])]


@dataclass(frozen=True)
class CategorySource:
    """Where one category's measurements come from and how a row becomes a kernel."""

    load: Callable[[], pd.DataFrame]
    shape_columns: tuple[str, ...]
    to_kernels: Callable[[pd.DataFrame], list[Kernel]]


def _load_bf16_gemm() -> pd.DataFrame:
    from servesim.data.aiconfigurator import load_gemm

    return load_gemm(dtypes=("bf16",))


#: Categories with measured training data. BF16 GEMMs only for ``gemm``: FP8 rows are the ``scaled_mm`` category.
SOURCES: dict[str, CategorySource] = {
    "gemm": CategorySource(_load_bf16_gemm, ("m", "n", "k", "dtype"), _gemm_kernels),
}


def samples_from_frame(category: str, frame: pd.DataFrame) -> KernelSamples:
    """Kernels, features and measured times of a measured frame's rows (features computed per GPU, batched)."""
    source = _source(category)
    frame = frame.reset_index(drop=True)
    kernels = source.to_kernels(frame)
    values = np.empty((len(frame), 0))
    names: tuple[str, ...] = ()
    for gpu_name, rows in frame.groupby("gpu", observed=True).indices.items():
        matrix = kernel_features([kernels[i] for i in rows], get_gpu(str(gpu_name)))
        if not names:
            names, values = matrix.names, np.empty((len(frame), len(matrix.names)))
        values[rows] = matrix.values
    shape_id = pd.util.hash_pandas_object(frame[list(source.shape_columns)], index=False).to_numpy()
    return KernelSamples(
        category=category,
        kernels=tuple(kernels),
        gpu=frame["gpu"].astype(str).to_numpy(),
        shape_id=shape_id,
        features=FeatureMatrix(names, values),
        measured_us=frame["latency_us"].to_numpy(dtype=np.float64),
    )


def load_samples(category: str, max_rows: int | None = None, seed: int = 0,
                 gpus: Sequence[str] | None = None) -> KernelSamples:
    """Measured samples of ``category`` (optionally only ``gpus``), a seeded random ``max_rows`` of them at most."""
    frame = _source(category).load()
    if gpus is not None:
        frame = frame[frame["gpu"].isin(list(gpus))]
    frame = frame[frame["latency_us"] > 0]
    if max_rows is not None and len(frame) > max_rows:
        frame = frame.sample(n=max_rows, random_state=seed)
    return samples_from_frame(category, frame)


def _source(category: str) -> CategorySource:
    try:
        return SOURCES[category]
    except KeyError:
        raise ServesimError(
            f"no measured training data for kernel category {category!r}; available: {', '.join(SOURCES)}"
        ) from None
