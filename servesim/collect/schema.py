"""The collection format: what each category's CSV holds, and how one measured shape maps onto a kernel object.

A collection is a directory with one CSV per kernel category (``gemm.csv`` holds both the BF16 ``gemm`` rows and
the FP8 ``scaled_mm`` rows), ``launches.csv`` (the CUDA kernels torch.profiler saw) and ``manifest.json``. The
category files carry the columns of the aiconfigurator-core loaders in :mod:`servesim.data.aiconfigurator`
(ids, shape, dtypes, ``latency_us``, ``source``) so one code path trains from both, followed by the spread of the
repetitions. docs/collect.md is the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.data.aiconfigurator import ID_COLUMNS
from servesim.errors import ServesimError, suggest
from servesim.kernels.types import (
    AttentionDecode,
    AttentionPrefill,
    Gemm,
    Kernel,
    RMSNorm,
    Rope,
    ScaledMM,
    SiluMul,
)

MANIFEST_FILE = "manifest.json"
LAUNCHES_FILE = "launches.csv"
FORMAT_VERSION = "servesim-collection/1"

SYSTEM = "local"
BACKEND = "torch"
#: The ``gpu`` column of a ``--device cpu`` collection: never a catalogue GPU name.
CPU_LABEL = "cpu"

#: Columns after ``source`` in the files (not returned by ``load_collection``): the repetitions' spread.
SPREAD_COLUMNS: tuple[str, ...] = ("latency_p10_us", "latency_p90_us", "repetitions")

#: Attention dtypes collected: the engines' BF16 attention with a BF16 KV cache.
ATTENTION_DTYPE = "bf16"
ELEMENTWISE_DTYPE = "bf16"


@dataclass(frozen=True)
class CategorySchema:
    """One kernel category of a collection: its file, integer shape columns and string dtype columns.

    ``row_dtype`` selects this category's rows when two categories share a file (``gemm`` bf16, ``scaled_mm``
    fp8 in ``gemm.csv``).
    """

    name: str
    file: str
    shape_columns: tuple[str, ...]
    label_columns: tuple[str, ...]
    row_dtype: str

    @property
    def key_columns(self) -> tuple[str, ...]:
        """What identifies a measured shape (with the kernel source): shape then dtype columns."""
        return (*self.shape_columns, *self.label_columns)

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns :func:`servesim.collect.load_collection` returns, as the aiconfigurator loaders do."""
        return (*ID_COLUMNS, *self.key_columns, "latency_us", "source")

    @property
    def file_columns(self) -> tuple[str, ...]:
        return (*self.columns, *SPREAD_COLUMNS)


_GEMM_SHAPE = ("m", "n", "k")
_CONTEXT_SHAPE = ("batch", "seq_len", "prefix_len", "num_heads", "num_kv_heads", "head_dim", "window_size")
_GENERATION_SHAPE = ("batch", "kv_len", "num_heads", "num_kv_heads", "head_dim", "window_size")

#: The estimator's category names, in measuring order.
CATEGORIES: dict[str, CategorySchema] = {
    schema.name: schema
    for schema in (
        CategorySchema("gemm", "gemm.csv", _GEMM_SHAPE, ("dtype", "scaling"), "bf16"),
        CategorySchema("scaled_mm", "gemm.csv", _GEMM_SHAPE, ("dtype", "scaling"), "fp8"),
        CategorySchema("context_attention", "context_attention.csv", _CONTEXT_SHAPE, ("dtype", "kv_dtype"),
                       ATTENTION_DTYPE),
        CategorySchema("generation_attention", "generation_attention.csv", _GENERATION_SHAPE, ("dtype", "kv_dtype"),
                       ATTENTION_DTYPE),
        CategorySchema("rmsnorm", "rmsnorm.csv", ("num_tokens", "hidden"), ("dtype",), ELEMENTWISE_DTYPE),
        CategorySchema("silu_mul", "silu_mul.csv", ("num_tokens", "hidden"), ("dtype",), ELEMENTWISE_DTYPE),
        CategorySchema("rope", "rope.csv", ("num_tokens", "num_heads", "num_kv_heads", "head_dim"), ("dtype",),
                       ELEMENTWISE_DTYPE),
        CategorySchema("residual_add", "residual_add.csv", ("num_tokens", "hidden"), ("dtype",), ELEMENTWISE_DTYPE),
    )
}

#: The fixed (non-swept) dtype columns of each category's rows.
_LABELS: dict[str, tuple[str, ...]] = {
    "gemm": ("bf16", "none"),
    "scaled_mm": ("fp8", "tensor"),
    "context_attention": (ATTENTION_DTYPE, ATTENTION_DTYPE),
    "generation_attention": (ATTENTION_DTYPE, ATTENTION_DTYPE),
    **{c: (ELEMENTWISE_DTYPE,) for c in ("rmsnorm", "silu_mul", "rope", "residual_add")},
}


def get_schema(category: str) -> CategorySchema:
    try:
        return CATEGORIES[category]
    except KeyError:
        raise ServesimError(
            f"unknown kernel category {category!r}; choose from {', '.join(CATEGORIES)}.{suggest(category, CATEGORIES)}"
        ) from None


@dataclass(frozen=True, order=True)
class Shape:
    """One measured configuration: ``values`` in the order of its category's ``key_columns``."""

    category: str
    values: tuple[int | str, ...]

    def as_dict(self) -> dict[str, int | str]:
        return dict(zip(CATEGORIES[self.category].key_columns, self.values))

    def describe(self) -> str:
        """``m=16 n=64 k=64 dtype=bf16 scaling=none``: the form ``launches.csv`` stores and :func:`parse_shape`
        reads."""
        return " ".join(f"{column}={value}" for column, value in self.as_dict().items())


def make_shape(category: str, **shape: int) -> Shape:
    """The shape of ``category`` with these integer columns and the category's fixed dtype columns."""
    schema = get_schema(category)
    return Shape(category, (*(int(shape[c]) for c in schema.shape_columns), *_LABELS[category]))


def parse_shape(category: str, text: str) -> Shape:
    """Read :meth:`Shape.describe` back; raises ServesimError on anything else."""
    schema = get_schema(category)
    try:
        pairs = dict(item.split("=", 1) for item in text.split())
        values = tuple(int(pairs[c]) for c in schema.shape_columns) + tuple(pairs[c] for c in schema.label_columns)
    except (KeyError, ValueError):
        raise ServesimError(
            f"cannot read {category} shape {text!r}; expected {' '.join(f'{c}=...' for c in schema.key_columns)}"
        ) from None
    return Shape(category, values)


def shape_kernel(shape: Shape, attention_backend: str = "") -> Kernel | None:
    """The servesim kernel object a measured shape is, field for field; None for ``residual_add``, which the
    engines fuse into :class:`AddRMSNorm` and which has no kernel type of its own.

    Attention rows are batches of equal requests with contiguous (``ragged``) K/V; ``attention_backend`` names
    the decomposer's backend of the implementation measured (``fa2``, ``fa3``, ``flashinfer``).
    """
    s = shape.as_dict()
    if shape.category == "gemm":
        return Gemm(m=s["m"], n=s["n"], k=s["k"], dtype=s["dtype"], out_dtype=s["dtype"])
    if shape.category == "scaled_mm":
        return ScaledMM(m=s["m"], n=s["n"], k=s["k"], scale=s["scaling"], out_dtype="bf16", library="cublaslt")
    heads = {}
    if shape.category in ("context_attention", "generation_attention"):
        heads = dict(num_heads=s["num_heads"], num_kv_heads=s["num_kv_heads"], head_dim=s["head_dim"],
                     backend=attention_backend, dtype=s["dtype"], kv_dtype=s["kv_dtype"])
    if shape.category == "context_attention":
        return AttentionPrefill(query_lens=(s["seq_len"],) * s["batch"],
                                kv_lens=(s["seq_len"] + s["prefix_len"],) * s["batch"], kv_layout="ragged", **heads)
    if shape.category == "generation_attention":
        return AttentionDecode(kv_lens=(s["kv_len"],) * s["batch"], **heads)
    if shape.category == "rmsnorm":
        return RMSNorm(rows=s["num_tokens"], dim=s["hidden"], dtype=s["dtype"])
    if shape.category == "silu_mul":
        return SiluMul(tokens=s["num_tokens"], dim=s["hidden"], dtype=s["dtype"])
    if shape.category == "rope":
        return Rope(tokens=s["num_tokens"], num_heads=s["num_heads"], num_kv_heads=s["num_kv_heads"],
                    head_dim=s["head_dim"], dtype=s["dtype"])
    return None
