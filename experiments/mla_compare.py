"""servesim's MLA timings against aiconfigurator-core's measured MLA tables, MAPE per GPU.

Two comparisons, each on the bf16-KV rows of the tables the installed aiconfigurator-core ships:

- ``sglang``: the attention kernel alone (``mla/sglang/<current>/context_mla_perf`` and ``generation_mla_perf``,
  ``num_heads`` heads on one GPU) against servesim's MLA attention kernels under SGLang: a prefill of
  ``batch_size`` prompts of ``isl`` tokens in the MHA form (192/128-wide heads), a decode of ``batch_size`` requests
  over ``step`` cached tokens as the latent MQA (576/512);
- ``vllm``: the attention module (``mla/vllm/<current>/mla_context_module_perf`` and ``mla_generation_module_perf``:
  projections, norms, rotary, cache write, attention and o_proj of one DeepSeek-V3 layer with ``num_heads`` heads)
  against the sum of the same ops of servesim's vLLM expansion (BF16 or FP8 block-scaled linears as
  ``gemm_type`` says).

SGLang's prefill rows are also timed in MLA's absorbed form (the latent MQA over 576/512-wide keys and values),
the form SGLang runs a prefill batch with a short cached prefix in: the ``absorbed`` lines.

Rows are subsampled (``--rows-per-gpu``, a fixed seed) to keep the run short.

    python experiments/mla_compare.py [--rows-per-gpu 300]
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pandas as pd

from servesim.data.aiconfigurator import _read_table
from servesim.estimator import get_estimator
from servesim.hardware import get_gpu
from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.kernels.expand import expand
from servesim.kernels.types import AttentionDecode, AttentionPrefill, Kernel
from servesim.models import get_model

SYSTEMS = ("h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm")
#: Rows measured at or above this are also reported apart: below it the vLLM module's eager launches dominate.
LONG_US = 500.0
#: Ops of an MLA layer that aiconfigurator's vLLM attention module covers (input norm, all-reduce and MLP left out).
_MODULE_END = "attn.all_reduce"


def _model(heads: int):
    return dataclasses.replace(get_model("deepseek-v3"), num_attention_heads=heads, num_kv_heads=heads)


def _batch(row) -> BatchSpec:
    if row["phase"] == "context":
        return BatchSpec((PrefillChunk(int(row["isl"])),) * int(row["batch_size"]))
    return BatchSpec(decodes=(int(row["step"]),) * int(row["batch_size"]))


def _layer_kernels(engine: str, row, dtype: str, attention_only: bool) -> list[Kernel]:
    step = expand(engine, _model(int(row["num_heads"])), get_gpu(row["gpu"]), _batch(row), tp=1, dtype=dtype)
    ops = step.layer_ops(0)
    first = 1  # after input_layernorm
    last = next(i for i, op in enumerate(ops) if op.name in (_MODULE_END, "post_attention_layernorm"))
    kernels = [op for op in ops[first:last] if isinstance(op, Kernel)]
    if attention_only:
        kernels = [k for k in kernels if isinstance(k, (AttentionPrefill, AttentionDecode))]
    return kernels


def _rows(backend: str, tables: tuple[str, str], systems, per_gpu: int, seed: int) -> pd.DataFrame:
    parts = []
    for system in systems:
        for phase, table in zip(("context", "generation"), tables):
            frame = _read_table(system, "mla", backend, table)
            if frame is None:
                continue
            frame = frame[(frame["kv_cache_dtype"] == "bfloat16") & (frame["tp_size"] == 1)].copy()
            frame = frame[frame["batch_size"] * np.where(phase == "context", frame["isl"], 1) <= 16384]
            frame["phase"] = phase
            parts.append(frame.sample(n=min(per_gpu // 2, len(frame)), random_state=seed))
    return pd.concat(parts, ignore_index=True)


def _absorbed(kernel: AttentionPrefill) -> AttentionPrefill:
    """The MHA-form prefill ``kernel`` in MLA's absorbed form: one latent KV head read from the paged cache."""
    return dataclasses.replace(kernel, num_kv_heads=1, head_dim=576, v_head_dim=512, kv_shared=True,
                               kv_layout="paged")


def compare(engine: str, per_gpu: int, seed: int) -> pd.DataFrame:
    if engine == "sglang":
        rows = _rows("sglang", ("context_mla_perf", "generation_mla_perf"), SYSTEMS, per_gpu, seed)
        rows["dtype"] = "bf16"
    else:
        rows = _rows("vllm", ("mla_context_module_perf", "mla_generation_module_perf"), SYSTEMS, per_gpu, seed)
        rows = rows[rows["gemm_type"].isin(["bfloat16", "fp8_block"])].copy()
        rows["dtype"] = rows["gemm_type"].map({"bfloat16": "bf16", "fp8_block": "fp8-block"})
    estimator = get_estimator("mlp")
    predicted = []
    for gpu, group in rows.groupby("gpu", sort=False):
        kernels = [_layer_kernels(engine, row, row["dtype"], engine == "sglang") for row in group.to_dict("records")]
        flat = [k for ks in kernels for k in ks]
        times = estimator.predict_us(flat, get_gpu(gpu))
        sums, start = [], 0
        for ks in kernels:
            sums.append(float(times[start:start + len(ks)].sum()))
            start += len(ks)
        predicted.append(pd.Series(sums, index=group.index))
    rows["predicted_us"] = pd.concat(predicted)
    rows["error"] = rows["predicted_us"] / rows["latency_us"] - 1
    if engine == "sglang":
        context = rows[rows["phase"] == "context"]
        absorbed = []
        for gpu, group in context.groupby("gpu", sort=False):
            kernels = [_absorbed(_layer_kernels(engine, row, "bf16", True)[0]) for row in group.to_dict("records")]
            absorbed.append(pd.Series(estimator.predict_us(kernels, get_gpu(gpu)), index=group.index))
        rows["absorbed_error"] = pd.concat(absorbed) / rows["latency_us"] - 1
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows-per-gpu", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{'engine':7} {'GPU':9} {'phase':10} {'rows':>5} {'MAPE %':>7} {'bias %':>7}")
    for engine in ("sglang", "vllm"):
        rows = compare(engine, args.rows_per_gpu, args.seed)
        for (gpu, phase), group in rows.groupby(["gpu", "phase"], sort=False):
            err = group["error"]
            print(f"{engine:7} {gpu:9} {phase:10} {len(group):5d} {100 * err.abs().mean():7.1f} "
                  f"{100 * err.mean():+7.1f}")
        for gpu, group in rows.groupby("gpu", sort=False):
            err = group["error"]
            print(f"{engine:7} {gpu:9} {'all':10} {len(group):5d} {100 * err.abs().mean():7.1f} "
                  f"{100 * err.mean():+7.1f}")
            if "absorbed_error" in group:
                err = group["absorbed_error"].dropna()
                print(f"{engine:7} {gpu:9} {'absorbed':10} {len(err):5d} {100 * err.abs().mean():7.1f} "
                      f"{100 * err.mean():+7.1f}")
            long = group[group["latency_us"] >= LONG_US]["error"]
            print(f"{engine:7} {gpu:9} {'>=0.5 ms':10} {len(long):5d} {100 * long.abs().mean():7.1f} "
                  f"{100 * long.mean():+7.1f}")


if __name__ == "__main__":
    main()
