"""Refit the communication model's forests and rewrite servesim/comm/comm_forests.npz.

Run after the measurement table (servesim/comm/comm_measurements.npz, tools/derive_comm_table.py) or the model's
features or forest settings change (bump servesim.comm.model.MODEL_VERSION for the latter). Needs the train extra
(scikit-learn). Usage: python tools/fit_comm_forests.py [--seed N]
"""

from __future__ import annotations

import argparse

import numpy as np

from servesim.comm.measurements import load_table
from servesim.comm.model import FORESTS_FILE, MODEL_VERSION, forests_arrays
from servesim.training.comm_forest import fit_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="Seed of the forests (default 0).")
    args = parser.parse_args()
    table = load_table()
    model = fit_model(table, args.seed)
    np.savez_compressed(FORESTS_FILE, **forests_arrays(model.forests, table.digest))
    nodes = {harness: len(forest.left) for harness, forest in model.forests.items()}
    print(f"wrote {FORESTS_FILE} ({MODEL_VERSION}, table {table.digest}, nodes per harness {nodes})")


if __name__ == "__main__":
    main()
