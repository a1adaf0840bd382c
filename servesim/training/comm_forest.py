"""Fitting the communication model's correction forests with scikit-learn (the ``train`` extra).

The runtime never imports this: it evaluates the exported arrays (:class:`servesim.comm.forest.PortableForest`)
shipped in :data:`servesim.comm.model.FORESTS_FILE`, which ``tools/fit_comm_forests.py`` writes with
:func:`fit_model`. Changing a setting here means bumping :data:`servesim.comm.model.MODEL_VERSION` and refitting.
"""

from __future__ import annotations

import numpy as np
from sklearn.ensemble import RandomForestRegressor

from servesim.comm.forest import PortableForest
from servesim.comm.measurements import MeasurementTable, prediction_releases
from servesim.comm.model import CommModel, training_arrays

#: Forest settings: small enough to fit in a few seconds on one core. Every tree sees every row and grows until
#: its leaves are single rows, so a measured point is reproduced and the trees differ only in the features each
#: split may use: a configuration's size sweep is sparse (about 20 points), and a bootstrap sample would drop a
#: third of it from each tree.
N_TREES = 48
MIN_SAMPLES_LEAF = 1
MAX_FEATURES = 0.7
BOOTSTRAP = False


def fit_forest(features: np.ndarray, target: np.ndarray, seed: int = 0) -> PortableForest:
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


def fit_model(table: MeasurementTable, seed: int = 0) -> CommModel:
    """One forest per timing harness measured in ``table`` (see :mod:`servesim.comm.model`)."""
    forests = {harness: fit_forest(x, y, seed) for harness, (x, y) in training_arrays(table).items()}
    return CommModel(forests, prediction_releases(table))
