"""Vidur's measured per-layer operator times (MIT, microsoft/vidur) as a tidy frame.

Vidur profiled one transformer layer per model on one GPU, emulating tensor parallelism by slicing the weights,
and stored per-operator torch-profiler statistics in milliseconds in ``compute/<gpu>/<org>/<model>/mlp.csv``.
These are the only measurements servesim has of the element-wise kernels (RMSNorm, SiLU&Mul, RoPE, residual
add) and of per-layer GEMM sequences. The data is not shipped with servesim: callers pass the folder
(``../shared/data/vidur`` in the project's checkout).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import pandas as pd

from servesim.errors import ServesimError

DEFAULT_VIDUR_ROOT = Path("../shared/data/vidur")

#: Vidur's GPU folder -> servesim GPU catalogue name.
VIDUR_GPUS: Mapping[str, str] = MappingProxyType({"a100": "A100-SXM-80GB", "h100": "H100-SXM"})

#: Vidur operator -> servesim operator. The norm and the activation depend on the model (see _op_name).
_OPS: Mapping[str, str] = MappingProxyType(
    {
        "emb": "embedding",
        "input_layernorm": "rmsnorm",
        "attn_pre_proj": "qkv_proj",
        "attn_rope": "rope",
        "attn_post_proj": "o_proj",
        "post_attention_layernorm": "rmsnorm",
        "mlp_up_proj": "mlp_up_proj",
        "mlp_act": "silu_mul",
        "mlp_down_proj": "mlp_down_proj",
        "add": "add",
    }
)

#: Models Vidur profiled with LayerNorm instead of RMSNorm (its model configs' ``norm: layer_norm``).
_LAYERNORM_MODELS = frozenset({"microsoft/phi-2"})

_MODEL_DIMS = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp"]
_MS_TO_US = 1000.0


def _op_name(vidur_op: str, model: str, use_gated_mlp: bool) -> str:
    """Servesim's name of the kernel a Vidur operator ran for this model."""
    if vidur_op.endswith("layernorm") and model in _LAYERNORM_MODELS:
        return "layernorm"
    if vidur_op == "mlp_act" and not use_gated_mlp:
        return "gelu"
    return _OPS[vidur_op]


def _read_mlp_csv(path: Path, root: Path) -> pd.DataFrame:
    gpu_dir, org, name = path.relative_to(root / "compute").parts[:3]
    if gpu_dir not in VIDUR_GPUS:
        raise ServesimError(
            f"unknown Vidur GPU folder {gpu_dir!r} in {path}; known: {', '.join(VIDUR_GPUS)} "
            "(add it to servesim.data.vidur.VIDUR_GPUS)."
        )
    raw = pd.read_csv(path)
    model = f"{org}/{name}"
    ids = raw[["num_tensor_parallel_workers", "num_tokens", *_MODEL_DIMS]].rename(
        columns={"num_tensor_parallel_workers": "tp"}
    )
    parts = []
    # Models with parallel attention and MLP blocks (phi-2) have no post_attention_layernorm column.
    for vidur_op in (op for op in _OPS if f"time_stats.{op}.median" in raw):
        part = ids.copy()
        part["op"] = _op_name(vidur_op, model, bool(raw["use_gated_mlp"].iloc[0]))
        part["vidur_op"] = vidur_op
        part["latency_us"] = raw[f"time_stats.{vidur_op}.median"] * _MS_TO_US
        part["latency_std_us"] = raw[f"time_stats.{vidur_op}.std"] * _MS_TO_US
        parts.append(part)
    frame = pd.concat(parts, ignore_index=True)
    frame.insert(0, "gpu", VIDUR_GPUS[gpu_dir])
    frame.insert(1, "model", model)
    frame["source"] = path.relative_to(root).as_posix()
    return frame


@functools.cache
def _load(root: Path) -> pd.DataFrame:
    if not root.is_dir():
        raise ServesimError(
            f"Vidur data folder {root} does not exist; pass the folder holding Vidur's compute/ tables "
            "(e.g. --vidur-root ../shared/data/vidur)."
        )
    paths = sorted((root / "compute").glob("*/*/*/mlp.csv"))
    if not paths:
        raise ServesimError(f"no compute/<gpu>/<org>/<model>/mlp.csv under {root}; is it a copy of Vidur's data?")
    frame = pd.concat([_read_mlp_csv(p, root) for p in paths], ignore_index=True)
    columns = ["gpu", "model", "tp", "num_tokens", "op", "vidur_op", "latency_us", "latency_std_us",
               *_MODEL_DIMS, "source"]
    return frame[columns]


def load_vidur_ops(root: Path = DEFAULT_VIDUR_ROOT) -> pd.DataFrame:
    """Vidur's per-layer operator times, one row per (GPU, model, tp, num_tokens, operator) measurement.

    Columns: gpu (A100-SXM-80GB, H100-SXM), model (Hugging Face id), tp (the TP degree whose weight shard was
    timed), num_tokens (tokens in the batch), op (embedding, rmsnorm/layernorm, qkv_proj, rope, o_proj,
    mlp_up_proj (fused gate+up when gated), silu_mul/gelu, mlp_down_proj, add), vidur_op (Vidur's own name;
    tells the two norms of a layer apart), latency_us (median of Vidur's repeats), latency_std_us, the model
    dimensions n_head, n_kv_head, n_embd, n_expanded_embd (intermediate size), vocab_size, use_gated_mlp,
    and source (the CSV's path under ``root``).
    """
    return _load(Path(root).resolve()).copy()
