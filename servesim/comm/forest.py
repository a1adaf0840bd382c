"""A random forest stored as plain arrays: fitted with scikit-learn (:mod:`servesim.training.comm_forest`, the
``train`` extra), evaluated here with numpy alone, shipped as ``.npz``.

Exporting the trees keeps the shipped file free of pickles and loadable whatever scikit-learn version is installed,
or none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

@dataclass(frozen=True, eq=False)
class PortableForest:
    """All trees' nodes concatenated; ``left``/``right`` are global node indices, -1 at leaves."""

    roots: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Mean of the trees' leaf values for each row of ``features`` (rows x features)."""
        rows = np.arange(len(features))[:, None]
        node = np.broadcast_to(self.roots, (len(features), len(self.roots))).copy()
        while True:
            inner = self.left[node] >= 0
            if not inner.any():
                break
            go_left = features[rows, np.maximum(self.feature[node], 0)] <= self.threshold[node]
            node = np.where(inner, np.where(go_left, self.left[node], self.right[node]), node)
        return self.value[node].mean(axis=1)

    def arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        """Compact arrays to save (keys start with ``prefix``): the split feature per node (-1 at leaves, int8),
        then per inner node its threshold and its children as offsets from its own index, and per leaf its value.
        Inner-node values and leaf thresholds are never read, and offsets compress far better than indices."""
        inner = self.left >= 0
        index = np.arange(len(self.left))
        return {
            f"{prefix}roots": self.roots,
            f"{prefix}feature": np.where(inner, self.feature, -1).astype(np.int8),
            f"{prefix}threshold": self.threshold[inner],
            f"{prefix}left": (self.left - index)[inner].astype(np.int32),
            f"{prefix}right": (self.right - index)[inner].astype(np.int32),
            f"{prefix}value": self.value[~inner],
        }

    @classmethod
    def from_arrays(cls, data, prefix: str = "") -> "PortableForest":
        """The forest :meth:`arrays` wrote, from any mapping of its keys (a loaded ``.npz``)."""
        feature = np.asarray(data[f"{prefix}feature"]).astype(np.int64)
        inner = feature >= 0
        index = np.arange(len(feature))
        left = np.full(len(feature), -1, dtype=np.int64)
        right = left.copy()
        left[inner] = index[inner] + data[f"{prefix}left"]
        right[inner] = index[inner] + data[f"{prefix}right"]
        threshold = np.zeros(len(feature))
        threshold[inner] = data[f"{prefix}threshold"]
        value = np.zeros(len(feature))
        value[~inner] = data[f"{prefix}value"]
        return cls(roots=np.asarray(data[f"{prefix}roots"], dtype=np.int64), feature=feature, threshold=threshold,
                   left=left, right=right, value=value)
