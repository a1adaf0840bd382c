"""Fit the two constants of vLLM's per-tensor quantisation stall (servesim.estimator.roofline.vllm_quant_stall_us).

aiconfigurator times each engine's whole FP8 linear layer with per-tensor weight scales: vLLM's quantises the
activations with one scale for the tensor (abs-max kernel, then conversion: two reads of the activations), SGLang's
with one scale per token (one kernel, one read); both then run a CUTLASS-based scaled MM. For the same shape on the
same GPU, the difference of their times, for m >= 1,024 where the quantisation is a large share, is vLLM's extra
read and its stall: its unvectorised abs-max loads and its per-row atomics. The fit uses the H100, B200 and GB200
only (the GPUs design choices are checked on, none of the five test GPUs of docs/accuracy.md); the other GPUs are
fitted alone for comparison.

    python scripts/fit_quant_stall.py
"""

from __future__ import annotations

import click
import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from servesim.data.aiconfigurator import load_gemm
from servesim.estimator.roofline import vllm_quant_stall_us
from servesim.hardware import get_gpu

SOURCES = {"CutlassFP8ScaledMMLinearKernel": "vllm", "sglang_sgl_kernel_fp8_scaled_mm": "sglang"}
FIT_GPUS = ("H100-SXM", "B200", "GB200")


def matched_times(min_m: int) -> pd.DataFrame:
    """Median vLLM and SGLang per-tensor FP8 linear times per (GPU, m, n, k), where both were measured."""
    rows = load_gemm(dtypes=("fp8",))
    rows = rows[rows["kernel_source"].astype(str).isin(SOURCES) & (rows["m"] >= min_m)]
    engine = rows["kernel_source"].astype(str).map(SOURCES).rename("engine")
    times = rows["latency_us"].groupby([rows["gpu"], rows["m"], rows["n"], rows["k"], engine], observed=True)
    return times.median().unstack("engine").dropna().reset_index()


def fit(frame: pd.DataFrame) -> tuple[float, float]:
    """(load latency cycles, atomic cycles) minimising the stall's error relative to vLLM's time."""
    parts = [(get_gpu(str(g)), part) for g, part in frame.groupby("gpu", observed=True)]
    measured = np.concatenate([(p["vllm"] - p["sglang"]).to_numpy() for _, p in parts])
    scale = np.concatenate([p["vllm"].to_numpy() for _, p in parts])

    def residuals(params: np.ndarray) -> np.ndarray:
        model = np.concatenate([
            vllm_quant_stall_us(p["m"].to_numpy(), p["k"].to_numpy(), 2.0, gpu, *params)
            + (p["m"] * p["k"]).to_numpy() * 2.0 / (gpu.dram_bandwidth_gbps * 1e3)  # vLLM's second read
            for gpu, p in parts])
        return (model - measured) / scale

    result = least_squares(residuals, x0=[600.0, 10.0], bounds=([0.0, 0.0], [5000.0, 200.0]))
    return float(result.x[0]), float(result.x[1])


@click.command()
@click.option("--min-m", type=int, default=1024, show_default=True, help="Smallest m of the rows fitted.")
def main(min_m: int) -> None:
    frame = matched_times(min_m)
    latency, atomic = fit(frame[frame["gpu"].isin(FIT_GPUS)])
    click.echo(f"fitted on {', '.join(FIT_GPUS)}: load latency {latency:.0f} cycles, atomic {atomic:.1f} cycles")
    click.echo(f"{'GPU alone':<14} {'shapes':>6}  {'latency cycles':>14}  {'atomic cycles':>13}")
    for gpu, part in frame.groupby("gpu", observed=True):
        latency, atomic = fit(part)
        click.echo(f"{str(gpu):<14} {len(part):>6}  {latency:>14.0f}  {atomic:>13.1f}")


if __name__ == "__main__":
    main()
