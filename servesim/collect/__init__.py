"""``servesim collect``: time kernels on the local GPU (or, to test the collector, the CPU) into a directory of
tidy CSVs in the aiconfigurator loaders' columns, and read such directories back for training.

Importing this package does not import torch: only ``run``, ``ops`` and ``timing`` use it, on the run path.
"""

from servesim.collect.schema import CATEGORIES, CategorySchema, Shape
from servesim.collect.store import load_collection, read_manifest

__all__ = ["CATEGORIES", "CategorySchema", "Shape", "load_collection", "read_manifest"]
