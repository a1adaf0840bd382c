"""Vidur's measured per-layer operator times against servesim's kernel estimators, shape for shape.

Each Vidur operator of one transformer layer (``servesim.data.vidur``) becomes the kernel servesim would time
for it: the fused QKV, output, gate+up and down projections as GEMMs of ``num_tokens`` rows on the TP shard of
the weights, RMSNorm, SiLU&Mul, rotary embedding and the vocabulary-parallel embedding lookup. Operators
servesim has no kernel for are reported as not compared (Vidur's separate residual ``add``, which the engines
fuse into ``fused_add_rms_norm``; phi-2's LayerNorm and GELU).

Vidur names its GPU folders after the GPU (``a100``, ``h100``, ``a40``, ...): any folder whose name is a catalogue
GPU's name or alias is read (:func:`vidur_gpu`), so a Vidur-format profile of another GPU is scored like Vidur's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.errors import ServesimError
from servesim.kernels.types import Embedding, Gemm, Kernel, Rope, RMSNorm, SiluMul

#: Vidur operators without a servesim kernel, and why.
NOT_COMPARED: Mapping[str, str] = {
    "add": "the engines fuse the residual add into fused_add_rms_norm (add_rmsnorm); no standalone add kernel",
    "layernorm": "no LayerNorm kernel in servesim (no preset uses it)",
    "gelu": "no GELU kernel in servesim (no preset uses it)",
}


def vidur_kernel(op: str, num_tokens: int, tp: int, n_head: int, n_kv_head: int, n_embd: int,
                 n_expanded_embd: int, vocab_size: int, use_gated_mlp: bool) -> Kernel:
    """The servesim kernel of one Vidur operator measurement (BF16; Vidur timed FP16, the same speed)."""
    head_dim = n_embd // n_head
    heads, kv_heads = n_head // tp, max(1, n_kv_head // tp)
    inter = n_expanded_embd // tp
    t = num_tokens
    kernels = {
        "qkv_proj": lambda: Gemm(m=t, n=(heads + 2 * kv_heads) * head_dim, k=n_embd),
        "o_proj": lambda: Gemm(m=t, n=n_embd, k=heads * head_dim),
        "mlp_up_proj": lambda: Gemm(m=t, n=(2 if use_gated_mlp else 1) * inter, k=n_embd),
        "mlp_down_proj": lambda: Gemm(m=t, n=n_embd, k=inter),
        "rmsnorm": lambda: RMSNorm(rows=t, dim=n_embd),
        "silu_mul": lambda: SiluMul(tokens=t, dim=inter),
        "rope": lambda: Rope(tokens=t, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim),
        "embedding": lambda: Embedding(tokens=t, hidden=n_embd, vocab_rows=-(-vocab_size // tp)),
    }
    return kernels[op]()


def vidur_gpu(folder: str) -> str:
    """The catalogue name of the GPU a Vidur ``compute/<folder>`` holds: Vidur's own folders as its data names them
    (``a100`` is the A100-SXM-80GB), any other folder by the catalogue GPU whose name or alias it is."""
    from servesim.data.vidur import VIDUR_GPUS
    from servesim.hardware import get_gpu

    if folder in VIDUR_GPUS:
        return VIDUR_GPUS[folder]
    try:
        return get_gpu(folder).name
    except ServesimError as error:
        raise ServesimError(f"Vidur GPU folder {folder!r} names no catalogue GPU: {error}") from None


def _read_mlp_csv(path: Path, root: Path) -> pd.DataFrame:
    """One ``compute/<gpu>/<org>/<model>/mlp.csv`` as :func:`servesim.data.vidur.load_vidur_ops` frames it."""
    from servesim.data.vidur import _MODEL_DIMS, _OPS, _op_name

    gpu_dir, org, name = path.relative_to(root / "compute").parts[:3]
    raw = pd.read_csv(path)
    model = f"{org}/{name}"
    ids = raw[["num_tensor_parallel_workers", "num_tokens", *_MODEL_DIMS]].rename(
        columns={"num_tensor_parallel_workers": "tp"})
    parts = []
    for vidur_op in (op for op in _OPS if f"time_stats.{op}.median" in raw):
        part = ids.copy()
        part["op"] = _op_name(vidur_op, model, bool(raw["use_gated_mlp"].iloc[0]))
        part["vidur_op"] = vidur_op
        part["latency_us"] = raw[f"time_stats.{vidur_op}.median"] * 1000.0
        part["latency_std_us"] = raw[f"time_stats.{vidur_op}.std"] * 1000.0
        parts.append(part)
    frame = pd.concat(parts, ignore_index=True)
    frame.insert(0, "gpu", vidur_gpu(gpu_dir))
    frame.insert(1, "model", model)
    frame["source"] = path.relative_to(root).as_posix()
    return frame


def load_ops(root: Path) -> pd.DataFrame:
    """Per-layer operator times of every GPU folder under ``root/compute`` whose name maps to a catalogue GPU (see
    :func:`vidur_gpu`), in :func:`servesim.data.vidur.load_vidur_ops`'s columns."""
    from servesim.data.vidur import _MODEL_DIMS

    root = Path(root).resolve()
    if not root.is_dir():
        raise ServesimError(f"Vidur data folder {root} does not exist; pass the folder holding Vidur's compute/ "
                            "tables (e.g. --vidur-root ../shared/data/vidur).")
    paths = sorted((root / "compute").glob("*/*/*/mlp.csv"))
    if not paths:
        raise ServesimError(f"no compute/<gpu>/<org>/<model>/mlp.csv under {root}; is it a copy of Vidur's data?")
    frame = pd.concat([_read_mlp_csv(p, root) for p in paths], ignore_index=True)
    return frame[["gpu", "model", "tp", "num_tokens", "op", "vidur_op", "latency_us", "latency_std_us",
                  *_MODEL_DIMS, "source"]]


def compare_ops(estimators: tuple[str, ...], root: Path, gpus: tuple[str, ...] | None = None) -> pd.DataFrame:
    """Vidur's rows with a ``predicted_<estimator>_us`` column per estimator (NaN for operators in
    :data:`NOT_COMPARED`)."""
    from servesim.estimator import get_estimator
    from servesim.hardware import get_gpu

    frame = load_ops(root)
    if gpus is not None:
        frame = frame[frame["gpu"].isin(gpus)].reset_index(drop=True)
    compared = ~frame["op"].isin(list(NOT_COMPARED))
    shape_columns = ["op", "num_tokens", "tp", "n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size",
                     "use_gated_mlp"]
    shapes = frame.loc[compared, ["gpu", *shape_columns]].drop_duplicates().reset_index(drop=True)
    kernels = [vidur_kernel(*(r[c] for c in shape_columns)) for r in shapes.to_dict("records")]
    for name in estimators:
        estimator = get_estimator(name)
        predicted = np.empty(len(shapes))
        for gpu, index in shapes.groupby("gpu").groups.items():
            by_category: dict[str, list[int]] = {}
            for i in index:
                by_category.setdefault(kernels[i].category, []).append(i)
            for positions in by_category.values():
                predicted[positions] = estimator.predict_us([kernels[i] for i in positions], get_gpu(gpu))
        shapes[f"predicted_{name}_us"] = predicted
    return frame.merge(shapes, on=["gpu", *shape_columns], how="left")


def ops_summary(frame: pd.DataFrame, estimators: tuple[str, ...]) -> list[dict[str, object]]:
    """Per GPU and operator: rows, median measured time and each estimator's MAPE and median signed error."""
    rows = []
    for (gpu, op), group in frame.groupby(["gpu", "op"], sort=True):
        row: dict[str, object] = {"gpu": gpu, "op": op, "rows": len(group),
                                  "median_measured_us": float(group["latency_us"].median())}
        for name in estimators:
            error = group[f"predicted_{name}_us"] / group["latency_us"] - 1.0
            row[f"{name}_mape_pct"] = float(error.abs().mean() * 100)
            row[f"{name}_median_error_pct"] = float(error.median() * 100)
        row["note"] = NOT_COMPARED.get(op, "")
        rows.append(row)
    return rows
