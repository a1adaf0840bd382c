"""Kernel types and the engine expanders that turn one vLLM or SGLang step into the kernels it launches."""

from servesim.kernels.batch import BATCH_SYNTAX_HELP, BatchSpec, PrefillChunk, parse_batch
from servesim.kernels.engines import ENGINE_KERNELS, EngineKernels, get_engine_kernels
from servesim.kernels.expand import WEIGHT_DTYPES, StepKernels, StepOp, check_parallelism, expand, stage_layers
from servesim.kernels.types import KERNEL_TYPES, Collective, Kernel

__all__ = [
    "BATCH_SYNTAX_HELP",
    "BatchSpec",
    "Collective",
    "ENGINE_KERNELS",
    "EngineKernels",
    "KERNEL_TYPES",
    "Kernel",
    "PrefillChunk",
    "StepKernels",
    "StepOp",
    "WEIGHT_DTYPES",
    "check_parallelism",
    "expand",
    "get_engine_kernels",
    "parse_batch",
    "stage_layers",
]
