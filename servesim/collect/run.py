"""Running a collection: find the device and the catalogue GPU it is, time every (shape, implementation) the
output does not hold yet, append the rows and kernel launches as they are measured, and keep the manifest
current so an interrupted or budget-bounded run can be resumed."""

from __future__ import annotations

import dataclasses
import importlib.util
import platform
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from servesim import __version__
from servesim.collect.implementations import Implementation, select
from servesim.collect.launches import LAUNCH_COLUMNS, launch_rows
from servesim.collect.schema import (
    BACKEND,
    CATEGORIES,
    CPU_LABEL,
    FORMAT_VERSION,
    LAUNCHES_FILE,
    MANIFEST_FILE,
    SYSTEM,
    Shape,
)
from servesim.collect.store import append_rows, measured_keys, read_manifest, source_name, write_manifest
from servesim.collect.timing import TimingSettings, Timing, default_flush_bytes, make_flush, time_op
from servesim.errors import ServesimError
from servesim.hardware import GpuSpec, get_gpu

#: Manifest fields that must agree for a run to add rows to an existing collection.
_IDENTITY = ("device", "device_name", "gpu", "torch_version", "cuda_version")


def gpu_for_device_name(device_name: str) -> GpuSpec:
    """The catalogue GPU a CUDA device name denotes (``NVIDIA H100 80GB HBM3`` -> H100-SXM), by exact alias."""
    short = device_name.removeprefix("NVIDIA").strip()
    try:
        return get_gpu(short)
    except ServesimError:
        raise ServesimError(
            f"CUDA device {device_name!r} is not in the GPU catalogue under that name; pass --gpu with its catalogue "
            "name ('servesim gpus' lists them)"
        ) from None


def gpu_option(name: str) -> GpuSpec:
    """The catalogue GPU ``--gpu`` names; a ServesimError that names --gpu otherwise."""
    try:
        return get_gpu(name)
    except ServesimError as exc:
        raise ServesimError(f"--gpu: {exc}") from None


@dataclass(frozen=True)
class Device:
    """Where the kernels run and what the rows will say about it."""

    kind: str  # cuda | cpu
    name: str
    gpu: GpuSpec | None
    gpu_from: str  # "device name", "--gpu" or "" (CPU)
    compute_capability: str | None
    torch_version: str
    cuda_version: str | None

    @property
    def label(self) -> str:
        """The ``gpu`` column: the catalogue name, never a GPU for a CPU run."""
        return self.gpu.name if self.gpu is not None else CPU_LABEL


def require_torch():
    """The torch module, or a one-line ServesimError saying how to install it."""
    if importlib.util.find_spec("torch") is None:
        raise ServesimError("servesim collect times kernels with PyTorch, which is not installed: pip install torch")
    import torch

    return torch


def detect_device(kind: str, gpu: GpuSpec | None) -> Device:
    """The device of a ``--device cuda`` or ``cpu`` run; ``gpu`` (from ``--gpu``) overrides the name lookup."""
    torch = require_torch()
    if kind == "cpu":
        if gpu is not None:
            raise ServesimError("--gpu names the GPU that runs the kernels; a --device cpu run has none, drop --gpu")
        return Device("cpu", platform.processor() or platform.machine(), None, "", None, torch.__version__,
                      torch.version.cuda)
    if kind != "cuda":
        raise ServesimError(f"unknown --device {kind!r}; choose cuda or cpu")
    if not torch.cuda.is_available():
        raise ServesimError(
            f"no CUDA GPU is visible to torch {torch.__version__} (CUDA {torch.version.cuda}); run on a machine "
            "with an NVIDIA GPU, or pass --device cpu to test the collector (CPU timings are not training data)"
        )
    name = torch.cuda.get_device_name()
    major, minor = torch.cuda.get_device_capability()
    spec, source = (gpu, "--gpu") if gpu is not None else (gpu_for_device_name(name), "device name")
    return Device("cuda", name, spec, source, f"{major}.{minor}", torch.__version__, torch.version.cuda)


@dataclass(frozen=True)
class CollectRequest:
    """Everything a run needs, validated by the caller (the CLI) before any torch import."""

    out: Path
    device: str
    gpu: GpuSpec | None
    shapes: tuple[Shape, ...]
    sweeps: tuple[dict, ...]  # each sweep's describe(), for the manifest
    implementations: tuple[str, ...]  # --impl names; empty: the device's defaults
    timing: TimingSettings
    flush_bytes: int | None  # None: twice the GPU's L2
    time_budget_s: float | None
    record_launches: bool
    command: str


@dataclass(frozen=True)
class CollectResult:
    """What a run did, per (category, kernel_source): rows measured now, rows already there, shapes skipped
    (with reasons), and shapes left for a later run when the time budget ran out."""

    device: Device
    directory: Path
    counts: tuple[dict, ...]
    skipped: tuple[dict, ...]
    remaining: int


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _identity(device: Device) -> dict:
    return {
        "device": device.kind, "device_name": device.name, "gpu": device.gpu.name if device.gpu else None,
        "torch_version": device.torch_version, "cuda_version": device.cuda_version,
    }


def open_manifest(directory: Path, device: Device, record_launches: bool) -> dict:
    """The existing manifest when it describes this device, else a new one; refuses to mix devices."""
    if (directory / MANIFEST_FILE).exists():
        manifest = read_manifest(directory)
        ours = _identity(device)
        clash = [k for k in _IDENTITY if manifest.get(k) != ours[k]]
        if clash:
            raise ServesimError(
                f"{directory} holds measurements with a different {', '.join(clash)} "
                f"({', '.join(f'{manifest.get(k)!r}' for k in clash)}); write this run to a new --out folder"
            )
        return manifest
    if device.kind == "cpu":
        launches = "not recorded: --device cpu (torch.profiler reports launch grids for CUDA kernels only)"
        label = ("CPU timings from --device cpu, taken to test the collector: not GPU measurements, and refused "
                 "as training data unless asked for (allow_cpu=True)")
    else:
        launches = ("torch.profiler CUDA kernel events of one call per shape: name, grid, block, registers, "
                    "shared memory" if record_launches else "not recorded: --no-launches")
        label = f"GPU measurements on {device.name}"
    return {
        "format": FORMAT_VERSION, "label": label, "servesim_version": __version__, **_identity(device),
        "gpu_from": device.gpu_from, "compute_capability": device.compute_capability, "system": SYSTEM,
        "backend": BACKEND, "date": _now(), "launches": launches, "runs": [],
    }


def _plan(shapes: tuple[Shape, ...], impls: dict[str, tuple[Implementation, ...]], device: str,
          directory: Path) -> tuple[list[tuple[Shape, Implementation]], Counter, Counter]:
    """The (shape, implementation) pairs to measure, leaving out those already in the files (counted as
    ``already``) and those whose implementation cannot run here (counted as skipped with the reason)."""
    from servesim.collect.ops import unavailable_reason

    unavailable = {(i.category, i.name): unavailable_reason(i, device) for pool in impls.values() for i in pool}
    done = {c: measured_keys(directory, CATEGORIES[c]) for c in impls}
    counts: Counter = Counter()
    skipped: Counter = Counter()
    tasks = []
    for shape in shapes:
        for impl in impls[shape.category]:
            source = impl.kernel_source(device)
            if unavailable[(impl.category, impl.name)]:
                skipped[(shape.category, source, unavailable[(impl.category, impl.name)])] += 1
            elif (source, shape) in done[shape.category]:
                counts[(shape.category, source, "already")] += 1
            else:
                tasks.append((shape, impl))
    return tasks, counts, skipped


def _measure(impl: Implementation, shape: Shape, device: Device, settings: TimingSettings, flush,
             record_launches: bool) -> tuple[Timing, list]:
    from servesim.collect.launches import profile_launches
    from servesim.collect.ops import build

    op = build(impl, shape, device.kind)
    timing = time_op(op, device.kind, settings, flush)
    launches = profile_launches(op) if device.kind == "cuda" and record_launches else []
    return timing, launches


def _failure_reason(exc: Exception) -> str:
    """A one-line reason for a shape that could not be measured (recorded, then the run goes on)."""
    from servesim.collect.ops import Unsupported

    if isinstance(exc, Unsupported):
        return str(exc)
    torch = require_torch()
    if isinstance(exc, torch.OutOfMemoryError):
        torch.cuda.empty_cache()
        return "out of device memory"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"


def collect(request: CollectRequest, progress: Callable[[str], None] = lambda line: None) -> CollectResult:
    """Measure ``request.shapes`` with the selected implementations into ``request.out`` (see docs/collect.md)."""
    torch = require_torch()
    device = detect_device(request.device, request.gpu)
    if device.kind == "cpu":
        torch.set_num_threads(1)  # steadier CPU timings; CPU runs only test the harness
    torch.manual_seed(0)
    flush_bytes = default_flush_bytes(device.gpu) if request.flush_bytes is None else request.flush_bytes
    settings = dataclasses.replace(request.timing, flush_bytes=flush_bytes)
    impls = select(tuple(dict.fromkeys(s.category for s in request.shapes)), device.kind, request.implementations)
    directory = Path(request.out)
    directory.mkdir(parents=True, exist_ok=True)
    manifest = open_manifest(directory, device, request.record_launches)
    tasks, counts, skipped = _plan(request.shapes, impls, device.kind, directory)

    run = {"date": _now(), "command": request.command, "sweep": list(request.sweeps),
           "implementations": {c: {i.kernel_source(device.kind): i.description for i in pool}
                               for c, pool in impls.items()},
           "timing": settings.describe(device.kind), "status": "running"}
    manifest["runs"].append(run)
    write_manifest(directory, manifest)

    flush = make_flush(device.kind, settings.flush_bytes)
    started = time.monotonic()
    remaining, status = 0, "interrupted"
    try:
        for number, (shape, impl) in enumerate(tasks, start=1):
            if request.time_budget_s is not None and time.monotonic() - started >= request.time_budget_s:
                remaining = len(tasks) - number + 1
                progress(f"time budget of {request.time_budget_s:g} s spent; {remaining} measurements left for "
                         "a resumed run")
                break
            where = f"[{number}/{len(tasks)}] {shape.category} {shape.describe()} {impl.kernel_source(device.kind)}"
            progress(_measure_into(directory, impl, shape, device, settings, flush, request.record_launches,
                                   counts, skipped, where))
        status = "stopped: time budget" if remaining else "complete"
    finally:  # also on Ctrl-C: the manifest says how far the run got
        result = CollectResult(device, directory, _count_rows(counts, skipped), _skip_rows(skipped), remaining)
        measured = sum(n for (_, _, kind), n in counts.items() if kind == "measured")
        run.update(status=status, measured=measured, remaining=remaining, skipped=list(result.skipped))
        write_manifest(directory, manifest)
    return result


def _measure_into(directory: Path, impl: Implementation, shape: Shape, device: Device, settings: TimingSettings,
                  flush, record_launches: bool, counts: Counter, skipped: Counter, where: str) -> str:
    """Measure one (shape, implementation), append its row and launches, count it; returns the progress line.
    A failure is counted as skipped with its reason and the run goes on."""
    kernel_source = impl.kernel_source(device.kind)
    try:
        timing, launches = _measure(impl, shape, device, settings, flush, record_launches)
    except Exception as exc:  # any failure of one shape is recorded, never fatal to a long run
        reason = _failure_reason(exc)
        skipped[(shape.category, kernel_source, reason)] += 1
        return f"{where}: skipped ({reason})"
    schema = CATEGORIES[shape.category]
    row = {"gpu": device.label, "system": SYSTEM, "backend": BACKEND, "backend_version": device.torch_version,
           "kernel_source": kernel_source, **shape.as_dict(), "latency_us": round(timing.median_us, 4),
           "source": source_name(directory), "latency_p10_us": round(timing.p10_us, 4),
           "latency_p90_us": round(timing.p90_us, 4), "repetitions": timing.repetitions}
    append_rows(directory / schema.file, schema.file_columns, [row])
    if launches:
        append_rows(directory / LAUNCHES_FILE, LAUNCH_COLUMNS,
                    launch_rows(device.label, shape.category, kernel_source, shape.describe(), launches))
    counts[(shape.category, kernel_source, "measured")] += 1
    return f"{where}: {timing.median_us:.2f} us (p10 {timing.p10_us:.2f}, p90 {timing.p90_us:.2f})"


def _count_rows(counts: Counter, skipped: Counter) -> tuple[dict, ...]:
    keys = dict.fromkeys([(c, s) for c, s, _ in counts] + [(c, s) for c, s, _ in skipped])
    return tuple(
        {"category": c, "kernel_source": s, "file": CATEGORIES[c].file, "measured": counts[(c, s, "measured")],
         "already": counts[(c, s, "already")],
         "skipped": sum(n for (c2, s2, _), n in skipped.items() if (c2, s2) == (c, s))}
        for c, s in keys
    )


def _skip_rows(skipped: Counter) -> tuple[dict, ...]:
    return tuple({"category": c, "kernel_source": s, "shapes": n, "reason": reason}
                 for (c, s, reason), n in skipped.items())
