"""servesim's Gated DeltaNet kernel times (the roofline: no network learns these categories) against
aiconfigurator-core's measured ``linear_attention/<engine>/<version>/gdn_perf.parquet`` tables.

Each row is one kernel on one GPU: ``causal_conv1d_fn`` and the chunked delta rule (``chunk_gated_delta_rule``,
vLLM's ``..._flashinfer``) for ``batch_size`` prompts of ``seq_len`` tokens (phase ``context``),
``causal_conv1d_update`` and the packed recurrent decode for ``batch_size`` decoding requests (phase
``generation``), with the heads one GPU holds (``num_k_heads``, ``num_v_heads``) of the Qwen3.5 family. They are
timed as servesim's :class:`CausalConv1d`, :class:`GatedDeltaRuleChunk` and :class:`GatedDeltaRuleDecode` with a
BF16 input and an FP32 state, and the script prints, per GPU, engine and kernel, the rows, the median of measured
over predicted time and the MAPE.

    python experiments/gdn_compare.py [--gpu H100-SXM --gpu B200 ...]
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from servesim.data.aiconfigurator import MEASURED_GPUS, package_dir
from servesim.estimator import get_estimator
from servesim.hardware import get_gpu
from servesim.kernels.types import GDN_CHUNK_TOKENS, CausalConv1d, GatedDeltaRuleChunk, GatedDeltaRuleDecode

ENGINES = {"vllm": "0.24.0", "sglang": "0.5.14"}


def _kernel(row) -> object:
    b, s = int(row.batch_size), int(row.seq_len)
    heads = dict(key_heads=int(row.num_k_heads), value_heads=int(row.num_v_heads), key_head_dim=int(row.head_k_dim),
                 value_head_dim=int(row.head_v_dim), state_dtype="fp32")
    channels = 2 * int(row.num_k_heads) * int(row.head_k_dim) + int(row.num_v_heads) * int(row.head_v_dim)
    if row.phase == "context":
        if row.kernel_source.startswith("causal_conv1d"):
            return CausalConv1d(tokens=b * s, requests=b, channels=channels, kernel_width=int(row.d_conv))
        return GatedDeltaRuleChunk(tokens=b * s, requests=b, chunks=b * -(-s // GDN_CHUNK_TOKENS), **heads)
    if row.kernel_source.startswith("causal_conv1d"):
        return CausalConv1d(tokens=b, requests=b, channels=channels, kernel_width=int(row.d_conv))
    return GatedDeltaRuleDecode(tokens=b, requests=b, **heads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="append", default=None, help="servesim GPU names [default: all measured]")
    args = parser.parse_args()
    estimator = get_estimator("roofline")
    lines = []
    for system, gpu_name in MEASURED_GPUS.items():
        if args.gpu and gpu_name not in args.gpu:
            continue
        for engine, version in ENGINES.items():
            path = package_dir() / "systems" / "data" / system / "linear_attention" / engine / version / "gdn_perf.parquet"
            if not path.exists():
                continue
            frame = pd.read_parquet(path)
            kernels = [_kernel(row) for row in frame.itertuples()]
            predicted_us = estimator.predict_us(kernels, get_gpu(gpu_name))
            frame["measured_us"] = frame["latency"] * 1e3  # the tables store milliseconds
            frame["ratio"] = frame["measured_us"] / predicted_us
            for (source, phase), rows in frame.groupby(["kernel_source", "phase"]):
                ape = np.abs(1.0 / rows["ratio"] - 1.0)
                lines.append((gpu_name, engine, source, phase, len(rows), rows["ratio"].median(), 100 * ape.mean()))
    table = pd.DataFrame(lines, columns=["gpu", "engine", "kernel", "phase", "rows", "measured/roofline (median)",
                                         "roofline MAPE %"])
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))


if __name__ == "__main__":
    main()
