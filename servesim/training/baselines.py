"""Baseline kernel-time predictors that the per-category MLP is scored against (docs/baselines.md).

Each baseline is ``fit_predict(train, test) -> predicted_us``: fitted on the measured rows of ``train`` (any GPUs),
it predicts one time per row of ``test``. All of them read only what every category has, the kernels' SynPerf
feature matrices (``servesim.features.FEATURE_NAMES``) and measured times, so a new category needs no change here.

- ``linear``: least squares of the measured time on the two aggregate theoretical times, GPU-level compute time
  and GPU-level DRAM time (the SynPerf paper's linear baseline).
- ``neusight``: NeuSight (Lee et al., ASPLOS 2025): kernel time = waves x per-wave roofline time / utilisation, the
  utilisation predicted per tile by a small MLP and bounded by the roofline.
- ``habitat``: Habitat's wave scaling (Yu et al., USENIX ATC 2021): the measured time of the same shape on the
  nearest training GPU, scaled by the wave, memory-bandwidth and per-SM compute-rate ratios; the roofline where no
  training GPU measured the shape (:func:`habitat_predict` says which rows).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd

from servesim.errors import ServesimError
from servesim.training.datasets import KernelSamples, split_by_shape
from servesim.estimator.mlp import transform_inputs
from servesim.estimator.roofline import roofline_us
from servesim.features import SPEC_FEATURES

#: Pipes that execute operations (the others move bytes).
COMPUTE_PIPES = ("tensor", "fma", "xu")


def _check_pair(train: KernelSamples, test: KernelSamples) -> None:
    if len(train) == 0:
        raise ServesimError("a baseline needs at least one measured training row; load more samples")
    if train.category != test.category:
        raise ServesimError(
            f"baselines fit and predict one kernel category at a time, got {train.category!r} training rows for "
            f"{test.category!r} test rows"
        )
    if train.features.names != test.features.names:
        raise ServesimError("training and test rows carry different feature columns; compute both with the same "
                            "servesim version")
    if np.any(train.measured_us <= 0):
        raise ServesimError("measured times must be positive; drop rows with latency_us <= 0")


def gpu_compute_cycles(samples: KernelSamples) -> np.ndarray:
    """GPU-level cycles of the busiest compute pipe: the kernel's operations at the whole GPU's peak rate."""
    return np.max(np.vstack([samples.features.column(f"gpu_{p}_cycles") for p in COMPUTE_PIPES]), axis=0)


# --- linear ----------------------------------------------------------------------------------------------------

def aggregate_times_us(samples: KernelSamples) -> np.ndarray:
    """The linear baseline's inputs, one row per sample: GPU-level compute time and GPU-level DRAM time (µs).

    Cycles are divided by each GPU's clock so that one coefficient serves GPUs of different clocks."""
    cycles = np.column_stack([gpu_compute_cycles(samples), samples.features.column("gpu_dram_cycles")])
    return cycles / samples.features.column("spec_clock_mhz")[:, None]


def linear_fit_predict(train: KernelSamples, test: KernelSamples) -> np.ndarray:
    """``t = a * compute_us + b * memory_us + c`` with a, b, c >= 0, least squares of the *relative* error.

    Ordinary least squares would be dominated by the longest kernels and can go negative on short ones; the
    relative residual is what MAPE scores, and non-negative coefficients keep every time positive."""
    from scipy.optimize import nnls

    _check_pair(train, test)

    def design(samples: KernelSamples) -> np.ndarray:
        return np.column_stack([aggregate_times_us(samples), np.ones(len(samples))])

    coefficients, _ = nnls(design(train) / train.measured_us[:, None], np.ones(len(train)))
    return design(test) @ coefficients


# --- NeuSight ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NeuSightConfig:
    """The utilisation network and its training (compact: NeuSight's own is 8 layers of 512)."""

    hidden: tuple[int, ...] = (64, 64, 64)
    learning_rate: float = 3e-3
    batch_size: int = 1024
    max_epochs: int = 100
    max_steps: int = 3000  # bounds the epochs on large training sets (about 17 of 180,000 rows)
    patience_epochs: int = 5
    val_fraction: float = 0.1  # of the training shapes, for early stopping
    seed: int = 0


@dataclass(frozen=True, eq=False)
class TileView:
    """Kernels as NeuSight sees them: tiles executed in waves of ``SMs x resident CTAs per SM`` tiles, each wave
    taking at least its roofline time, and the tile-level inputs of the utilisation network."""

    waves: np.ndarray
    roofline_us: np.ndarray  # sum over the waves of each wave's roofline time
    inputs: np.ndarray  # log1p of the tile features, one row per kernel


def wave_roofline_cycles(tasks: np.ndarray, sm_count: np.ndarray, ctas_per_sm: np.ndarray,
                         compute_cycles: np.ndarray, dram_cycles: np.ndarray) -> np.ndarray:
    """Sum over the waves of each wave's roofline, in cycles. A tile's compute takes ``compute_cycles * SMs /
    tasks`` on one SM at its peak (the CTAs an SM holds share its pipes, so the busiest SM of a wave takes its tile
    count times that); a wave's DRAM bytes take ``tiles * dram_cycles / tasks`` at the whole GPU's bandwidth,
    which the SMs busy in the wave share. A partly filled last wave counts the tiles it holds."""
    width = sm_count * ctas_per_sm
    tile_compute = compute_cycles * sm_count / tasks
    tile_dram = dram_cycles / tasks
    full = np.floor(tasks / width)
    rest = tasks - full * width
    last = np.maximum(np.ceil(rest / sm_count) * tile_compute, rest * tile_dram)
    return full * np.maximum(ctas_per_sm * tile_compute, width * tile_dram) + last


def tile_view(samples: KernelSamples) -> TileView:
    """Waves, roofline time and tile-level features from each kernel's task decomposition.

    A tile is one task of ``servesim.decompose`` (a CTA, or a work tile of a persistent kernel); its work is the
    kernel's useful work over its task count, on the busiest compute pipe and on DRAM (see
    :func:`wave_roofline_cycles`)."""
    f = samples.features
    tasks = f.column("num_tasks")
    if np.any(tasks < 1):
        raise ServesimError("NeuSight needs every kernel to have at least one task; a kernel with no work has no time")
    sm_count, clock_mhz, ctas_per_sm = f.column("spec_sm_count"), f.column("spec_clock_mhz"), f.column("ctas_per_sm")
    width = sm_count * ctas_per_sm
    waves = np.ceil(tasks / width)
    compute_cycles, dram_cycles = gpu_compute_cycles(samples), f.column("gpu_dram_cycles")
    roofline_us = wave_roofline_cycles(tasks, sm_count, ctas_per_sm, compute_cycles, dram_cycles) / clock_mhz
    per_tile = sm_count / tasks  # GPU-level cycles -> one SM's cycles per tile
    tile_l2_bytes = f.column("gpu_l2_bytes") / tasks
    tile_dram_bytes = f.column("gpu_dram_bytes") / tasks
    tile_ops = sum(f.column(f"gpu_{p}_ops") for p in COMPUTE_PIPES) / tasks
    dram_bytes_per_sm_cycle = f.column("spec_dram_gbps") * 1e3 / clock_mhz / sm_count
    l2_bytes_per_sm = f.column("spec_l2_mib") * 2**20 / sm_count
    columns = [
        *(f.column(f"gpu_{p}_ops") / tasks for p in COMPUTE_PIPES),  # tile operations per pipe
        tile_dram_bytes, tile_l2_bytes,
        compute_cycles * per_tile, dram_cycles * per_tile, f.column("gpu_l2_cycles") * per_tile,
        tile_ops / np.maximum(tile_dram_bytes, 1.0),  # arithmetic intensity (ops per DRAM byte)
        f.column("spec_tensor_per_sm_cycle"), f.column("spec_fma_per_sm_cycle"), dram_bytes_per_sm_cycle,
        f.column("spec_l2_gbps") * 1e3 / clock_mhz / sm_count, clock_mhz,
        waves, width, tasks,
        waves * tile_l2_bytes / l2_bytes_per_sm,  # NeuSight's cache-pressure input
    ]
    return TileView(waves=waves, roofline_us=roofline_us, inputs=transform_inputs(np.column_stack(columns)))


@contextmanager
def _single_thread(torch) -> Iterator[None]:
    """A network this small trains several times slower on two contended threads than on one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _fit_utilisation(train: TileView, utilisation: np.ndarray, val: np.ndarray, test: TileView,
                     config: NeuSightConfig) -> np.ndarray:
    """Train the utilisation network on the rows of ``train`` (early stopping on ``val``) and return the test
    rows' utilisation. Utilisation = g * (1 - a / waves) with a, g in (0, 1): NeuSight's ``g - a' / waves``
    with a' = g * a kept below g, so that a one-wave kernel's utilisation stays positive."""
    import torch
    from torch import nn

    torch.manual_seed(config.seed)
    mean = train.inputs.mean(axis=0)
    scale = train.inputs.std(axis=0)
    # A column constant in training (one spec value on every training GPU) has a rounding-error std of ~1e-15,
    # which would blow a held-out GPU's different value up to ~1e14: leave such columns unscaled.
    scale = np.where(scale > 1e-6, scale, 1.0)

    def tensor(values: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))

    x_train, x_test = tensor((train.inputs - mean) / scale), tensor((test.inputs - mean) / scale)
    waves_train, waves_test = torch.from_numpy(train.waves), torch.from_numpy(test.waves)
    target = torch.from_numpy(utilisation)
    layers: list[nn.Module] = []
    inputs = x_train.shape[1]
    for width in config.hidden:
        layers += [nn.Linear(inputs, width), nn.ReLU()]
        inputs = width
    network = nn.Sequential(*layers, nn.Linear(inputs, 2))

    def predict(rows: torch.Tensor | slice, x: torch.Tensor, waves: torch.Tensor) -> torch.Tensor:
        # g * (1 - a / w) written as g * ((w - 1) + (1 - a)) / w, with 1 - a = sigmoid(-logit_a): a one-wave
        # kernel whose a saturates keeps a small positive utilisation instead of rounding to 0.
        logit_a, logit_g = network(x[rows]).double().unbind(dim=1)
        w = waves[rows]
        return torch.sigmoid(logit_g) * ((w - 1.0) + torch.sigmoid(-logit_a)) / w

    def mape(rows: torch.Tensor) -> torch.Tensor:
        return torch.mean(torch.abs(target[rows] / predict(rows, x_train, waves_train) - 1.0))

    fit_rows = torch.from_numpy(np.flatnonzero(~val))
    val_rows = torch.from_numpy(np.flatnonzero(val if val.any() else ~val))  # tiny sets: select on the fit rows
    steps_per_epoch = -(-len(fit_rows) // config.batch_size)
    optimiser = torch.optim.AdamW(network.parameters(), lr=config.learning_rate)
    generator = torch.Generator().manual_seed(config.seed)
    best_mape, best_epoch, best_state = float("inf"), 0, None
    with _single_thread(torch):
        for epoch in range(1, min(config.max_epochs, -(-config.max_steps // steps_per_epoch)) + 1):
            for batch in fit_rows[torch.randperm(len(fit_rows), generator=generator)].split(config.batch_size):
                loss = mape(batch)
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
            with torch.no_grad():
                val_mape = float(mape(val_rows))
            if val_mape < best_mape:
                best_mape, best_epoch = val_mape, epoch
                best_state = {k: v.clone() for k, v in network.state_dict().items()}
            elif epoch - best_epoch >= config.patience_epochs:
                break
        network.load_state_dict(best_state)
        with torch.no_grad():
            return predict(slice(None), x_test, waves_test).numpy()


def neusight_fit_predict(train: KernelSamples, test: KernelSamples,
                         config: NeuSightConfig = NeuSightConfig()) -> np.ndarray:
    """Kernel time = waves x per-wave roofline time / predicted utilisation (utilisation in (0, 1)).

    The network is trained on the MAPE of the time, as the MLP estimator is; early stopping uses a hash split of
    the training shapes (:func:`split_by_shape`), so a validation shape is never fitted on."""
    _check_pair(train, test)
    train_view, test_view = tile_view(train), tile_view(test)
    val = split_by_shape(train.shape_id, config.seed, val_fraction=config.val_fraction, test_fraction=0.0).val
    utilisation = _fit_utilisation(train_view, train_view.roofline_us / train.measured_us, val, test_view, config)
    return test_view.roofline_us / utilisation


# --- Habitat ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class HabitatPrediction:
    """Habitat's times and, per row, the training GPU whose measurement was scaled ("" where the roofline
    estimator stood in because no training GPU measured that shape)."""

    predicted_us: np.ndarray
    origin_gpu: np.ndarray

    @property
    def fallback(self) -> np.ndarray:
        return self.origin_gpu == ""


def roofline_gamma(samples: KernelSamples) -> np.ndarray:
    """Habitat's memory-boundedness gamma in [0, 1] from the arithmetic intensity I and the GPU's ridge point R:
    ``1 - 0.5 I / R`` up to the ridge, ``0.5 R / I`` beyond it. ``I / R`` is the compute time over the DRAM time
    at peak, so it comes from the GPU-level cycles of the kernel's busiest compute pipe and of DRAM."""
    compute, dram = gpu_compute_cycles(samples), samples.features.column("gpu_dram_cycles")
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(dram > 0, compute / dram, np.inf)
        gamma = np.where(x <= 1.0, 1.0 - 0.5 * x, 0.5 / x)
    return np.where(compute > 0, gamma, 1.0)


def spec_distance(a: KernelSamples, a_rows: np.ndarray, b: KernelSamples, b_rows: np.ndarray) -> np.ndarray:
    """How far apart the GPUs of paired rows are: the sum over the spec vector (SMs, clock, per-SM Tensor/FMA/XU
    rates, DRAM and L2 bandwidth, L2 size, shared memory per SM) of |log1p(x_a) - log1p(x_b)|. The per-SM Tensor
    rate and shared memory separate the architecture generations; equal specs are at distance 0."""
    def spec(s: KernelSamples, rows: np.ndarray) -> np.ndarray:
        return np.log1p(np.column_stack([s.features.column(n)[rows] for n in SPEC_FEATURES]))

    return np.abs(spec(a, a_rows) - spec(b, b_rows)).sum(axis=1)


def compute_pipe(samples: KernelSamples) -> np.ndarray:
    """Index into :data:`COMPUTE_PIPES` of each kernel's busiest compute pipe (most GPU-level cycles)."""
    return np.argmax(np.vstack([samples.features.column(f"gpu_{p}_cycles") for p in COMPUTE_PIPES]), axis=0)


def sm_peak_ops_per_us(samples: KernelSamples, rows: np.ndarray, pipe: np.ndarray) -> np.ndarray:
    """One SM's peak rate on compute pipe ``pipe`` (index into :data:`COMPUTE_PIPES`) for rows ``rows``:
    clock x operations per SM per cycle."""
    rates = np.column_stack([samples.features.column(f"spec_{p}_per_sm_cycle")[rows] for p in COMPUTE_PIPES])
    return rates[np.arange(len(rows)), pipe] * samples.features.column("spec_clock_mhz")[rows]


def habitat_scale_us(origin_us: np.ndarray, origin: KernelSamples, origin_rows: np.ndarray,
                     dest: KernelSamples, dest_rows: np.ndarray) -> np.ndarray:
    """Habitat's wave scaling of measured times ``origin_us`` (rows ``origin_rows`` of ``origin``) to the GPUs of
    rows ``dest_rows`` of ``dest``:

        T_d = T_o * ceil(B_d / W_d) / ceil(B_o / W_o) * (D_o W_d / (D_d W_o))^gamma * (C_o / C_d)^(1 - gamma)

    B is the task count, W = SMs x CTAs per SM the wave size, D the DRAM bandwidth, gamma the destination's
    :func:`roofline_gamma` and C one SM's peak rate on the kernel's compute pipe. Habitat's C is the clock; the
    GPUs it was built on had equal per-SM FP32 rates, so the clock ratio was the per-SM peak ratio, which across
    Tensor-core generations it is not. A kernel that fills no wave on either GPU scales by
    ``(C_o / C_d * ceil(B_d / SMs_d) / ceil(B_o / SMs_o))^(1 - gamma)`` (Habitat's implementation)."""
    def column(s: KernelSamples, rows: np.ndarray, name: str) -> np.ndarray:
        return s.features.column(name)[rows]

    b_o, b_d = column(origin, origin_rows, "num_tasks"), column(dest, dest_rows, "num_tasks")
    sm_o, sm_d = column(origin, origin_rows, "spec_sm_count"), column(dest, dest_rows, "spec_sm_count")
    w_o = sm_o * column(origin, origin_rows, "ctas_per_sm")
    w_d = sm_d * column(dest, dest_rows, "ctas_per_sm")
    bandwidth = column(origin, origin_rows, "spec_dram_gbps") / column(dest, dest_rows, "spec_dram_gbps")
    pipe = compute_pipe(dest)[dest_rows]
    peak_o, peak_d = sm_peak_ops_per_us(origin, origin_rows, pipe), sm_peak_ops_per_us(dest, dest_rows, pipe)
    compute = np.divide(peak_o, peak_d, out=np.ones_like(peak_d), where=peak_d > 0)  # no compute: gamma is 1
    gamma = roofline_gamma(dest)[dest_rows]
    waves = np.ceil(b_d / w_d) / np.ceil(b_o / w_o)
    scaled = waves * (bandwidth * w_d / w_o) ** gamma * compute ** (1.0 - gamma)
    small = (b_o < w_o) & (b_d < w_d)
    partial = (compute * np.ceil(b_d / sm_d) / np.ceil(b_o / sm_o)) ** (1.0 - gamma)
    return origin_us * np.where(small, partial, scaled)


def habitat_predict(train: KernelSamples, test: KernelSamples) -> HabitatPrediction:
    """Scale each test row's shape from the nearest training GPU (by :func:`spec_distance`; ties to the first
    GPU name) among those that measured the same shape (same ``shape_id``, mean over repeated measurements).
    Rows whose shape no training GPU measured get the roofline estimator's time and ``origin_gpu`` ""."""
    _check_pair(train, test)
    frame = pd.DataFrame({"gpu": train.gpu, "shape": train.shape_id, "measured_us": train.measured_us})
    table = frame.reset_index().groupby(["gpu", "shape"], sort=True).agg(
        row=("index", "first"), measured_us=("measured_us", "mean"))
    n = len(test)
    best = np.full(n, np.inf)
    origin_row = np.zeros(n, dtype=np.int64)
    origin_us = np.zeros(n)
    origin_gpu = np.full(n, "", dtype=object)
    for gpu_name in table.index.get_level_values("gpu").unique():
        measured = table.loc[gpu_name]
        position = measured.index.get_indexer(pd.Index(test.shape_id))
        found = np.flatnonzero(position >= 0)
        rows = measured["row"].to_numpy()[position[found]]
        distance = spec_distance(test, found, train, rows)
        nearer = distance < best[found]
        chosen = found[nearer]
        best[chosen] = distance[nearer]
        origin_row[chosen] = rows[nearer]
        origin_us[chosen] = measured["measured_us"].to_numpy()[position[chosen]]
        origin_gpu[chosen] = gpu_name
    predicted = np.empty(n)
    scaled = np.flatnonzero(origin_gpu != "")
    predicted[scaled] = habitat_scale_us(origin_us[scaled], train, origin_row[scaled], test, scaled)
    fallback = origin_gpu == ""
    if fallback.any():
        predicted[fallback] = roofline_us(test.subset(fallback).kernels, test.gpu[fallback])
    return HabitatPrediction(predicted_us=predicted, origin_gpu=origin_gpu)


def habitat_fit_predict(train: KernelSamples, test: KernelSamples) -> np.ndarray:
    return habitat_predict(train, test).predicted_us


#: The baselines by the name ``servesim eval kernels`` prints.
BASELINES: dict[str, Callable[[KernelSamples, KernelSamples], np.ndarray]] = {
    "linear": linear_fit_predict,
    "neusight": neusight_fit_predict,
    "habitat": habitat_fit_predict,
}
