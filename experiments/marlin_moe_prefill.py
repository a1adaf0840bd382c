"""How much slower vLLM's Marlin MoE (4-bit weights dequantised to BF16 inside a GEMV-oriented kernel) is than its
Triton fused MoE with BF16 weights, per GPU and token band, from aiconfigurator-core's measured vLLM MoE tables.

Both multiply in BF16, so the ratio isolates the kernel. Rows are matched on version, shape (hidden, intermediate,
experts, top-k, MoE TP), token count and balanced routing without expert parallelism; every version of the tables
is read (the loaders in servesim.data.aiconfigurator keep only the newest, which has few Marlin rows).

    python experiments/marlin_moe_prefill.py
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from servesim.data.aiconfigurator import MEASURED_GPUS, package_dir

SHAPE = ["version", "hidden_size", "inter_size", "num_experts", "topk", "moe_tp_size", "num_tokens"]
BANDS = (0, 8, 64, 512, 2048, 16384)


def measured_moe() -> pd.DataFrame:
    parts = []
    for path in sorted((package_dir() / "systems" / "data").glob("*/moe/vllm/*/moe_perf.parquet")):
        frame = pd.read_parquet(path)
        parts.append(frame.assign(gpu=MEASURED_GPUS.get(path.parts[-5], path.parts[-5])))
    frame = pd.concat(parts, ignore_index=True)
    return frame[(frame["distribution"] == "balanced") & (frame["moe_ep_size"] == 1)]


def main() -> None:
    frame = measured_moe()
    marlin = frame[frame["kernel_source"].str.contains("marlin")]
    triton_bf16 = frame[(frame["moe_dtype"] == "bfloat16") & ~frame["kernel_source"].str.contains("marlin")]
    pairs = marlin.merge(triton_bf16, on=["gpu", *SHAPE], suffixes=("_marlin", "_bf16"))
    pairs["ratio"] = pairs["latency_marlin"] / pairs["latency_bf16"]
    pairs["tokens"] = pd.cut(pairs["num_tokens"], BANDS)
    table = pairs.groupby(["gpu", "tokens"], observed=True)["ratio"].agg(
        pairs="size", median="median", p10=lambda r: np.percentile(r, 10), p90=lambda r: np.percentile(r, 90))
    print("Marlin 4-bit MoE time / Triton BF16 fused-MoE time, same shape and tokens (vLLM, measured)")
    with pd.option_context("display.width", 160, "display.max_rows", 200):
        print(table.round(2).to_string())


if __name__ == "__main__":
    main()
