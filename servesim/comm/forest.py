"""A random forest stored as plain arrays: fitted with scikit-learn, evaluated with numpy, saved as ``.npz``.

Exporting the trees keeps the cache free of pickles and loadable whatever scikit-learn version is installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Forest settings: small enough to fit in a few seconds on one core. Every tree sees every row and grows until
#: its leaves are single rows, so a measured point is reproduced and the trees differ only in the features each
#: split may use: a configuration's size sweep is sparse (about 20 points), and a bootstrap sample would drop a
#: third of it from each tree.
N_TREES = 48
MIN_SAMPLES_LEAF = 1
MAX_FEATURES = 0.7
BOOTSTRAP = False


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

    def save(self, path: Path) -> None:
        np.savez_compressed(path, roots=self.roots, feature=self.feature, threshold=self.threshold, left=self.left,
                            right=self.right, value=self.value)

    @classmethod
    def load(cls, path: Path) -> "PortableForest":
        with np.load(path, allow_pickle=False) as data:
            return cls(**{name: data[name] for name in data.files})


def fit_forest(features: np.ndarray, target: np.ndarray, seed: int = 0) -> PortableForest:
    from sklearn.ensemble import RandomForestRegressor

    forest = RandomForestRegressor(n_estimators=N_TREES, min_samples_leaf=MIN_SAMPLES_LEAF, max_features=MAX_FEATURES,
                                   random_state=seed, n_jobs=1, bootstrap=BOOTSTRAP).fit(features, target)
    roots, feature, threshold, left, right, value = [], [], [], [], [], []
    offset = 0
    for estimator in forest.estimators_:
        tree = estimator.tree_
        roots.append(offset)
        feature.append(tree.feature)
        threshold.append(tree.threshold)
        leaf = tree.children_left < 0
        left.append(np.where(leaf, -1, tree.children_left + offset))
        right.append(np.where(leaf, -1, tree.children_right + offset))
        value.append(tree.value[:, 0, 0])
        offset += tree.node_count
    return PortableForest(
        roots=np.array(roots, dtype=np.int64),
        feature=np.concatenate(feature).astype(np.int64),
        threshold=np.concatenate(threshold),
        left=np.concatenate(left).astype(np.int64),
        right=np.concatenate(right).astype(np.int64),
        value=np.concatenate(value),
    )
