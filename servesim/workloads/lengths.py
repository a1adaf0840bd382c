"""Request length distributions.

A *length distribution* draws one kind of token count (``sample(rng, n)`` → ``n`` integers ≥ 1). A *joint length
distribution* draws (prompt, output) pairs (``sample(rng, n)`` → an ``(n, 2)`` array, column 0 prompt tokens,
column 1 output tokens): either two independent length distributions, or an empirical joint fitted to a trace.

Synthetic pairs are written as a spec ``KIND:PROMPT:OUTPUT`` (see :func:`parse_length_spec`), e.g.
``fixed:1024:128``, ``uniform:512-2048:64-256``, ``lognormal:2048,0.5:256,1.0``, ``zipf:16-8192,1.1:128``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from servesim.errors import ServesimError
from servesim.limits import MAX_CV, MAX_TOKENS


class LengthDistribution(Protocol):
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray: ...


def _as_tokens(values: np.ndarray) -> np.ndarray:
    """Round to whole tokens, at least 1; a draw beyond :data:`MAX_TOKENS` is refused rather than wrapped."""
    if values.size and not values.max() <= MAX_TOKENS:
        raise ServesimError(f"a length distribution drew {values.max():.3g} tokens, beyond the {MAX_TOKENS:,} the "
                            "engines count to; lower its mean or cv")
    return np.maximum(np.rint(values), 1).astype(np.int64)


def _check_range(kind: str, low: int, high: int) -> None:
    if not 1 <= low <= high <= MAX_TOKENS:
        raise ServesimError(f"a {kind} length range needs 1 <= low <= high <= {MAX_TOKENS:,}, not {low}-{high}")


@dataclass(frozen=True)
class Fixed:
    tokens: int

    def __post_init__(self) -> None:
        if not 1 <= self.tokens <= MAX_TOKENS:
            raise ServesimError(f"a fixed length must be 1 to {MAX_TOKENS:,} tokens, not {self.tokens}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.tokens, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    """Every length from ``low`` to ``high`` (both included) equally likely."""

    low: int
    high: int

    def __post_init__(self) -> None:
        _check_range("uniform", self.low, self.high)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)


#: Lengths a Zipf range may span: its CDF is a table of one float per length (128 MiB at this size), which covers
#: every context window of the presets many times over.
_MAX_ZIPF_SPAN = 2**24


@dataclass(frozen=True)
class Zipf:
    """Bounded Zipf: length ``low + k - 1`` has probability ∝ ``k ** -theta`` for ``k = 1 … high - low + 1``.

    Short requests are the most common and long ones form a heavy tail (Vidur's ``zipf`` length generator, drawn
    exactly by inverse CDF rather than with its approximation).
    """

    low: int
    high: int
    theta: float = 1.0

    def __post_init__(self) -> None:
        _check_range("Zipf", self.low, self.high)
        if self.high - self.low >= _MAX_ZIPF_SPAN:
            raise ServesimError(f"a Zipf length range spans at most {_MAX_ZIPF_SPAN:,} lengths (its CDF is tabulated), "
                                f"not {self.low}-{self.high}")
        if not self.theta > 0:
            raise ServesimError(f"the Zipf exponent theta must be positive, not {self.theta}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        ranks = np.arange(1, self.high - self.low + 2, dtype=np.float64)
        cdf = np.cumsum(ranks**-self.theta)
        index = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
        return self.low + np.minimum(index, len(ranks) - 1).astype(np.int64)


@dataclass(frozen=True)
class LogNormal:
    """Log-normal lengths given by their mean and coefficient of variation (std / mean), rounded to tokens."""

    mean: float
    cv: float

    def __post_init__(self) -> None:
        if not (1 <= self.mean <= MAX_TOKENS and 0 < self.cv <= MAX_CV):
            raise ServesimError(f"a log-normal length needs a mean of 1 to {MAX_TOKENS:,} tokens and a cv above 0 "
                                f"and at most {MAX_CV:g}, not mean {self.mean}, cv {self.cv}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        sigma = math.sqrt(math.log1p(self.cv**2))
        return _as_tokens(rng.lognormal(math.log(self.mean) - sigma**2 / 2, sigma, size=n))


@dataclass(frozen=True)
class QuantileTable:
    """An empirical distribution stored as its inverse CDF: ``values[i]`` at cumulative probability ``probs[i]``,
    linear in between. :meth:`fit` keeps a uniform grid plus the exact largest observations, so heavy tails (and
    therefore means) survive the compression."""

    probs: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        probs, values = np.asarray(self.probs), np.asarray(self.values)
        if len(probs) < 2 or len(probs) != len(values) or probs[0] != 0 or probs[-1] != 1:
            raise ValueError("a quantile table needs matching probs and values, probs running from 0 to 1")
        if (np.diff(probs) <= 0).any() or (np.diff(values) < 0).any():
            raise ValueError("quantile table probs must increase and values must not decrease")

    @classmethod
    def fit(cls, samples: np.ndarray, grid_points: int = 257, tail_points: int = 32) -> QuantileTable:
        """Quantiles of ``samples`` on ``grid_points`` evenly spaced probabilities and at the ``tail_points``
        largest samples (6 significant digits)."""
        samples = np.asarray(samples, dtype=np.float64)
        last = len(samples) - 1
        tail = (last - np.arange(min(tail_points, last))) / last
        probs = np.unique(np.round(np.concatenate([np.linspace(0, 1, grid_points), tail]), 10))
        values = np.quantile(samples, probs)
        return cls(tuple(probs.tolist()), tuple(float(f"{v:.6g}") for v in values))

    @property
    def mean(self) -> float:
        """The mean of the piecewise-linear distribution the table describes."""
        values = np.asarray(self.values)
        return float(np.sum(np.diff(self.probs) * (values[1:] + values[:-1]) / 2))

    def quantile(self, u: np.ndarray) -> np.ndarray:
        return np.interp(u, self.probs, self.values)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.quantile(rng.random(n))

    def to_dict(self) -> dict:
        return {"probs": list(self.probs), "values": list(self.values)}

    @classmethod
    def from_dict(cls, record: dict) -> QuantileTable:
        return cls(tuple(record["probs"]), tuple(record["values"]))


@dataclass(frozen=True)
class IndependentLengths:
    """Prompt and output lengths drawn independently of each other."""

    prompt: LengthDistribution
    output: LengthDistribution

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.column_stack([self.prompt.sample(rng, n), self.output.sample(rng, n)])


@dataclass(frozen=True)
class EmpiricalLengths:
    """(prompt, output) pairs that follow a trace: each marginal is a :class:`QuantileTable`, and their dependence
    is an empirical copula, a ``bins × bins`` histogram of (prompt rank, output rank) counts.

    A draw picks a copula cell by its count, a uniform point inside it, and maps that point's two coordinates
    through the marginals, so means and percentiles of both lengths and their rank correlation follow the trace.
    """

    prompt: QuantileTable
    output: QuantileTable
    copula: tuple[tuple[int, ...], ...]

    @classmethod
    def fit(cls, prompt_tokens: np.ndarray, output_tokens: np.ndarray, bins: int = 20) -> EmpiricalLengths:
        n = len(prompt_tokens)
        rows = np.argsort(np.argsort(prompt_tokens, kind="stable"), kind="stable") * bins // n
        cols = np.argsort(np.argsort(output_tokens, kind="stable"), kind="stable") * bins // n
        counts = np.zeros((bins, bins), dtype=np.int64)
        np.add.at(counts, (rows, cols), 1)
        return cls(
            QuantileTable.fit(prompt_tokens),
            QuantileTable.fit(output_tokens),
            tuple(tuple(row) for row in counts.tolist()),
        )

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        counts = np.asarray(self.copula, dtype=np.float64)
        bins = counts.shape[0]
        cells = rng.choice(counts.size, size=n, p=counts.ravel() / counts.sum())
        row, col = np.divmod(cells, bins)
        u = (row + rng.random(n)) / bins
        v = (col + rng.random(n)) / bins
        return np.column_stack([_as_tokens(self.prompt.quantile(u)), _as_tokens(self.output.quantile(v))])

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt.to_dict(),
            "output_tokens": self.output.to_dict(),
            "copula": [list(row) for row in self.copula],
        }

    @classmethod
    def from_dict(cls, record: dict) -> EmpiricalLengths:
        return cls(
            QuantileTable.from_dict(record["prompt_tokens"]),
            QuantileTable.from_dict(record["output_tokens"]),
            tuple(tuple(row) for row in record["copula"]),
        )


def _ints(text: str, count: int) -> list[int]:
    parts = text.split("-")
    if len(parts) != count:
        raise ValueError
    return [int(p) for p in parts]


def _fixed(args: Sequence[str]) -> LengthDistribution:
    (tokens,) = args
    return Fixed(int(tokens))


def _uniform(args: Sequence[str]) -> LengthDistribution:
    (span,) = args
    return Uniform(*_ints(span, 2))


def _lognormal(args: Sequence[str]) -> LengthDistribution:
    mean, cv = args
    return LogNormal(float(mean), float(cv))


def _zipf(args: Sequence[str]) -> LengthDistribution:
    if len(args) not in (1, 2):
        raise ValueError
    return Zipf(*_ints(args[0], 2), *(float(a) for a in args[1:]))


#: spec kind → (parser of one side's comma-separated arguments, the side's syntax, an example spec)
SPEC_KINDS: dict[str, tuple[Callable[[Sequence[str]], LengthDistribution], str, str]] = {
    "fixed": (_fixed, "TOKENS", "fixed:1024:128"),
    "uniform": (_uniform, "LOW-HIGH", "uniform:512-2048:64-256"),
    "lognormal": (_lognormal, "MEAN,CV", "lognormal:2048,0.5:256,1.0"),
    "zipf": (_zipf, "LOW-HIGH[,THETA]", "zipf:16-8192,1.1:16-1024"),
}


def is_length_spec(text: str) -> bool:
    return text.split(":", 1)[0].strip().lower() in SPEC_KINDS


def parse_length_spec(spec: str) -> IndependentLengths:
    """Read ``KIND:PROMPT:OUTPUT``, each side in the kind's syntax (``SPEC_KINDS``) or a bare integer (a fixed
    length): ``fixed:1024:128``, ``uniform:512-2048:64-256``, ``lognormal:MEAN,CV:MEAN,CV`` (CV = std / mean),
    ``zipf:LOW-HIGH[,THETA]:LOW-HIGH[,THETA]`` (theta defaults to 1), ``lognormal:2048,0.5:128``."""
    kind, *sides = [part.strip() for part in spec.split(":")]
    kind = kind.lower()
    parse, syntax, example = SPEC_KINDS[kind]
    if len(sides) != 2:
        raise ServesimError(f"length spec {spec!r} needs a prompt and an output part: {kind}:{syntax}:{syntax}, "
                            f"e.g. {example}")
    dists = []
    for label, side in zip(("prompt", "output"), sides):
        try:
            dists.append(Fixed(int(side)) if side.isdigit() else parse(side.split(",")))
        except (ValueError, TypeError):
            raise ServesimError(
                f"cannot read the {label} part {side!r} of length spec {spec!r}: write {syntax} or a whole number "
                f"of tokens, e.g. {example}"
            ) from None
    return IndependentLengths(*dists)
