"""Which shapes a collection measures: grids given on the command line or in a sweep file, and the default sweep
drawn from the kernels the engines launch for the preset models.

A *grid* is the cartesian product of per-axis value lists for one category. A *model sweep* expands engine steps
of preset models (``servesim.kernels.expand``, vLLM, a reference H100) at several TP degrees and token counts and
keeps the shapes of the kernels those steps launch. Every sweep yields :class:`Shape` objects; ``plan_shapes``
dedupes them, sorts them and optionally keeps an evenly spaced subset.
"""

from __future__ import annotations

import itertools
import json
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servesim.collect.schema import CATEGORIES, Shape, get_schema, make_shape
from servesim.errors import ServesimError, suggest

#: Sweep axes per category (CLI ``--seq-len`` is axis ``seq_len``). ``heads`` takes ``H/KV`` pairs.
AXES: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "n", "k"),
    "scaled_mm": ("m", "n", "k"),
    "context_attention": ("batch", "seq_len", "prefix_len", "heads", "head_dim"),
    "generation_attention": ("batch", "kv_len", "heads", "head_dim"),
    "rmsnorm": ("tokens", "hidden"),
    "silu_mul": ("tokens", "hidden"),
    "rope": ("tokens", "heads", "head_dim"),
    "residual_add": ("tokens", "hidden"),
}
ALL_AXES: tuple[str, ...] = tuple(dict.fromkeys(a for axes in AXES.values() for a in axes))
#: Axes a grid may leave out, and the value they then take.
_AXIS_DEFAULTS: dict[str, tuple[int, ...]] = {"prefix_len": (0,)}
#: Axes whose values may be 0 (the rest must be positive).
_ZERO_ALLOWED = frozenset({"prefix_len"})
#: torch._scaled_mm (cuBLASLt FP8) needs these dimensions to be multiples of 16.
_FP8_MULTIPLE = 16

#: The default sweep: dense preset models at the TP degrees and token counts the engines run.
DEFAULT_MODELS = ("llama3-8b", "llama3-70b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b",
                  "qwen3-8b", "qwen3-14b", "qwen3-32b")
DEFAULT_TPS = (1, 2, 4, 8)
DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
#: Prefill attention grid: batch x seq_len with at most MAX_PREFILL_TOKENS new tokens (a step's token budget).
DEFAULT_PREFILL_BATCH = (1, 2, 4, 8)
DEFAULT_SEQ_LEN = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
MAX_PREFILL_TOKENS = 16384
#: Decode attention grid: batch x kv_len with at most MAX_DECODE_KV_TOKENS cached tokens in the batch.
DEFAULT_DECODE_BATCH = (1, 4, 16, 32, 64, 128, 256)
DEFAULT_KV_LEN = (128, 512, 1024, 2048, 4096, 8192, 16384, 32768)
MAX_DECODE_KV_TOKENS = 1 << 20
#: Context of each decode request when expanding decode steps of the preset models (no shape depends on it).
_DECODE_CONTEXT = 1024
#: The engine and GPU the model sweep expands steps for: shapes do not depend on the GPU beyond CUDA-graph
#: padding, so every collection draws the same default shapes.
_REFERENCE_ENGINE = "vllm"
_REFERENCE_GPU = "H100-SXM"


def _heads(axis: str, value: object) -> tuple[int, int]:
    try:
        heads, kv_heads = (int(part) for part in str(value).split("/"))
    except ValueError:
        raise ServesimError(f"{axis} takes H/KV head pairs such as 32/8; got {value!r}") from None
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        raise ServesimError(f"{axis} {value!r}: query heads must be a positive multiple of the KV heads, e.g. 32/8")
    return heads, kv_heads


def integers(label: str, values: Sequence[object], minimum: int = 1) -> tuple[int, ...]:
    """``values`` as integers of at least ``minimum``; a ServesimError names ``label`` and the bad value."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ServesimError(f"{label} needs a non-empty list of integers, got {values!r}")
    out = []
    for value in values:
        try:
            number = int(value) if not isinstance(value, (bool, float)) or float(value).is_integer() else None
        except (TypeError, ValueError):
            number = None
        if number is None or isinstance(value, bool):
            raise ServesimError(f"{label} takes integers; got {value!r}")
        if number < minimum:
            raise ServesimError(f"{label} values must be {minimum} or more; got {number}")
        out.append(number)
    return tuple(out)


def check_values(axis: str, values: Sequence[object]) -> tuple:
    """Validate one axis's values (from the CLI or a sweep file); a ServesimError names the bad value."""
    if axis not in ALL_AXES:
        raise ServesimError(f"unknown sweep axis {axis!r}; axes are {', '.join(ALL_AXES)}.{suggest(axis, ALL_AXES)}")
    if axis == "heads":
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise ServesimError(f"sweep axis heads needs a non-empty list of H/KV pairs, got {values!r}")
        return tuple(_heads(axis, v) for v in values)
    return integers(f"sweep axis {axis}", values, 0 if axis in _ZERO_ALLOWED else 1)


#: Grid axis -> the shape column it sets, where the names differ.
_AXIS_COLUMNS = {"tokens": "num_tokens"}


def _grid_shape(category: str, point: Mapping[str, object]) -> Shape:
    """One grid point of ``category`` (axis name -> value) as a Shape."""
    columns: dict[str, object] = {"window_size": 0}
    for axis, value in point.items():
        if axis == "heads":
            columns["num_heads"], columns["num_kv_heads"] = value
        else:
            columns[_AXIS_COLUMNS.get(axis, axis)] = value
    if category == "scaled_mm" and (columns["n"] % _FP8_MULTIPLE or columns["k"] % _FP8_MULTIPLE):
        raise ServesimError(
            f"scaled_mm needs n and k divisible by {_FP8_MULTIPLE} (torch._scaled_mm); got n={columns['n']} "
            f"k={columns['k']}"
        )
    return make_shape(category, **columns)


@dataclass(frozen=True)
class GridSweep:
    """The cartesian product of ``axes`` (name -> validated values) for one category."""

    category: str
    axes: tuple[tuple[str, tuple], ...]

    def shapes(self) -> list[Shape]:
        names = [name for name, _ in self.axes]
        return [_grid_shape(self.category, dict(zip(names, point)))
                for point in itertools.product(*(values for _, values in self.axes))]

    def describe(self) -> dict:
        return {"kind": "grid", "category": self.category,
                "axes": {name: ["/".join(map(str, v)) if isinstance(v, tuple) else v for v in values]
                         for name, values in self.axes}}


def grid_sweep(category: str, axes: Mapping[str, Sequence[object]]) -> GridSweep:
    """A validated grid: every axis of ``category`` given (or defaulted), none foreign to it."""
    get_schema(category)
    wanted = AXES[category]
    foreign = [a for a in axes if a not in wanted]
    if foreign:
        hint = suggest(foreign[0], wanted)
        raise ServesimError(f"{category} has no axis {', '.join(foreign)}; its axes are {', '.join(wanted)}.{hint}")
    missing = [a for a in wanted if a not in axes and a not in _AXIS_DEFAULTS]
    if missing:
        raise ServesimError(
            f"a {category} grid needs {', '.join(missing)} too (its axes are {', '.join(wanted)}); or give no axis "
            "to measure the default sweep"
        )
    values = {a: check_values(a, axes[a]) if a in axes else _AXIS_DEFAULTS[a] for a in wanted}
    sweep = GridSweep(category, tuple((a, values[a]) for a in wanted))
    sweep.shapes()  # validate every point now (e.g. FP8 alignment), before anything is measured
    return sweep


@dataclass(frozen=True)
class ModelSweep:
    """Shapes of the kernels vLLM launches for ``models`` at ``tps`` in steps of ``tokens`` decodes (their dense
    kernels see the same token counts as a prefill chunk of that many tokens, CUDA-graph padding included, and
    the LM head sees one row per request), plus attention over the default batch x length grids for each model's
    per-GPU head layout. TP degrees a model's heads do not divide are left out."""

    categories: tuple[str, ...]
    models: tuple[str, ...] = DEFAULT_MODELS
    tps: tuple[int, ...] = DEFAULT_TPS
    tokens: tuple[int, ...] = DEFAULT_TOKENS

    def shapes(self) -> list[Shape]:
        from servesim.hardware import get_gpu
        from servesim.kernels import check_parallelism, expand, parse_batch
        from servesim.models.registry import load_preset

        gpu = get_gpu(_REFERENCE_GPU)
        wanted = set(self.categories)
        # FP8 steps only for the scaled-MM shapes; BF16 steps give every other category.
        dtypes = [d for d, needed in (("bf16", bool(wanted - {"scaled_mm"})), ("fp8", "scaled_mm" in wanted)) if needed]
        shapes: list[Shape] = []
        heads: set[tuple[int, int, int]] = set()
        for model_name, tp in itertools.product(self.models, self.tps):
            model = load_preset(model_name)
            try:
                check_parallelism(model, tp, 1, 0)
            except ServesimError:
                continue  # this TP degree does not divide the model's heads
            for tokens, dtype in itertools.product(self.tokens, dtypes):
                batch = parse_batch(f"decode:{tokens}x{_DECODE_CONTEXT}")
                step = expand(_REFERENCE_ENGINE, model, gpu, batch, tp=tp, dtype=dtype)
                # Dedupe by identity: hashing the attention kernel of a long decode batch is slow.
                for kernel in {id(op): op for run in step.runs for op in run.ops}.values():
                    shapes.extend(kernel_shapes(kernel, heads))
        shapes.extend(_attention_grid(heads))
        return [s for s in shapes if s.category in wanted]

    def describe(self) -> dict:
        return {"kind": "models", "categories": list(self.categories), "models": list(self.models),
                "tp": list(self.tps), "tokens": list(self.tokens), "engine": _REFERENCE_ENGINE,
                "reference_gpu": _REFERENCE_GPU,
                "prefill_grid": {"batch": list(DEFAULT_PREFILL_BATCH), "seq_len": list(DEFAULT_SEQ_LEN),
                                 "max_tokens": MAX_PREFILL_TOKENS},
                "decode_grid": {"batch": list(DEFAULT_DECODE_BATCH), "kv_len": list(DEFAULT_KV_LEN),
                                "max_kv_tokens": MAX_DECODE_KV_TOKENS}}


def kernel_shapes(kernel: object, heads: set[tuple[int, int, int]]) -> list[Shape]:
    """The collected shapes one expanded kernel stands for; attention kernels add their head layout to ``heads``
    (attention is swept over batch and length grids instead of the step's own lengths)."""
    from servesim.kernels.types import (
        AddRMSNorm, AttentionDecode, AttentionPrefill, Gemm, RMSNorm, Rope, ScaledMM, SiluMul,
    )

    if isinstance(kernel, Gemm) and kernel.dtype == "bf16":
        return [make_shape("gemm", m=kernel.m, n=kernel.n, k=kernel.k)]
    if isinstance(kernel, ScaledMM) and kernel.scale == "tensor":
        return [make_shape("scaled_mm", m=kernel.m, n=kernel.n, k=kernel.k)]
    if isinstance(kernel, (AttentionPrefill, AttentionDecode)):
        heads.add((kernel.num_heads, kernel.num_kv_heads, kernel.head_dim))
        return []
    if isinstance(kernel, RMSNorm):
        return [make_shape("rmsnorm", num_tokens=kernel.rows, hidden=kernel.dim)]
    if isinstance(kernel, AddRMSNorm):  # the engines' fused residual add + RMSNorm: both halves
        return [make_shape("rmsnorm", num_tokens=kernel.rows, hidden=kernel.dim),
                make_shape("residual_add", num_tokens=kernel.rows, hidden=kernel.dim)]
    if isinstance(kernel, SiluMul):
        return [make_shape("silu_mul", num_tokens=kernel.tokens, hidden=kernel.dim)]
    if isinstance(kernel, Rope):
        return [make_shape("rope", num_tokens=kernel.tokens, num_heads=kernel.num_heads,
                           num_kv_heads=kernel.num_kv_heads, head_dim=kernel.head_dim)]
    return []


def _attention_grid(heads: Iterable[tuple[int, int, int]]) -> list[Shape]:
    shapes = []
    for (h, kv, d) in sorted(heads):
        layout = dict(num_heads=h, num_kv_heads=kv, head_dim=d, window_size=0)
        shapes += [make_shape("context_attention", batch=b, seq_len=s, prefix_len=0, **layout)
                   for b, s in itertools.product(DEFAULT_PREFILL_BATCH, DEFAULT_SEQ_LEN) if b * s <= MAX_PREFILL_TOKENS]
        shapes += [make_shape("generation_attention", batch=b, kv_len=n, **layout)
                   for b, n in itertools.product(DEFAULT_DECODE_BATCH, DEFAULT_KV_LEN) if b * n <= MAX_DECODE_KV_TOKENS]
    return shapes


def model_sweep(categories: Sequence[str], models: Sequence[str] = (), tps: Sequence[object] = (),
                tokens: Sequence[object] = ()) -> ModelSweep:
    """A validated model sweep; empty arguments take the defaults (:data:`DEFAULT_MODELS`, ...)."""
    from servesim.models.registry import preset_names

    for name in models:
        if name not in preset_names():
            raise ServesimError(
                f"unknown preset model {name!r} for the sweep; choose from {', '.join(preset_names())}."
                f"{suggest(name, preset_names())}"
            )
    return ModelSweep(
        categories=tuple(get_schema(c).name for c in categories),
        models=tuple(models) or DEFAULT_MODELS,
        tps=integers("tp", tps) if tps else DEFAULT_TPS,
        tokens=integers("tokens", tokens) if tokens else DEFAULT_TOKENS,
    )


Sweep = GridSweep | ModelSweep

_MODEL_KEYS = ("models", "tp", "tokens", "categories")


def sweeps_from_file(path: Path) -> list[Sweep]:
    """Read a TOML or JSON sweep file: a list ``sweep`` of tables, each either a grid (``category`` plus its
    axes) or a model sweep (``models``, optional ``tp``, ``tokens``, ``categories``). See docs/collect.md."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ServesimError(f"cannot read sweep file {path}: {exc.strerror}") from None
    try:
        doc = json.loads(text) if Path(path).suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ServesimError(f"sweep file {path} is not valid {'JSON' if Path(path).suffix == '.json' else 'TOML'}: "
                            f"{str(exc).splitlines()[0]}") from None
    entries = doc.get("sweep") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise ServesimError(f"sweep file {path} needs a non-empty list 'sweep' of tables ([[sweep]] in TOML)")
    sweeps: list[Sweep] = []
    for number, entry in enumerate(entries, start=1):
        where = f"sweep file {path}, entry {number}"
        try:
            sweeps.append(_sweep_entry(dict(entry)))
        except ServesimError as exc:
            raise ServesimError(f"{where}: {exc}") from None
    return sweeps


def _sweep_entry(entry: dict) -> Sweep:
    if "models" in entry:
        unknown = [k for k in entry if k not in _MODEL_KEYS]
        if unknown:
            raise ServesimError(f"a model sweep takes {', '.join(_MODEL_KEYS)}, not {', '.join(unknown)}")
        categories = entry.get("categories", list(CATEGORIES))
        if isinstance(categories, str) or not isinstance(categories, list):
            raise ServesimError(f"categories must be a list of names, got {categories!r}")
        return model_sweep(categories, entry["models"], entry.get("tp", ()), entry.get("tokens", ()))
    if "category" not in entry:
        raise ServesimError("each entry needs 'category' (a grid) or 'models' (a model sweep)")
    category = str(entry.pop("category"))
    get_schema(category)
    return grid_sweep(category, entry)


def plan_shapes(sweeps: Iterable[Sweep], max_shapes: int | None = None) -> list[Shape]:
    """Every shape of ``sweeps`` once, sorted by category (measuring order) then value; with ``max_shapes``, an
    evenly spaced subset of that list (first and last kept) so a bounded run still spans the sweep."""
    order = {name: i for i, name in enumerate(CATEGORIES)}
    shapes = sorted(dict.fromkeys(s for sweep in sweeps for s in sweep.shapes()),
                    key=lambda s: (order[s.category], s.values))
    if not shapes:
        raise ServesimError("the sweep has no shapes: no TP degree given divides the models' heads, or no kernel "
                            "of the chosen categories runs in them")
    if max_shapes is not None:
        if max_shapes < 1:
            raise ServesimError(f"--max-shapes must be at least 1, not {max_shapes}")
        if max_shapes < len(shapes):
            keep = np.linspace(0, len(shapes) - 1, max_shapes).round().astype(int)
            shapes = [shapes[i] for i in keep]
    return shapes


def sweeps_from_options(categories: Sequence[str], axes: Mapping[str, str], sweep_file: Path | None = None,
                        models: Sequence[str] = (), tps: str = "") -> list[Sweep]:
    """The sweeps the command line asks for. ``axes`` maps axis names to comma-separated CLI text.

    Grid axes need exactly one ``--category``; ``--sweep`` stands alone; otherwise the model sweep of
    ``categories`` (all when empty), where a lone ``--tokens`` sets the token counts of the expanded steps.
    """
    split = {axis: [v.strip() for v in text.split(",") if v.strip()] for axis, text in axes.items() if text}
    grid = {axis: values for axis, values in split.items() if axis != "tokens"}
    model_options = bool(models or tps)
    if sweep_file is not None:
        if split or model_options or categories:
            raise ServesimError("--sweep takes every shape from its file; drop --category, the axis options, "
                                "--model and --tp")
        return sweeps_from_file(sweep_file)
    if grid:
        if model_options:
            raise ServesimError("axis options (--m, --heads, ...) describe a grid; --model and --tp describe the "
                                "model sweep: use one or the other")
        if len(categories) != 1:
            raise ServesimError(f"axis options ({', '.join('--' + a.replace('_', '-') for a in split)}) describe one "
                                "category's grid: give exactly one --category")
        return [grid_sweep(categories[0], split)]
    tps_values = [v.strip() for v in tps.split(",") if v.strip()] if tps else []
    if tps and not tps_values:
        raise ServesimError("--tp is empty; give comma-separated TP degrees, e.g. 1,2,4,8")
    return [model_sweep(categories or list(CATEGORIES), models, tps_values, split.get("tokens", []))]
