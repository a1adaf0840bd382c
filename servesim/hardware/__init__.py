"""GPU catalogue: specification figures with their sources. Predicts nothing."""

from servesim.hardware.catalogue import (
    apply_prices,
    get_gpu,
    gpu_names,
    load_catalogue,
    load_prices,
    missing_sources,
    parse_gpu_list,
)
from servesim.hardware.spec import TENSOR_DTYPES, GpuSpec

__all__ = [
    "GpuSpec",
    "TENSOR_DTYPES",
    "apply_prices",
    "get_gpu",
    "gpu_names",
    "load_catalogue",
    "load_prices",
    "missing_sources",
    "parse_gpu_list",
]
