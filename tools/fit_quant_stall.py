"""Fit the two constants of vLLM's per-tensor quantisation stall in servesim/estimator/roofline.py
(``vllm_quant_stall_us``); it prints them for that file.

aiconfigurator times each engine's whole FP8 linear layer with per-tensor weight scales: vLLM's quantises the
activations with one scale for the tensor (abs-max kernel, then conversion: two reads of the activations), SGLang's
with one scale per token (one kernel, one read); both then run a CUTLASS-based scaled MM. For the same shape on the
same GPU, the difference of their times, for m >= 1,024 where the quantisation is a large share, is the difference
of their quantisations: vLLM's extra read and its stall (its unvectorised abs-max loads and its per-row atomics),
each read from L2 or DRAM as the timing loop left it (servesim.training.datasets.harness_quantize_kernels). The fit
uses the H100, B200 and GB200 only (the GPUs design choices are checked on, none of the five test GPUs of
docs/accuracy.md); the other GPUs are fitted alone for comparison.

    python tools/fit_quant_stall.py
"""

from __future__ import annotations

import click
import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from servesim.training.datasets import LOCAL_SYSTEM, fp8_linear_rows, harness_quantize_kernels
from servesim.estimator.roofline import roofline_us, traffic_us, vllm_quant_stall_us
from servesim.hardware import get_gpu
from servesim.kernels.types import dtype_bytes

FIT_GPUS = ("H100-SXM", "B200", "GB200")
SCALED_MM_LIBRARIES = ("cutlass", "sgl_kernel")


def matched_times(min_m: int) -> pd.DataFrame:
    """Per (GPU, m, n, k) where both engines' per-tensor FP8 linears were measured: each engine's median time
    (``vllm``, ``sglang``), the modelled time of SGLang's quantisation (``sglang_quant_us``) and, for vLLM's, its
    traffic time and one read of its input (``vllm_traffic_us``, ``vllm_read_us``), both as the loop ran them."""
    rows = fp8_linear_rows()
    rows = rows[(rows["system"].astype(str) != LOCAL_SYSTEM) & rows["library"].isin(SCALED_MM_LIBRARIES)
                & (rows["m"] >= min_m)].reset_index(drop=True)
    quantize = harness_quantize_kernels(rows)
    modelled = roofline_us(quantize, rows["gpu"].astype(str).tolist())
    traffic = np.empty(len(rows))
    read = np.empty(len(rows))
    for gpu_name, at in rows.groupby("gpu", observed=True).indices.items():
        gpu = get_gpu(str(gpu_name))
        kernels = [quantize[i] for i in at]
        resident = np.array([q.l2_resident_fraction for q in kernels])
        traffic[at] = traffic_us(np.array([q.bytes_moved() for q in kernels]), resident, gpu)
        read[at] = traffic_us(np.array([q.rows * q.cols * dtype_bytes(q.in_dtype) for q in kernels]), resident, gpu)
    rows = rows.assign(engine=rows["backend"].astype(str), quant_us=modelled, traffic_us=traffic, read_us=read)
    keys = ["gpu", "m", "n", "k"]
    by_engine = rows.groupby([*keys, "engine"], observed=True).agg(
        latency_us=("latency_us", "median"), quant_us=("quant_us", "first"), traffic_us=("traffic_us", "first"),
        read_us=("read_us", "first")).unstack("engine")
    matched = pd.DataFrame({
        "vllm": by_engine["latency_us"]["vllm"], "sglang": by_engine["latency_us"]["sglang"],
        "sglang_quant_us": by_engine["quant_us"]["sglang"], "vllm_traffic_us": by_engine["traffic_us"]["vllm"],
        "vllm_read_us": by_engine["read_us"]["vllm"]})
    return matched.dropna().reset_index()


def fit(frame: pd.DataFrame) -> tuple[float, float]:
    """(load latency cycles, atomic cycles) minimising the error of the modelled difference of the engines'
    quantisations relative to vLLM's time."""
    parts = [(get_gpu(str(g)), part) for g, part in frame.groupby("gpu", observed=True)]
    measured = np.concatenate([(p["vllm"] - p["sglang"]).to_numpy() for _, p in parts])
    scale = np.concatenate([p["vllm"].to_numpy() for _, p in parts])

    def residuals(params: np.ndarray) -> np.ndarray:
        model = np.concatenate([
            p["vllm_traffic_us"].to_numpy() - p["sglang_quant_us"].to_numpy()
            + vllm_quant_stall_us(p["m"].to_numpy(), p["k"].to_numpy(), p["vllm_read_us"].to_numpy(), gpu, *params)
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
