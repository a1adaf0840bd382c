"""Training the per-category MLPs with torch on CPU, deterministically from a seed, and scoring predictors.

The network is three hidden layers (256, 128, 64) of Linear -> BatchNorm -> ReLU -> Dropout(0.1) and a scaled
sigmoid output (see :mod:`servesim.estimator.mlp`). The loss is the MAPE of the predicted *time*:
``|t_theoretical / e_pred - t_measured| / t_measured = |e_true / e_pred - 1|``. AdamW, mini-batches, the learning
rate halved when the validation MAPE stalls, early stopping on it; the best epoch's weights are kept. torch is
imported only here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from servesim.training.baselines import BASELINES
from servesim.training.datasets import KernelSamples, split_by_shape
from servesim.estimator.inputs import input_names
from servesim.estimator.mlp import MlpWeights, predict_from_inputs_us, transform_inputs
from servesim.estimator.roofline import roofline_us


@dataclass(frozen=True)
class TrainConfig:
    hidden: tuple[int, ...] = (256, 128, 64)
    dropout: float = 0.1
    learning_rate: float = 2e-3
    weight_decay: float = 1e-4
    batch_size: int = 512
    max_epochs: int = 80
    patience_epochs: int = 10  # early stopping: epochs without a better validation MAPE
    lr_patience_epochs: int = 3  # the learning rate halves after this many epochs without improvement
    min_epoch_rows: int = 0  # an epoch makes as many passes over the training rows as reach this (epoch_passes)
    efficiency_max: float | None = None  # None: from the training targets (see efficiency_ceiling)
    seed: int = 0
    threads: int = 1  # the network is small: more threads only contend on a shared CPU


@dataclass(frozen=True, eq=False)
class TrainResult:
    weights: MlpWeights
    epochs: int
    best_val_mape: float
    seconds: float


def efficiency_ceiling(efficiency: np.ndarray) -> float:
    """The output range of a category's network: the smallest power of two at or above the 99.9th percentile of
    its training efficiencies, at least 1. Rows above it (the rarest pessimistic theoretical times) are predicted
    at the ceiling; a tighter range keeps the sigmoid's working region where the data is."""
    return float(2.0 ** max(0.0, np.ceil(np.log2(np.quantile(efficiency, 0.999)))))


def category_latency_floor_us(measured_us: np.ndarray, gpu: np.ndarray) -> float:
    """A category's latency floor: the median over GPUs of each GPU's 1st percentile of measured times, i.e.
    what the category's smallest kernels take on a typical GPU."""
    return float(np.median([np.quantile(measured_us[gpu == g], 0.01) for g in np.unique(gpu)]))


def epoch_passes(train_rows: int, min_epoch_rows: int) -> int:
    """Passes over the training rows per epoch, each reshuffled: as many as reach ``min_epoch_rows``, at least
    one. The schedule counts epochs, so without this a leave-one-GPU-out retraining on a 40,000-row sample
    (29,000 training rows) takes a twentieth of the optimiser steps per patience window that the shipped scaled-MM
    training on 600,000 rows takes."""
    return max(1, -(-min_epoch_rows // max(train_rows, 1)))


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute percentage error, in percent."""
    return float(np.mean(np.abs(predicted / measured - 1.0)) * 100.0)


def _network(inputs: int, config: TrainConfig):
    import torch
    from torch import nn

    layers: list[nn.Module] = []
    for width in config.hidden:
        layers += [nn.Linear(inputs, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Dropout(config.dropout)]
        inputs = width
    layers.append(nn.Linear(inputs, 1))
    return nn.Sequential(*layers).to(torch.float32)


def export_weights(network, category: str, feature_names: tuple[str, ...], input_mean: np.ndarray,
                   input_scale: np.ndarray, fixed_inputs: np.ndarray, efficiency_max: float, latency_floor_us: float,
                   metadata: dict[str, str]) -> MlpWeights:
    """numpy weights of a trained torch network with each batch norm folded into the linear layer before it."""
    from torch import nn

    modules = list(network)
    layers = []
    for i, module in enumerate(modules):
        if not isinstance(module, nn.Linear):
            continue
        w = module.weight.detach().double().numpy().T
        b = module.bias.detach().double().numpy()
        following = modules[i + 1] if i + 1 < len(modules) else None
        if isinstance(following, nn.BatchNorm1d):
            scale = (following.weight.detach().double().numpy()
                     / np.sqrt(following.running_var.double().numpy() + following.eps))
            w = w * scale
            b = (b - following.running_mean.double().numpy()) * scale + following.bias.detach().double().numpy()
        layers.append((w.astype(np.float32), b.astype(np.float32)))
    return MlpWeights(category, feature_names, input_mean, input_scale, fixed_inputs, tuple(layers),
                      efficiency_max, latency_floor_us, metadata)


def train_mlp(samples: KernelSamples, train: np.ndarray, val: np.ndarray, config: TrainConfig = TrainConfig(),
              inputs_used: Sequence[str] | None = None,
              on_epoch: Callable[[int, float, float], None] | None = None) -> TrainResult:
    """Train on the rows of ``train``, stop early on the MAPE of ``val``; deterministic for a given seed. The
    network sees ``inputs_used`` of the samples' features, by default the category's (``inputs.input_names``).
    ``on_epoch(epoch, validation MAPE %, best so far %)`` is called after each epoch (progress reporting)."""
    import torch

    start = time.perf_counter()
    torch.manual_seed(config.seed)
    torch.set_num_threads(config.threads)
    names = input_names(samples.category, samples.features.names) if inputs_used is None else tuple(inputs_used)
    inputs = transform_inputs(samples.features.select(names).values)
    mean = inputs[train].mean(axis=0)
    scale = inputs[train].std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    normalised = (inputs - mean) / scale
    first = normalised[np.flatnonzero(train)[0]]
    fixed = np.where(np.ptp(inputs[train], axis=0) == 0, first, np.nan)  # see forward_efficiency
    x = torch.from_numpy(normalised.astype(np.float32))
    floor_us = category_latency_floor_us(samples.measured_us[train], samples.gpu[train])
    efficiency_target = (samples.theoretical_us + floor_us) / samples.measured_us
    target = torch.from_numpy(efficiency_target.astype(np.float32))
    train_rows = torch.from_numpy(np.flatnonzero(train))
    val_rows = torch.from_numpy(np.flatnonzero(val))
    efficiency_max = config.efficiency_max or efficiency_ceiling(efficiency_target[train])
    network = _network(x.shape[1], config)
    optimiser = torch.optim.AdamW(network.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimiser, factor=0.5,
                                                           patience=config.lr_patience_epochs)
    generator = torch.Generator().manual_seed(config.seed)
    passes = epoch_passes(len(train_rows), config.min_epoch_rows)

    def efficiency(rows: torch.Tensor) -> torch.Tensor:
        return efficiency_max * torch.sigmoid(network(x[rows])[:, 0])

    best = (float("inf"), 0, None)
    epoch = 0
    for epoch in range(1, config.max_epochs + 1):
        network.train()
        order = torch.cat([train_rows[torch.randperm(len(train_rows), generator=generator)] for _ in range(passes)])
        for batch in order.split(config.batch_size):
            if len(batch) < 2:  # batch norm needs two rows
                continue
            loss = torch.mean(torch.abs(target[batch] / efficiency(batch).clamp_min(1e-6) - 1.0))
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        network.eval()
        with torch.no_grad():
            val_mape = float(torch.mean(torch.abs(target[val_rows] / efficiency(val_rows) - 1.0))) * 100.0
        scheduler.step(val_mape)
        if val_mape < best[0]:
            best = (val_mape, epoch, {k: v.clone() for k, v in network.state_dict().items()})
        if on_epoch is not None:
            on_epoch(epoch, val_mape, best[0])
        if epoch - best[1] >= config.patience_epochs:
            break
    network.load_state_dict(best[2])
    network.eval()
    seconds = time.perf_counter() - start
    gpus = sorted(set(samples.gpu[train]))
    metadata = {
        "seed": str(config.seed), "train_rows": str(int(train.sum())), "val_rows": str(int(val.sum())),
        "gpus": ",".join(gpus), "epochs": str(epoch), "best_epoch": str(best[1]),
        "patience_epochs": str(config.patience_epochs), "lr_patience_epochs": str(config.lr_patience_epochs),
        "passes_per_epoch": str(passes),
        "best_val_mape_pct": f"{best[0]:.2f}", "train_seconds": f"{seconds:.1f}", "torch": torch.__version__,
    }
    weights = export_weights(network, samples.category, names, mean, scale, fixed, efficiency_max, floor_us,
                             metadata)
    return TrainResult(weights=weights, epochs=epoch, best_val_mape=best[0], seconds=seconds)


def predict_samples_us(weights: MlpWeights, samples: KernelSamples) -> np.ndarray:
    """The MLP's times for measured samples, from their already computed features (those the weights use)."""
    return predict_from_inputs_us(weights, samples.features)


def never_trained_on(weights: MlpWeights, shape_id: np.ndarray) -> np.ndarray:
    """The rows whose shapes ``weights``' own training held out for testing: the test split of the seed they were
    trained with (their metadata). Seen-GPU scores use it whatever seed a sample was drawn with, since another
    seed's test split is mostly shapes the weights were trained on."""
    return split_by_shape(shape_id, int(weights.metadata["seed"])).test


def roofline_samples_us(samples: KernelSamples) -> np.ndarray:
    """The roofline estimator's times for measured samples, GPU by GPU."""
    return roofline_us(samples.kernels, samples.gpu)


#: The predictors ``servesim eval kernels`` scores, in its column order.
PREDICTORS = ("roofline", *BASELINES, "mlp")


def predictor_times_us(train: KernelSamples, test: KernelSamples, mlp_us: np.ndarray) -> dict[str, np.ndarray]:
    """Every predictor's times for ``test``: the roofline, each baseline fitted on ``train``, and the MLP's."""
    return {"roofline": roofline_samples_us(test), **{name: fit(train, test) for name, fit in BASELINES.items()},
            "mlp": mlp_us}


def mape_by_gpu(samples: KernelSamples, predictions_us: dict[str, np.ndarray]) -> list[dict[str, object]]:
    """One row per report group (the GPU, or "<GPU> (local)" for our own collections) and one for all rows: the
    sample count and each predictor's MAPE in percent."""
    groups = [(str(g), samples.group == g) for g in np.unique(samples.group)]
    groups.append(("all", np.ones(len(samples), bool)))
    return [
        {"gpu": name, "rows": int(mask.sum()),
         **{p: mape(pred[mask], samples.measured_us[mask]) for p, pred in predictions_us.items()}}
        for name, mask in groups
    ]
