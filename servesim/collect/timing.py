"""Timing one operation: warm-up, then repetitions each preceded by an L2 flush, summarised by their median.

On CUDA each repetition is bracketed by a pair of CUDA events (``events``), or the operation is captured
``graph_launches`` times in a CUDA graph and each repetition replays the graph between one pair of events
(``graph``; the latency is the replay's time divided by the launches, and only the first launch of a replay runs
cold). On CPU each repetition is timed with ``time.perf_counter_ns``. Before every repetition a buffer of
``flush_bytes`` (twice the GPU's L2 by default) is overwritten so the operation's inputs are not served from L2;
on CUDA a short spin kernel follows the flush so the timed span holds GPU work only, not the CPU's launch latency.

torch is imported inside the functions: this module is on the collector's run path only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from servesim.errors import ServesimError
from servesim.hardware.spec import GpuSpec

TIMING_METHODS = ("events", "graph")
#: The flush on ``--device cpu``: a nominal 32 MiB last-level cache, doubled. CPU timings only exercise the
#: harness, so this need not match the machine.
CPU_FLUSH_BYTES = 64 * 2**20
#: Flush buffer size as a multiple of the GPU's L2.
L2_FLUSH_FACTOR = 2
#: GPU clock cycles of the spin kernel queued after each flush (about 100 us at 2 GHz): while the GPU spins, the
#: CPU finishes issuing the start event and the operation, so Python launch overhead is not timed.
SPIN_CYCLES = 200_000


@dataclass(frozen=True)
class TimingSettings:
    warmup: int = 10
    repetitions: int = 50
    method: str = "events"  # CUDA only; CPU is always perf_counter_ns
    graph_launches: int = 10
    flush_bytes: int = CPU_FLUSH_BYTES

    def __post_init__(self) -> None:
        if self.method not in TIMING_METHODS:
            raise ServesimError(f"unknown timing method {self.method!r}; choose {' or '.join(TIMING_METHODS)}")
        if self.warmup < 0 or self.repetitions < 1 or self.graph_launches < 1 or self.flush_bytes < 0:
            raise ServesimError(
                "timing needs --warmup >= 0, --repetitions >= 1, --graph-launches >= 1 and --flush-mib >= 0"
            )

    def describe(self, device: str) -> dict:
        """The manifest's ``timing`` entry."""
        method = {"cpu": "perf_counter_ns", "cuda": f"cuda_{self.method}"}[device]
        out = {"method": method, "warmup": self.warmup, "repetitions": self.repetitions,
               "flush_bytes": self.flush_bytes, "statistic": "median", "spread": "p10, p90"}
        if device == "cuda" and self.method == "graph":
            out["graph_launches"] = self.graph_launches
        return out


def default_flush_bytes(gpu: GpuSpec | None) -> int:
    """Twice the catalogue GPU's L2; :data:`CPU_FLUSH_BYTES` without a GPU."""
    return CPU_FLUSH_BYTES if gpu is None else int(L2_FLUSH_FACTOR * gpu.l2_cache_bytes)


@dataclass(frozen=True)
class Timing:
    """The summary of one operation's repetitions, in microseconds."""

    median_us: float
    p10_us: float
    p90_us: float
    repetitions: int


def summarise(samples_us: np.ndarray) -> Timing:
    samples_us = np.asarray(samples_us, dtype=np.float64)
    p10, median, p90 = np.percentile(samples_us, [10, 50, 90])
    return Timing(float(median), float(p10), float(p90), int(samples_us.size))


def make_flush(device: str, flush_bytes: int) -> Callable[[], object]:
    """A function that overwrites a ``flush_bytes`` buffer on ``device`` (a no-op for 0 bytes)."""
    import torch

    if flush_bytes == 0:
        return lambda: None
    buffer = torch.empty(flush_bytes, dtype=torch.uint8, device=device)
    return buffer.zero_


def time_on_cpu(op: Callable[[], object], settings: TimingSettings, flush: Callable[[], object]) -> Timing:
    for _ in range(settings.warmup):
        op()
    samples = np.empty(settings.repetitions)
    for i in range(settings.repetitions):
        flush()
        start = time.perf_counter_ns()
        op()
        samples[i] = time.perf_counter_ns() - start
    return summarise(samples / 1e3)


def time_with_cuda_events(op: Callable[[], object], settings: TimingSettings, flush: Callable[[], object]) -> Timing:
    import torch

    for _ in range(settings.warmup):
        op()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(settings.repetitions)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(settings.repetitions)]
    torch.cuda.synchronize()
    for start, end in zip(starts, ends):
        flush()
        torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        op()
        end.record()
    torch.cuda.synchronize()
    return summarise(np.array([s.elapsed_time(e) for s, e in zip(starts, ends)]) * 1e3)


def time_with_cuda_graph(op: Callable[[], object], settings: TimingSettings, flush: Callable[[], object]) -> Timing:
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture stream, as torch.cuda.graph requires
        for _ in range(max(settings.warmup, 1)):
            op()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(settings.graph_launches):
            op()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = np.empty(settings.repetitions)
    for i in range(settings.repetitions):
        flush()
        torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples[i] = start.elapsed_time(end) * 1e3 / settings.graph_launches
    return summarise(samples)


def time_op(op: Callable[[], object], device: str, settings: TimingSettings, flush: Callable[[], object]) -> Timing:
    """Time ``op`` on ``device`` (``cuda`` or ``cpu``) as ``settings`` say."""
    if device == "cpu":
        return time_on_cpu(op, settings, flush)
    if settings.method == "graph":
        return time_with_cuda_graph(op, settings, flush)
    return time_with_cuda_events(op, settings, flush)
