"""Kernel time estimators: the SynPerf-style MLP, and analytical baselines such as the roofline."""

from servesim.estimator.base import ESTIMATORS, KernelEstimator, get_estimator

__all__ = ["ESTIMATORS", "KernelEstimator", "get_estimator"]
