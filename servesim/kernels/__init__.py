"""Kernel types and the engine expanders that turn one vLLM or SGLang step into the kernels it launches."""

from servesim.kernels.batch import BATCH_SYNTAX_HELP, BatchSpec, PrefillChunk, parse_batch
from servesim.kernels.engines import ENGINES, EngineConfig, get_engine
from servesim.kernels.expand import WEIGHT_DTYPES, StepKernels, StepOp, check_parallelism, expand, stage_layers
from servesim.kernels.types import KERNEL_TYPES, Collective, Kernel

__all__ = [
    "BATCH_SYNTAX_HELP",
    "BatchSpec",
    "Collective",
    "ENGINES",
    "EngineConfig",
    "KERNEL_TYPES",
    "Kernel",
    "PrefillChunk",
    "StepKernels",
    "StepOp",
    "WEIGHT_DTYPES",
    "check_parallelism",
    "expand",
    "get_engine",
    "parse_batch",
    "stage_layers",
]
