"""Measured communication tables as one tidy frame.

Sources (read through pandas only; training-time, never needed at run time):

- ``aiconfigurator-core`` ``systems/data/<system>/comm/nccl/<version>/nccl_perf.parquet``: nccl-tests style
  timings of all-reduce, all-gather, reduce-scatter and all-to-all on 2/4/8 GPUs. ``message_size`` counts
  *elements* (of ``nccl_dtype``: half = 2 bytes, the dtype kept here); ``latency`` is in ms.
- ``.../comm/{vllm,sglang}/<version>/custom_allreduce_perf.parquet``: the engines' own custom all-reduce kernel,
  CUDA-graph captured and eager, ``message_size`` in bf16 elements, ``latency`` in ms. Rows whose
  ``kernel_source`` is another library's (TRT-LLM rows filed under an SGLang version) are dropped.
- Vidur ``network/<setup>/{all_reduce,send_recv}.csv``: one row per rank; ``size`` in *bytes*, times in ms.

Every engine release of a custom all-reduce table is kept, tagged with its ``version``: releases differ (SGLang
0.5.14 all-reduces 4 MiB on 2 B200s in 12 µs where 0.5.10 takes 33 µs) and the systems were measured at
different ones (the A100 at SGLang 0.5.10 at most), so the model learns the release as a feature rather than
mixing them. Of several NCCL tables the newest is kept: their directory names are not the NCCL that ran (the
tables' own ``version`` column reads 2.29.2 in most of them).

Tidy columns: ``system, op, implementation, engine, group_size, nodes, message_bytes, latency_us, version,
source``. ``op`` is one of all_reduce, all_gather, reduce_scatter, all_to_all, send_recv; ``implementation`` is
nccl, custom_graph or custom_eager; ``engine`` is vllm/sglang for the custom kernels and "" for NCCL, whose
``version`` is "" too.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np

from servesim.errors import ServesimError

AIC_SYSTEMS = ("a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "gb200", "gb300", "l40s",
               "rtx_pro_6000_server")
VIDUR_SETUPS = ("a100_dgx", "h100_dgx", "a100_pairwise_nvlink", "h100_pairwise_nvlink")
TIDY_COLUMNS = ("system", "op", "implementation", "engine", "group_size", "nodes", "message_bytes", "latency_us",
                "version", "source")

_NCCL_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
             "alltoall": "all_to_all"}
_NCCL_DTYPE_BYTES = {"half": 2}
_CUSTOM_KERNEL_SOURCES = {
    "vllm": {"vLLM_custom_graph": "custom_graph", "vLLM_custom_eager": "custom_eager"},
    "sglang": {"SGLang_CustomAllReduce_graph": "custom_graph", "SGLang_CustomAllReduce_eager": "custom_eager"},
}
_BF16_BYTES = 2
#: Vidur sweeps sizes finely; rows are pooled into quarter-octave bins (median) to weigh setups evenly.
_VIDUR_BINS_PER_OCTAVE = 4


def aic_data_dir() -> Path:
    """``aiconfigurator_core/systems/data`` of the installed training extra."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise ServesimError("aiconfigurator-core is not installed; install the training extra: pip install 'servesim[train]'")
    return Path(next(iter(spec.submodule_search_locations))) / "systems" / "data"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def _newest(paths: list[Path]) -> list[Path]:
    return sorted(paths, key=lambda p: _version_key(p.parent.name), reverse=True)


def read_aic_nccl(system: str, data_dir: Path | None = None):
    """NCCL timings of ``system`` from the newest NCCL version with all-reduce rows, tidy."""
    import pandas as pd

    root = (data_dir or aic_data_dir()) / system / "comm" / "nccl"
    for path in _newest(list(root.glob("*/nccl_perf.parquet"))):
        raw = pd.read_parquet(path)
        if "all_reduce" not in set(raw["op_name"]):
            continue
        raw = raw[raw["nccl_dtype"].isin(list(_NCCL_DTYPE_BYTES)) & raw["op_name"].isin(list(_NCCL_OPS))]
        return pd.DataFrame({
            "system": system,
            "op": raw["op_name"].map(_NCCL_OPS),
            "implementation": "nccl",
            "engine": "",
            "group_size": raw["num_gpus"].astype(int),
            "nodes": 1,
            "message_bytes": raw["message_size"].astype(float) * raw["nccl_dtype"].map(_NCCL_DTYPE_BYTES),
            "latency_us": raw["latency"].astype(float) * 1e3,
            "version": "",
            "source": f"aiconfigurator-core {path.relative_to(root.parents[2])}",
        })
    return pd.DataFrame(columns=list(TIDY_COLUMNS))


def read_aic_custom_allreduce(system: str, engine: str, data_dir: Path | None = None):
    """The ``engine``'s custom all-reduce timings of ``system``, every release that holds that engine's kernel."""
    import pandas as pd

    root = (data_dir or aic_data_dir()) / system / "comm" / engine
    kernels = _CUSTOM_KERNEL_SOURCES[engine]
    frames = []
    for path in _newest(list(root.glob("*/custom_allreduce_perf.parquet"))):
        raw = pd.read_parquet(path)
        raw = raw[raw["kernel_source"].isin(list(kernels))]
        frames.append(pd.DataFrame({
            "system": system,
            "op": "all_reduce",
            "implementation": raw["kernel_source"].map(kernels),
            "engine": engine,
            "group_size": raw["num_gpus"].astype(int),
            "nodes": 1,
            "message_bytes": raw["message_size"].astype(float) * _BF16_BYTES,
            "latency_us": raw["latency"].astype(float) * 1e3,
            "version": path.parent.name,
            "source": f"aiconfigurator-core {path.relative_to(root.parents[2])}",
        }))
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(TIDY_COLUMNS))


def read_vidur_network(setup: str, collective: str, vidur_dir: Path):
    """Vidur's NCCL timings of one setup, rank rows pooled (median) per group and quarter-octave size bin."""
    import pandas as pd

    path = Path(vidur_dir) / "network" / setup / f"{collective}.csv"
    raw = pd.read_csv(path)
    frame = pd.DataFrame({
        "group_size": raw["num_workers"].astype(int),
        "nodes": (raw["num_workers"] // raw["devices_per_node"]).astype(int),
        "size_bin": np.round(np.log2(raw["size"].astype(float)) * _VIDUR_BINS_PER_OCTAVE),
        "message_bytes": raw["size"].astype(float),
        "latency_us": raw[f"time_stats.{collective}.median"].astype(float) * 1e3,
    })
    pooled = frame.groupby(["group_size", "nodes", "size_bin"], as_index=False)[["message_bytes", "latency_us"]].median()
    pooled.insert(0, "system", f"vidur_{setup}")
    pooled.insert(1, "op", collective)
    pooled.insert(2, "implementation", "nccl")
    pooled.insert(3, "engine", "")
    pooled["version"] = ""
    pooled["source"] = f"Vidur (MIT, microsoft/vidur 7d47513) data/network/{setup}/{collective}.csv"
    return pooled[list(TIDY_COLUMNS)]


def _vidur_frames(vidur_dir: Path):
    for setup in VIDUR_SETUPS:
        yield read_vidur_network(setup, "all_reduce", vidur_dir)
        if setup == "h100_pairwise_nvlink":
            continue  # its send_recv.csv is a byte-identical copy of the A100 one (defect of the source)
        send_recv = read_vidur_network(setup, "send_recv", vidur_dir)
        if "pairwise" in setup:
            # The network between two pairwise-NVLink servers is undocumented: keep the in-server pairs only.
            send_recv = send_recv[send_recv["nodes"] == 1]
        yield send_recv


def read_comm_measurements(data_dir: Path | None = None, vidur_dir: Path | None = None):
    """Every measured collective timing as one tidy frame (see the module docstring for the columns)."""
    import pandas as pd

    frames = []
    for system in AIC_SYSTEMS:
        frames.append(read_aic_nccl(system, data_dir))
        for engine in _CUSTOM_KERNEL_SOURCES:
            frames.append(read_aic_custom_allreduce(system, engine, data_dir))
    if vidur_dir is not None:
        frames.extend(_vidur_frames(Path(vidur_dir)))
    tidy = pd.concat([f for f in frames if not f.empty], ignore_index=True)
    return tidy[(tidy["latency_us"] > 0) & (tidy["message_bytes"] > 0)].reset_index(drop=True)
