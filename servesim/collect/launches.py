"""The CUDA kernels behind each measured shape, as torch.profiler records them (name, grid, block, registers,
shared memory, duration), and their comparison with the CTA counts ``servesim.decompose`` predicts for the same
shape: SynPerf's Table VII check that the task decomposition launches what the library launches."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.collect.implementations import by_kernel_source
from servesim.collect.schema import LAUNCHES_FILE, parse_shape, shape_kernel
from servesim.collect.store import numeric_column, read_checked_csv, read_manifest
from servesim.errors import ServesimError


@dataclass(frozen=True)
class KernelLaunch:
    """One CUDA kernel launch seen by the profiler."""

    kernel_name: str
    grid_x: int
    grid_y: int
    grid_z: int
    block_x: int
    block_y: int
    block_z: int
    registers_per_thread: int
    shared_memory_bytes: int
    duration_us: float


LAUNCH_COLUMNS = ("gpu", "category", "kernel_source", "shape", *KernelLaunch.__dataclass_fields__)


def kernel_launches(events: Iterable) -> list[KernelLaunch]:
    """The GPU kernel launches among torch.profiler's ``FunctionEvent``s: device events whose metadata carries a
    launch grid (memory copies and CPU ops have none)."""
    launches = []
    for event in events:
        meta = getattr(event, "event_metadata", None)
        if event.device_type.name != "CUDA" or meta is None or meta.grid is None or meta.block is None:
            continue
        launches.append(KernelLaunch(event.name, *(int(v) for v in meta.grid), *(int(v) for v in meta.block),
                                     int(meta.registers_per_thread or 0), int(meta.shared_memory or 0),
                                     float(event.time_range.elapsed_us())))
    return launches


def profile_launches(op: Callable[[], object]) -> list[KernelLaunch]:
    """Run ``op`` once under torch.profiler (CUDA activity) and return the kernels it launched."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        op()
        torch.cuda.synchronize()
    return kernel_launches(prof.events())


def launch_rows(gpu: str, category: str, kernel_source: str, shape: str,
                launches: Iterable[KernelLaunch]) -> list[dict]:
    """``launches.csv`` rows of one measured shape."""
    return [{"gpu": gpu, "category": category, "kernel_source": kernel_source, "shape": shape, **asdict(launch)}
            for launch in launches]


def check_grids(directory: Path) -> pd.DataFrame:
    """Each measured shape's main kernel (the longest launch) against the decomposer's prediction for the shape.

    Columns: gpu, category, kernel_source, shape, kernels (launches the profiler saw), kernel_name, measured_ctas
    (grid x*y*z), predicted_ctas (the decomposer's largest launch; NaN where it has no mapping, e.g.
    residual_add), ratio (measured / predicted), agree (equal CTA counts), measured_threads, predicted_threads,
    predicted_launch (the decomposer's launch name).
    """
    from servesim.decompose import decompose
    from servesim.hardware import get_gpu

    directory = Path(directory)
    manifest = read_manifest(directory)
    path = directory / LAUNCHES_FILE
    if not path.exists():
        note = manifest.get("launches", "no kernel launches were recorded")
        raise ServesimError(f"{path} does not exist ({note}); run 'servesim collect' on a CUDA GPU")
    frame = read_checked_csv(path, LAUNCH_COLUMNS)
    for column in LAUNCH_COLUMNS[5:]:
        frame[column] = numeric_column(frame, column, path, integer=column != "duration_us")
    rows = []
    for (gpu, category, source, shape_text), group in frame.groupby(
            ["gpu", "category", "kernel_source", "shape"], sort=False):
        main = group.loc[group["duration_us"].idxmax()]
        impl = by_kernel_source(category, source)
        kernel = shape_kernel(parse_shape(category, shape_text), impl.attention_backend if impl else "")
        predicted = max(decompose(kernel, get_gpu(gpu)), key=lambda l: l.grid_ctas) if kernel is not None else None
        measured = int(main["grid_x"] * main["grid_y"] * main["grid_z"])
        rows.append({
            "gpu": gpu, "category": category, "kernel_source": source, "shape": shape_text, "kernels": len(group),
            "kernel_name": main["kernel_name"], "measured_ctas": measured,
            "predicted_ctas": predicted.grid_ctas if predicted else np.nan,
            "measured_threads": int(main["block_x"] * main["block_y"] * main["block_z"]),
            "predicted_threads": predicted.config.threads_per_cta if predicted else np.nan,
            "predicted_launch": predicted.name if predicted else "",
        })
    result = pd.DataFrame(rows, columns=["gpu", "category", "kernel_source", "shape", "kernels", "kernel_name",
                                         "measured_ctas", "predicted_ctas", "measured_threads",
                                         "predicted_threads", "predicted_launch"])
    result.insert(8, "ratio", result["measured_ctas"] / result["predicted_ctas"])
    result.insert(9, "agree", result["measured_ctas"] == result["predicted_ctas"])
    return result


def grid_agreement(checked: pd.DataFrame) -> pd.DataFrame:
    """Per (gpu, category, kernel_source): shapes compared, how many had the predicted CTA count exactly, and
    the median and range of measured / predicted CTAs."""
    compared = checked[checked["predicted_ctas"].notna()]
    grouped = compared.groupby(["gpu", "category", "kernel_source"], sort=False)
    return grouped.agg(shapes=("agree", "size"), exact=("agree", "sum"), median_ratio=("ratio", "median"),
                       min_ratio=("ratio", "min"), max_ratio=("ratio", "max")).reset_index()
