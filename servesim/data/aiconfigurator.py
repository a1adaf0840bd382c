"""Measured kernel tables and end-to-end serving rows shipped by ``aiconfigurator-core``.

``aiconfigurator-core`` (Apache-2.0, the optional ``servesim[train]`` extra) ships per-kernel latencies measured on
nine GPUs under ``systems/data/<system>/<family>/<backend>/<version>/<table>.parquet`` and measured end-to-end
serving runs in ``systems/silicon_sample.csv``. This module only reads those data files; it never imports the
package's code. Every loader returns a tidy frame, one row per measurement, with the latency in ``latency_us``
(the tables store milliseconds), our canonical GPU name in ``gpu`` and the file it came from in ``source``.

Which data is kept (see docs/data.md for the inventory):

- one version per (system, backend): the ``current`` slot of ``systems/query_versions.yaml``, the version the
  package's maintainers completed a full collection for; older and newer directories are partial re-collections
  or single-model drops;
- tables whose ``collection_meta.yaml`` marks them anything but ``complete`` are dropped.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

import pandas as pd
import yaml

from servesim.errors import ServesimError, suggest

#: aiconfigurator system name -> servesim GPU catalogue name, for the nine systems with measured kernels.
MEASURED_GPUS: Mapping[str, str] = MappingProxyType(
    {
        "a100_sxm": "A100-SXM-80GB",
        "h100_sxm": "H100-SXM",
        "h200_sxm": "H200",
        "b200_sxm": "B200",
        "b300_sxm": "B300",
        "gb200": "GB200",
        "gb300": "GB300",
        "l40s": "L40S",
        "rtx_pro_6000_server": "RTX-PRO-6000",
    }
)

#: Serving engines servesim models; ``trtllm`` tables can be asked for explicitly.
DEFAULT_BACKENDS: tuple[str, ...] = ("vllm", "sglang")
KNOWN_BACKENDS: tuple[str, ...] = ("vllm", "sglang", "trtllm")

#: Table precision names -> (dtype, scaling). Rows of other precisions (weight-only int4/int8, SmoothQuant,
#: MXFP4 mixes) are dropped: servesim has no kernel model for them.
_PRECISIONS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "bfloat16": ("bf16", "none"),
        "fp8": ("fp8", "tensor"),
        "fp8_block": ("fp8", "block"),
        "nvfp4": ("nvfp4", "block"),
        "int4_wo": ("int4", "group"),  # weight-only INT4 MoE (Marlin), BF16 activations
        "w4a16_mxfp4": ("mxfp4", "block"),  # weight-only MXFP4 MoE, BF16 activations
        "w4a8_mxfp4_mxfp8": ("mxfp4_mxfp8", "block"),  # MXFP4 experts, MXFP8 activations (FlashInfer TRT-LLM MoE)
    }
)
_KNOWN_DTYPES = frozenset(dtype for dtype, _ in _PRECISIONS.values())

ID_COLUMNS = ("gpu", "system", "backend", "backend_version", "kernel_source")
_MS_TO_US = 1000.0

_INSTALL_HINT = "install servesim[train] (pip install 'servesim[train]') to read aiconfigurator-core's measured data"


@functools.cache
def package_dir() -> Path:
    """The installed ``aiconfigurator_core`` directory; raises ServesimError when the package is absent."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or spec.origin is None:
        raise ServesimError(f"aiconfigurator-core is not installed: {_INSTALL_HINT}.")
    return Path(spec.origin).parent


def _data_dir() -> Path:
    return package_dir() / "systems" / "data"


def available_systems() -> tuple[str, ...]:
    """The measured systems (keys of MEASURED_GPUS) for which the installed package ships kernel tables."""
    return tuple(s for s in MEASURED_GPUS if any((_data_dir() / s).glob("*/*/*/*.parquet")))


@functools.cache
def _current_versions() -> dict[tuple[str, str], str]:
    """(system, backend) -> the version named ``current`` in query_versions.yaml."""
    doc = yaml.safe_load((package_dir() / "systems" / "query_versions.yaml").read_text())
    defaults = {backend: slot["current"] for backend, slot in doc["defaults"].items()}
    overrides = doc.get("overrides") or {}
    return {
        (system, backend): overrides.get(system, {}).get(backend, {}).get("current", version)
        for system in MEASURED_GPUS
        for backend, version in defaults.items()
    }


def _is_complete(table_dir: Path, table: str) -> bool:
    meta_path = table_dir / "collection_meta.yaml"
    if not meta_path.exists():
        return False
    meta = yaml.safe_load(meta_path.read_text())
    return (meta.get("tables") or {}).get(table, {}).get("status") == "complete"


@functools.cache
def _read_table(system: str, family: str, backend: str, table: str) -> pd.DataFrame | None:
    """One complete table of the current version as a frame with ids and ``latency_us``; None when not shipped."""
    version = _current_versions()[(system, backend)]
    table_dir = _data_dir() / system / family / backend / version
    path = table_dir / f"{table}.parquet"
    if not path.exists() or not _is_complete(table_dir, table):
        return None
    raw = pd.read_parquet(path)
    frame = raw.drop(columns=["framework", "version", "device", "op_name", "latency"])
    frame.insert(0, "gpu", MEASURED_GPUS[system])
    frame.insert(1, "system", system)
    frame.insert(2, "backend", backend)
    frame.insert(3, "backend_version", version)
    frame["latency_us"] = raw["latency"] * _MS_TO_US
    frame["source"] = path.relative_to(package_dir()).as_posix()
    return frame


def _check_names(kind: str, names: Iterable[str], known: Iterable[str]) -> tuple[str, ...]:
    names, known = tuple(names), tuple(known)
    for name in names:
        if name not in known:
            raise ServesimError(f"unknown {kind} {name!r}; choose from {', '.join(known)}.{suggest(name, known)}")
    return names


def _load(
    family: str, table: str, backends: Iterable[str], systems: Iterable[str] | None
) -> pd.DataFrame:
    backends = _check_names("backend", backends, KNOWN_BACKENDS)
    systems = _check_names("aiconfigurator system", MEASURED_GPUS if systems is None else systems, MEASURED_GPUS)
    parts = [_read_table(s, family, b, table) for s in systems for b in backends]
    parts = [p for p in parts if p is not None]
    if not parts:
        raise ServesimError(
            f"no complete {table} table for systems {', '.join(systems)} and backends {', '.join(backends)}; "
            "widen the selection (see servesim.data.aiconfigurator.available_systems())."
        )
    return pd.concat(parts, ignore_index=True)


def _split_precision(frame: pd.DataFrame, column: str, dtypes: Iterable[str]) -> pd.DataFrame:
    """Replace the table's precision column by ``dtype`` and ``scaling`` and keep the rows of ``dtypes``."""
    dtypes = _check_names("dtype", dtypes, sorted(_KNOWN_DTYPES))
    precision = frame.pop(column)
    frame["dtype"] = precision.map({raw: dtype for raw, (dtype, _) in _PRECISIONS.items()})
    frame["scaling"] = precision.map({raw: scaling for raw, (_, scaling) in _PRECISIONS.items()})
    return frame[frame["dtype"].isin(dtypes)].reset_index(drop=True)


def _short_dtype(column: pd.Series) -> pd.Series:
    return column.map(lambda raw: _PRECISIONS[raw][0])


def tidy(frame: pd.DataFrame, shape_columns: list[str]) -> pd.DataFrame:
    """Order columns as ids, shape, latency, source, and store the repeated strings as categories."""
    ordered = frame[[*ID_COLUMNS, *shape_columns, "latency_us", "source"]]
    strings = [c for c in ordered.columns if pd.api.types.is_string_dtype(ordered[c])]
    return ordered.astype(dict.fromkeys(strings, "category"))


def load_gemm(
    dtypes: Iterable[str] = ("bf16", "fp8"),
    backends: Iterable[str] = DEFAULT_BACKENDS,
    systems: Iterable[str] | None = None,
) -> pd.DataFrame:
    """Measured dense GEMMs ``C[m, n] = A[m, k] @ B[k, n]`` (the engine's linear layers).

    Columns: gpu, system, backend, backend_version, kernel_source, m, n, k, dtype (bf16/fp8/nvfp4), scaling
    (none; fp8: tensor = per-tensor scaled-MM, block = 128-wide block-scaled; nvfp4: block), latency_us, source.
    FP8 rows time the activation quantisation plus the GEMM, as the engine runs them.
    """
    frame = _split_precision(_load("gemm", "gemm_perf", backends, systems), "gemm_dtype", dtypes)
    return tidy(frame, ["m", "n", "k", "dtype", "scaling"])


_ATTENTION_RENAMES = {"batch_size": "batch", "num_key_value_heads": "num_kv_heads"}


def _load_attention(table: str, backends: Iterable[str], systems: Iterable[str] | None) -> pd.DataFrame:
    frame = _load("attention", table, backends, systems).rename(columns=_ATTENTION_RENAMES)
    frame["dtype"] = _short_dtype(frame.pop("attn_dtype"))
    frame["kv_dtype"] = _short_dtype(frame.pop("kv_cache_dtype"))
    # The A100 tables predate sliding-window collection: all their rows are full attention.
    full_attention = pd.Series(0, index=frame.index)
    frame["window_size"] = frame.get("window_size", full_attention).fillna(0).astype("int64")
    return frame.drop(columns=["beam_width"])


def load_context_attention(
    backends: Iterable[str] = DEFAULT_BACKENDS, systems: Iterable[str] | None = None
) -> pd.DataFrame:
    """Measured causal prefill attention of ``batch`` sequences of ``seq_len`` new tokens each.

    Columns: gpu, system, backend, backend_version, kernel_source, batch, seq_len, prefix_len (tokens already in
    the KV cache; 0 in every shipped row), num_heads, num_kv_heads (per GPU, i.e. after TP), head_dim,
    window_size (sliding window in tokens, 0 = full), dtype (attention math: bf16/fp8), kv_dtype, latency_us,
    source.
    """
    frame = _load_attention("context_attention_perf", backends, systems)
    frame = frame.rename(columns={"isl": "seq_len", "step": "prefix_len"})
    shape = ["batch", "seq_len", "prefix_len", "num_heads", "num_kv_heads", "head_dim", "window_size"]
    return tidy(frame, [*shape, "dtype", "kv_dtype"])


def load_generation_attention(
    backends: Iterable[str] = DEFAULT_BACKENDS, systems: Iterable[str] | None = None
) -> pd.DataFrame:
    """Measured decode attention: ``batch`` sequences, one new token each, attending to ``kv_len`` tokens.

    Columns: gpu, system, backend, backend_version, kernel_source, batch, kv_len, num_heads, num_kv_heads,
    head_dim, window_size, dtype, kv_dtype, latency_us, source. The tables record the one new token (``isl``)
    and the tokens decoded before it (``step``); ``kv_len = isl + step`` (2, 4, ..., 131072).
    """
    frame = _load_attention("generation_attention_perf", backends, systems)
    frame["kv_len"] = frame.pop("isl") + frame.pop("step")
    shape = ["batch", "kv_len", "num_heads", "num_kv_heads", "head_dim", "window_size"]
    return tidy(frame, [*shape, "dtype", "kv_dtype"])


#: aiconfigurator's kernel-level tables of GLM-5's DeepSeek Sparse Attention (the ``sparse_attention`` family,
#: SGLang 0.5.14, GLM-5's 32 indexer heads of 128, top 2048, 64 attention heads): the indexer's FP8 MQA logits
#: (DeepGEMM ``fp8_mqa_logits``), its top-k (``fast_topk_transform_fused``) and FlashMLA's sparse attention.
DSA_KERNEL_TABLES: tuple[str, ...] = ("glm5_mqa_logits_module_perf", "glm5_topk_module_perf",
                                      "glm5_dsa_attn_module_perf")


def load_dsa_kernel(table: str, systems: Iterable[str] | None = None) -> pd.DataFrame:
    """Measured DSA kernels of one of :data:`DSA_KERNEL_TABLES`: ``batch`` requests of ``query_len`` new tokens
    each after ``prefix_len`` cached ones (``query_len`` 1: decodes).

    Columns: gpu, system, backend, backend_version, kernel_source, batch, query_len, prefix_len, num_heads (the
    model's attention heads on the GPU), score_mode (the top-k table's logits layout: ``flat`` as served,
    ``top_last`` for context parallelism; ``flat`` elsewhere), latency_us, source."""
    _check_names("DSA kernel table", (table,), DSA_KERNEL_TABLES)
    frame = _load("sparse_attention", table, ("sglang",), systems)
    frame = frame.rename(columns={"batch_size": "batch", "isl": "query_len", "step": "prefix_len"})
    if "score_mode" not in frame:
        frame["score_mode"] = "flat"
    return tidy(frame, ["batch", "query_len", "prefix_len", "num_heads", "score_mode"])


#: aiconfigurator's Gated DeltaNet kernels (the ``linear_attention`` family's ``gdn_perf`` table: Qwen3.5's and
#: Qwen3-Next's shapes per TP, vLLM 0.24 and SGLang 0.5.14: fla's kernels in both, and vLLM's FlashInfer prompt
#: kernel on Hopper and Blackwell), by servesim kernel category.
GDN_KERNEL_SOURCES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "gdn_prefill": ("chunk_gated_delta_rule", "chunk_gated_delta_rule_triton", "chunk_gated_delta_rule_flashinfer"),
    "gdn_decode": ("fused_recurrent_gated_delta_rule_packed_decode", "fused_recurrent_gated_delta_rule"),
    "conv1d": ("causal_conv1d_fn", "causal_conv1d_update"),
})


def load_gdn(systems: Iterable[str] | None = None, backends: Iterable[str] = DEFAULT_BACKENDS) -> pd.DataFrame:
    """Measured Gated DeltaNet kernels: ``batch`` requests of ``seq_len`` new tokens each (1 for decodes), with
    ``num_k_heads`` query/key heads and ``num_v_heads`` value heads of ``head_k_dim``/``head_v_dim`` on the GPU and a
    convolution of width ``d_conv``.

    Columns: gpu, system, backend, backend_version, kernel_source, phase (context or generation), batch, seq_len,
    num_k_heads, head_k_dim, num_v_heads, head_v_dim, d_conv, latency_us, source."""
    frame = _load("linear_attention", "gdn_perf", backends, systems).rename(columns={"batch_size": "batch"})
    return tidy(frame, ["phase", "batch", "seq_len", "num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim",
                        "d_conv"])


def load_moe(
    dtypes: Iterable[str] = ("bf16", "fp8"),
    backends: Iterable[str] = DEFAULT_BACKENDS,
    systems: Iterable[str] | None = None,
) -> pd.DataFrame:
    """Measured fused-MoE layers (routing, grouped gate/up GEMM, activation, down GEMM, combine) on one GPU.

    Columns: gpu, system, backend, backend_version, kernel_source, num_tokens, hidden, intermediate (the
    model's full expert width, before ``moe_tp`` sharding), num_experts (before ``moe_ep`` sharding), topk,
    moe_tp, moe_ep, distribution (token routing: balanced, power_law_1.01, power_law_1.2), dtype, scaling,
    latency_us, source.
    """
    renames = {
        "hidden_size": "hidden",
        "inter_size": "intermediate",
        "moe_tp_size": "moe_tp",
        "moe_ep_size": "moe_ep",
    }
    frame = _load("moe", "moe_perf", backends, systems).rename(columns=renames)
    frame = _split_precision(frame, "moe_dtype", dtypes)
    shape = ["num_tokens", "hidden", "intermediate", "num_experts", "topk", "moe_tp", "moe_ep", "distribution"]
    return tidy(frame, [*shape, "dtype", "scaling"])


def load_fp8_convert(systems: Iterable[str] | None = None) -> pd.DataFrame:
    """Measured times of vLLM's FP8 conversion with a given per-tensor scale (``static_scaled_fp8_quant``: the
    second of the two passes of its dynamic per-tensor quantisation), ``m`` x ``k`` BF16 activations to FP8. Its
    collector (``collect_computescale.py``) converts one input five times in a row.

    Columns: gpu, system, backend, backend_version, kernel_source, m, k, latency_us, source.
    """
    frame = _load("quantize", "scale_matrix_perf", ("vllm",), systems)
    frame = frame[frame["quant_dtype"].astype(str) == "fp8"]
    return tidy(frame.reset_index(drop=True), ["m", "k"])


_SILICON_RENAMES = {
    "model_path": "model",
    "silicon_ttft_ms": "ttft_ms",
    "silicon_tpot_ms": "tpot_ms",
    "gemm_quant_mode": "gemm_quant",
    "moe_quant_mode": "moe_quant",
}
_SILICON_PARALLEL = ["batch_size", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size"]
_SILICON_MODES = {"agg": "aggregated", "disagg": "disaggregated"}


def _parallel_name(column: str) -> str:
    """``prefill_tp_size`` -> ``prefill_tp``, ``decode_num_workers`` -> ``decode_workers``; batch_size stays."""
    if column.endswith("batch_size"):
        return column
    return column.removesuffix("_size").replace("num_workers", "workers")


@functools.cache
def _silicon_sample() -> pd.DataFrame:
    path = package_dir() / "systems" / "silicon_sample.csv"
    raw = pd.read_csv(path)
    frame = raw.rename(columns=_SILICON_RENAMES)
    counts = [c for c in frame.columns if c.endswith(("_size", "num_workers"))]
    frame[counts] = frame[counts].astype("Int64")
    frame = frame.rename(columns={c: _parallel_name(c) for c in counts})
    frame["gpu"] = frame["system"].map(MEASURED_GPUS)
    frame["mode"] = frame["mode"].map(_SILICON_MODES)
    concurrency = raw["silicon_data_source"].str.extract(r"silicon_concurrency=(\d+)", expand=False)
    frame["concurrency"] = pd.to_numeric(concurrency).astype("Int64")
    frame["output_tokens_per_s_per_user"] = 1000.0 / frame["tpot_ms"]
    frame = frame.rename(columns={"silicon_data_source": "source"})
    leading = ["id", "model", "gpu", "system", "backend", "backend_version", "mode", "precision", "gemm_quant",
               "moe_quant", "isl", "osl", "concurrency"]
    parallel = [_parallel_name(c) for c in counts]
    trailing = ["ttft_ms", "tpot_ms", "output_tokens_per_s_per_user", "source"]
    return frame[[*leading, *parallel, *trailing]]


def load_silicon_sample() -> pd.DataFrame:
    """Measured end-to-end serving runs (TTFT/TPOT at a fixed concurrency), one row per run.

    Columns (documented in docs/data.md): id, model (Hugging Face id), gpu, system, backend, backend_version,
    mode (aggregated/disaggregated), precision, gemm_quant, moe_quant, isl, osl, concurrency (clients kept in
    flight; <NA> where the source did not record it), the aggregated layout batch_size, tp, pp, attention_dp,
    moe_tp, moe_ep, the disaggregated layout prefill_/decode_ + batch_size, workers, tp, pp, attention_dp,
    moe_tp, moe_ep, ttft_ms, tpot_ms, output_tokens_per_s_per_user (derived: 1000 / tpot_ms), source.
    """
    return _silicon_sample().copy()
