"""The GPU catalogue: ``gpus.toml`` shipped with the package, each figure with its source."""

from __future__ import annotations

import csv
import functools
import math
import re
import tomllib
from datetime import date
from importlib import resources
from pathlib import Path

from servesim.errors import ServesimError, suggest
from servesim.hardware.spec import GPU_SPEC_FIELDS, SOURCED_FIELDS, GpuSpec

_CATALOGUE_FILE = "gpus.toml"


def _normalise(name: str) -> str:
    """Case-, space-, dash- and underscore-insensitive key: 'h100 sxm' == 'H100-SXM' == 'h100_sxm'."""
    return re.sub(r"[\s_\-]+", "", name).lower()


def _parse_entry(raw: dict, references: dict[str, str]) -> GpuSpec:
    entry = dict(raw)
    name = entry.get("name", "<unnamed>")
    missing = [f for f in GPU_SPEC_FIELDS if f not in entry and f not in ("aliases", "sources")]
    if missing:
        raise ServesimError(f"GPU catalogue entry {name!r} lacks {', '.join(missing)}")
    unknown = sorted(set(entry) - set(GPU_SPEC_FIELDS))
    if unknown:
        raise ServesimError(f"GPU catalogue entry {name!r} has unknown fields {', '.join(unknown)}")
    sources = {key: references.get(ref, ref) for key, ref in entry.get("sources", {}).items()}
    entry["sources"] = sources
    entry["aliases"] = tuple(entry.get("aliases", ()))
    return GpuSpec(**entry)


@functools.cache
def load_catalogue(path: str | None = None) -> dict[str, GpuSpec]:
    """Load the catalogue (the shipped one unless ``path`` is given), keyed by canonical name."""
    if path is None:
        text = resources.files("servesim.hardware").joinpath(_CATALOGUE_FILE).read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    data = tomllib.loads(text)
    references = data.get("references", {})
    specs = [_parse_entry(raw, references) for raw in data.get("gpu", [])]
    return {spec.name: spec for spec in specs}


def missing_sources(spec: GpuSpec) -> list[str]:
    """Sourced fields of ``spec`` that carry no source."""
    return [f for f in SOURCED_FIELDS if not spec.sources.get(f)]


@functools.cache
def _alias_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for spec in load_catalogue().values():
        for key in (spec.name, *spec.aliases):
            norm = _normalise(key)
            if norm in index and index[norm] != spec.name:
                raise ServesimError(f"GPU alias {key!r} names both {index[norm]} and {spec.name}")
            index[norm] = spec.name
    return index


def gpu_names() -> list[str]:
    return list(load_catalogue())


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU up by name or alias; unknown names raise with the nearest names suggested."""
    canonical = _alias_index().get(_normalise(name))
    if canonical is None:
        pool = [*load_catalogue(), *(a for s in load_catalogue().values() for a in s.aliases)]
        raise ServesimError(
            f"unknown GPU {name!r}.{suggest(name, pool)} Run 'servesim gpus' to list the supported GPUs."
        )
    return load_catalogue()[canonical]


def parse_gpu_list(text: str) -> list[GpuSpec]:
    """'H100,H20' → specs; 'all' → the whole catalogue. Duplicates are removed, order kept."""
    if text.strip().lower() == "all":
        return list(load_catalogue().values())
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ServesimError("no GPU given: pass --gpus with a comma-separated list such as H100,H20, or 'all'")
    if any(name.lower() == "all" for name in names):
        raise ServesimError(f"--gpus {text!r}: 'all' already names every GPU; give it alone or list the GPUs")
    specs: dict[str, GpuSpec] = {}
    for name in names:
        spec = get_gpu(name)
        specs.setdefault(spec.name, spec)
    return list(specs.values())


def load_prices(path: str | Path) -> dict[str, tuple[float, str]]:
    """Read a user price file: CSV with columns ``gpu,usd_per_gpu_hour[,date]`` → {canonical name: (price, date)}."""
    prices: dict[str, tuple[float, str]] = {}
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            columns, rows = set(reader.fieldnames or ()), list(reader)
    except OSError as exc:
        raise ServesimError(f"cannot read price file {path}: {exc.strerror}") from None
    if not {"gpu", "usd_per_gpu_hour"} <= columns:
        raise ServesimError(f"price file {path} needs the columns gpu,usd_per_gpu_hour[,date]")
    if not rows:
        raise ServesimError(f"price file {path} has no prices; add a line per GPU under its header, e.g. H100,2.10")
    for line_no, row in enumerate(rows, start=2):
        price = parse_price(row["usd_per_gpu_hour"], f"{path} line {line_no}")
        prices[get_gpu(row["gpu"]).name] = (price, (row.get("date") or str(date.today())).strip())
    return prices


def parse_price(text: str, where: str) -> float:
    try:
        price = float(text)
    except (TypeError, ValueError):
        raise ServesimError(f"{where}: price {text!r} is not a number of USD per GPU-hour") from None
    if not price >= 0 or math.isinf(price):
        raise ServesimError(f"{where}: price {text!r} is not a price; give a finite number of USD per GPU-hour, "
                            f"0 or more")
    return price


def apply_prices(specs: list[GpuSpec], prices: dict[str, tuple[float, str]], source: str) -> list[GpuSpec]:
    """Replace catalogue prices with user prices where given."""
    return [
        spec.with_price(prices[spec.name][0], prices[spec.name][1], source) if spec.name in prices else spec
        for spec in specs
    ]
