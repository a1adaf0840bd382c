"""A measured check of the traffic model behind the FP8 quantisation: vLLM's FP8 conversion with a given scale
(``static_scaled_fp8_quant``, the second pass of its dynamic per-tensor quantisation) against the roofline's
memory time of its bytes (one BF16 read, one FP8 write), per GPU and by how many times its collector's working
set fills L2.

aiconfigurator's collector (``collect_computescale.py``) converts one input five times in a row, into an output
reallocated from the same block, so the input and output stay in L2 when together they fit there. The roofline
moves what L2 holds at the catalogue's L2 bandwidth and the rest at its DRAM bandwidth
(``servesim.estimator.roofline.traffic_us``); this prints the median of measured over modelled time with the
working set taken as found in L2 where it fits (``aware``) and taken from DRAM throughout (``cold``), and the
``aware`` model's MAPE. The conversion is a vectorised stream, so a ratio near 1 says the bandwidths hold.

    python experiments/fp8_convert_check.py
"""

from __future__ import annotations

import click
import numpy as np
import pandas as pd

from servesim.data.aiconfigurator import load_fp8_convert
from servesim.estimator.roofline import MIN_KERNEL_US, traffic_us
from servesim.training.train import mape
from servesim.hardware import get_gpu

BANDS = (0.0, 0.25, 1.0, 4.0, np.inf)


@click.command()
def main() -> None:
    rows = load_fp8_convert()
    parts = []
    for gpu_name, part in rows.groupby("gpu", observed=True):
        gpu = get_gpu(str(gpu_name))
        elems = part["m"].to_numpy(dtype=float) * part["k"].to_numpy(dtype=float)
        bytes_moved = 3.0 * elems  # BF16 in, FP8 out
        fill = bytes_moved / gpu.l2_cache_bytes
        aware = np.maximum(traffic_us(bytes_moved, (fill <= 1.0).astype(float), gpu), MIN_KERNEL_US)
        cold = np.maximum(traffic_us(bytes_moved, 0.0, gpu), MIN_KERNEL_US)
        parts.append(part.assign(aware_us=aware, cold_us=cold, band=pd.cut(fill, BANDS)))
    table = pd.concat(parts, ignore_index=True)
    click.echo(f"vLLM static_scaled_fp8_quant, {len(table):,} measured rows: measured / modelled time, median, by "
               "the working set (input + output) over L2")
    click.echo(f"{'GPU':<14} {'working set / L2':<16} {'rows':>5}  {'aware':>6}  {'cold':>6}  {'aware MAPE %':>12}")
    for (gpu, band), part in table.groupby(["gpu", "band"], observed=True):
        click.echo(f"{gpu:<14} {str(band):<16} {len(part):>5}  {np.median(part.latency_us / part.aware_us):>6.2f}  "
                   f"{np.median(part.latency_us / part.cold_us):>6.2f}  {mape(part.aware_us, part.latency_us):>12.1f}")


if __name__ == "__main__":
    main()
