"""The kernel-time baselines the MLP is scored against: linear regression, NeuSight-style tiles, Habitat."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from servesim.errors import ServesimError
from servesim.training.baselines import (
    BASELINES,
    aggregate_times_us,
    habitat_predict,
    linear_fit_predict,
    neusight_fit_predict,
    wave_roofline_cycles,
)
from servesim.training.datasets import load_samples, samples_from_frame, split_by_shape
from servesim.training.train import mape, roofline_samples_us
from servesim.hardware import get_gpu
from servesim.kernels.types import Gemm

pytest.importorskip("aiconfigurator_core")  # the measured tables


@pytest.fixture(scope="module")
def samples():
    return load_samples("gemm", max_rows=3000, seed=0)


@pytest.fixture(scope="module")
def shape_split(samples):
    split = split_by_shape(samples.shape_id, seed=0, val_fraction=0.0, test_fraction=0.2)
    return samples.subset(split.train), samples.subset(split.test)


def constant_mape(train, test) -> float:
    """MAPE of predicting every test row as the median training time."""
    return mape(np.full(len(test), np.median(train.measured_us)), test.measured_us)


def gemm_rows(rows: list[tuple[str, int, int, int, float]]):
    frame = pd.DataFrame(rows, columns=["gpu", "m", "n", "k", "latency_us"])
    frame = frame.assign(dtype="bf16", system="synthetic", backend="vllm", kernel_source="cublas")
    return samples_from_frame("gemm", frame)


def test_each_baseline_predicts_one_positive_time_per_held_out_row_and_beats_a_constant(shape_split):
    train, test = shape_split
    for name, fit_predict in BASELINES.items():
        predicted = fit_predict(train, test)
        assert predicted.shape == (len(test),), name
        assert np.all(np.isfinite(predicted)) and np.all(predicted > 0), name
    for fit_predict in (linear_fit_predict, neusight_fit_predict):  # Habitat needs the shape measured elsewhere
        assert mape(fit_predict(train, test), test.measured_us) < 0.5 * constant_mape(train, test)


def test_neusight_is_deterministic_for_a_seed(shape_split):
    train, test = shape_split
    np.testing.assert_array_equal(neusight_fit_predict(train, test), neusight_fit_predict(train, test))


def test_leave_one_gpu_out(samples):
    held = samples.gpu == "H200"
    train, test = samples.subset(~held), samples.subset(held)
    for name, fit_predict in BASELINES.items():
        predicted = fit_predict(train, test)
        assert predicted.shape == (len(test),) and np.all(np.isfinite(predicted) & (predicted > 0)), name
        assert mape(predicted, test.measured_us) < constant_mape(train, test), name
    habitat = habitat_predict(train, test)
    origins = set(habitat.origin_gpu[~habitat.fallback])
    assert origins and "H200" not in origins
    scaled = ~habitat.fallback
    assert mape(habitat.predicted_us[scaled], test.measured_us[scaled]) < constant_mape(train, test)


def test_linear_recovers_an_exactly_linear_target(samples):
    compute_us, memory_us = aggregate_times_us(samples).T
    target = dataclasses.replace(samples, measured_us=3.0 * compute_us + 0.5 * memory_us + 4.0)
    train = target.subset(samples.gpu != "B200")
    test = target.subset(samples.gpu == "B200")
    np.testing.assert_allclose(linear_fit_predict(train, test), test.measured_us, rtol=1e-6)


def test_habitat_scales_a_memory_bound_kernel_by_the_bandwidth_ratio_from_the_nearest_gpu():
    m, n, k = 64, 65536, 8192  # 512 tiles: several waves on 132 SMs; 0.3 FLOP/byte of the ridge point
    train = gemm_rows([("H100-SXM", m, n, k, 1000.0), ("L40S", m, n, k, 5000.0)])
    test = gemm_rows([("H200", m, n, k, 1.0)])
    prediction = habitat_predict(train, test)
    assert list(prediction.origin_gpu) == ["H100-SXM"]  # same SMs, clock and rates as H200; L40S is further
    h100, h200 = get_gpu("H100-SXM"), get_gpu("H200")
    kernel = Gemm(m=m, n=n, k=k)
    intensity = kernel.flops() / kernel.bytes_moved()
    ridge = h200.tensor_tflops("bf16") * 1e12 / (h200.dram_bandwidth_gbps * 1e9)
    gamma = 1.0 - 0.5 * intensity / ridge
    assert 0.5 < gamma < 1.0
    expected = 1000.0 * (h100.dram_bandwidth_gbps / h200.dram_bandwidth_gbps) ** gamma
    np.testing.assert_allclose(prediction.predicted_us, [expected], rtol=1e-9)


def test_habitat_gives_unmeasured_shapes_the_roofline_and_says_so():
    train = gemm_rows([("H100-SXM", 64, 65536, 8192, 1000.0)])
    test = gemm_rows([("H200", 64, 65536, 8192, 1.0), ("H200", 4096, 4096, 4096, 1.0)])
    prediction = habitat_predict(train, test)
    assert list(prediction.fallback) == [False, True]
    assert prediction.predicted_us[1] == roofline_samples_us(test.subset(np.array([False, True])))[0]


def test_neusight_wave_roofline_counts_only_the_tiles_of_the_last_wave():
    tasks, sms, ctas = np.array([133.0]), np.array([132.0]), np.array([1.0])
    # Compute-bound: two waves of one tile per SM each take one tile's time.
    compute_only = wave_roofline_cycles(tasks, sms, ctas, np.array([133.0]), np.array([0.0]))
    np.testing.assert_allclose(compute_only, [2 * 132.0])
    # Memory-bound: the lone tile of the second wave moves its own bytes only, so waves add up to the total.
    memory_only = wave_roofline_cycles(tasks, sms, ctas, np.array([0.0]), np.array([1330.0]))
    np.testing.assert_allclose(memory_only, [1330.0])


def test_baselines_reject_an_empty_training_set(shape_split):
    train, test = shape_split
    empty = train.subset(np.zeros(len(train), dtype=bool))
    for fit_predict in BASELINES.values():
        with pytest.raises(ServesimError, match="at least one measured training row"):
            fit_predict(empty, test)
