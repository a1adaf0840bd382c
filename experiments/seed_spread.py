"""How much a GEMM prediction depends on the training seed alone, on measured GPUs and on GPUs nobody measured.

Trains one category's MLP once per seed on the same seeded sample and split (as ``servesim train`` does, with the
seed of training changed only) and predicts the linear layers of Llama-3-70B at TP 4 (QKV, output, gate-up and down
projections) for m = 1 … 8,192 tokens on each GPU. For every GPU it prints the median and the largest, over those
kernels, of the seeds' spread (slowest prediction over fastest, minus one): what a user of the GPU should read as
the uncertainty the network alone adds to a kernel time. A GPU that the networks saw in training is predicted alike
by every seed; a GPU outside the training range is not. ``--spec-vector kept|dropped`` trains and predicts with or
without the GPU's spec vector (``servesim.features.SPEC_FEATURES``), as ``experiments/ablate_spec_features.py`` does; by
default the networks see what the shipped one does (``servesim.estimator.inputs.SPEC_INPUTS_LEFT_OUT``). It also
scores each seed's network, and the seeds' geometric mean (what an ensemble of them would predict), on the sample's
held-out shapes. ``--max-epochs``, ``--patience-epochs`` and ``--lr-patience-epochs`` set the training schedule
as for ``servesim train``.

    python experiments/seed_spread.py --category gemm --seed 0 --seed 1 --seed 2 --seed 3 --seed 4
"""

from __future__ import annotations

import time

import click
import numpy as np
from ablate_spec_features import spec_variants

from servesim.cli.estimator import schedule_options, train_config
from servesim.training.datasets import DataOptions, load_samples, split_by_shape
from servesim.estimator.inputs import candidate_inputs, input_names
from servesim.estimator.mlp import MlpWeights, predict_from_inputs_us
from servesim.training.train import mape, predict_samples_us, train_mlp
from servesim.features import SPEC_FEATURES
from servesim.hardware import GpuSpec, get_gpu
from servesim.kernels.types import Gemm, ScaledMM

#: (n, k) of Llama-3-70B's linear layers on one of four tensor-parallel GPUs: QKV, output, gate-up, down.
LLAMA3_70B_TP4_LINEARS = ((2560, 8192), (8192, 2048), (14336, 8192), (8192, 7168))
TOKENS = (1, 16, 64, 256, 1024, 2048, 8192)
DEFAULT_GPUS = ("H100-SXM", "H200", "B200", "L40S", "H20", "L20", "A40", "H800")


def linear_kernels(category: str) -> list:
    """The category's kernels for every token count and linear layer (FP8: vLLM's per-tensor CUTLASS linear)."""
    shapes = [(m, n, k) for m in TOKENS for n, k in LLAMA3_70B_TP4_LINEARS]
    if category == "gemm":
        return [Gemm(m=m, n=n, k=k) for m, n, k in shapes]
    return [ScaledMM(m=m, n=n, k=k, scale="tensor", library="cutlass") for m, n, k in shapes]


def predict_us(weights: MlpWeights, kernels: list, gpu: GpuSpec) -> np.ndarray:
    """Like ``predict_category_us``, from the inputs the weights were trained on (with or without the spec vector)."""
    return predict_from_inputs_us(weights, candidate_inputs(kernels, gpu))


def geometric_mean(times_us: list[np.ndarray]) -> np.ndarray:
    """The time an ensemble of the seeds' networks would predict: the geometric mean of theirs."""
    return np.exp(np.mean(np.log(np.array(times_us)), axis=0))


@click.command()
@click.option("--category", type=click.Choice(["gemm", "scaled_mm"]), default="gemm", show_default=True)
@click.option("--seed", "seeds", type=int, multiple=True, default=(0, 1, 2), show_default=True,
              help="Training seed (repeatable); the sample and split stay at --sample-seed.")
@click.option("--gpu", "gpus", multiple=True, default=DEFAULT_GPUS, show_default=True, help="GPU (repeatable).")
@click.option("--max-rows", type=int, default=40000, show_default=True)
@click.option("--sample-seed", type=int, default=0, show_default=True)
@click.option("--spec-vector", type=click.Choice(["shipped", "kept", "dropped"]), default="shipped", show_default=True,
              help="Train and predict with the GPU's spec vector, without it, or as the shipped estimator does.")
@schedule_options
def main(category: str, seeds: tuple[int, ...], gpus: tuple[str, ...], max_rows: int, sample_seed: int,
         spec_vector: str, **schedule: int | None) -> None:
    samples = load_samples(category, max_rows=max_rows, seed=sample_seed, options=DataOptions())
    names = (input_names(category, samples.features.names) if spec_vector == "shipped"
             else spec_variants(samples)[f"spec {spec_vector}"])
    split = split_by_shape(samples.shape_id, sample_seed)
    trained = set(samples.gpu)
    specs = [get_gpu(g) for g in gpus]
    kernels = linear_kernels(category)
    predicted_us = {spec.name: [] for spec in specs}
    test = samples.subset(split.test)
    test_predicted_us = []
    for seed in seeds:
        start = time.perf_counter()
        weights = train_mlp(samples, split.train, split.val,
                            train_config(seed, **schedule), names).weights
        test_predicted_us.append(predict_samples_us(weights, test))
        for spec in specs:
            if category == "scaled_mm" and "fp8" not in spec.tensor_flops_per_sm_per_cycle:
                continue
            predicted_us[spec.name].append(predict_us(weights, kernels, spec))
        click.echo(f"seed {seed}: trained in {time.perf_counter() - start:.0f} s", err=True)
    left_out = [name for name in SPEC_FEATURES if name not in names]
    spec_note = ("the whole spec vector" if len(left_out) == len(SPEC_FEATURES)
                 else ", ".join(left_out) if left_out else "nothing of the spec vector")
    click.echo(f"{category}: {len(kernels)} Llama-3-70B TP4 linears, {len(seeds)} seeds, {max_rows:,} sampled rows, "
               f"without {spec_note}")
    click.echo("MAPE % on the sample's held-out shapes (every training GPU), per seed: "
               + ", ".join(f"{mape(p, test.measured_us):.2f}" for p in test_predicted_us)
               + f"; of the seeds' geometric mean: {mape(geometric_mean(test_predicted_us), test.measured_us):.2f}")
    click.echo("GPU           in training  median spread %  largest spread %")
    for spec in specs:
        if not predicted_us[spec.name]:
            click.echo(f"{spec.name:<13} no {category} kernel on this GPU")
            continue
        times = np.array(predicted_us[spec.name])
        spread_pct = 100 * (times.max(axis=0) / times.min(axis=0) - 1)
        click.echo(f"{spec.name:<13} {'yes' if spec.name in trained else 'no':<11}  {np.median(spread_pct):>15.1f}  "
                   f"{spread_pct.max():>16.1f}")


if __name__ == "__main__":
    main()
