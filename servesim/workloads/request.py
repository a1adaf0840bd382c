"""The request stream the serving simulator consumes: :class:`Request` and :class:`Workload`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from servesim.workloads.prefix import PromptSegments

ArrivalMode = Literal["open", "closed"]


@dataclass(frozen=True)
class Request:
    """One inference request: when it arrives, how many prompt tokens it brings and how many tokens it generates."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


def _frozen_array(values: Iterable, dtype: type) -> np.ndarray:
    array = np.array(values, dtype=dtype)
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class Workload:
    """A seeded stream of requests, stored column-wise (request ``i`` is element ``i`` of each array).

    ``arrival_mode`` says how the simulator issues requests:

    - ``"open"``: request ``i`` arrives at ``arrival_s[i]`` whatever the server is doing.
    - ``"closed"``: at most ``concurrency`` requests are in flight (N clients, each sending its next request when
      its last one finishes, as ``vllm bench serve --max-concurrency`` does). Request ``i`` is issued at the later
      of ``arrival_s[i]`` and the moment a client becomes free; for a pure closed loop every ``arrival_s`` is 0.

    ``arrival_process`` names what produced the arrival times (``poisson``, ``gamma``, ``burst``, ``trace``).

    ``prefixes`` says which prompts share leading tokens (:mod:`servesim.workloads.prefix`); None means every
    prompt is its own text, so a prefix cache never hits.
    """

    name: str
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    arrival_s: np.ndarray
    arrival_mode: ArrivalMode = "open"
    concurrency: int | None = None
    seed: int | None = None
    arrival_process: str = "given"
    prefixes: PromptSegments | None = None

    def __post_init__(self) -> None:
        prompt = _frozen_array(self.prompt_tokens, np.int64)
        output = _frozen_array(self.output_tokens, np.int64)
        arrival = _frozen_array(self.arrival_s, np.float64)
        if not (prompt.ndim == output.ndim == arrival.ndim == 1 and len(prompt) == len(output) == len(arrival)):
            raise ValueError("prompt_tokens, output_tokens and arrival_s must be 1-D arrays of one length")
        if len(prompt) and (prompt.min() < 1 or output.min() < 1):
            raise ValueError("every request needs at least 1 prompt token and 1 output token")
        if not np.isfinite(arrival).all() or (np.diff(arrival) < 0).any():
            raise ValueError("arrival_s must be finite and non-decreasing")
        if self.arrival_mode not in ("open", "closed"):
            raise ValueError(f"arrival_mode must be 'open' or 'closed', not {self.arrival_mode!r}")
        if self.arrival_mode == "open" and self.concurrency is not None:
            raise ValueError("an open workload has no concurrency limit; use arrival_mode='closed'")
        if self.arrival_mode == "closed" and (self.concurrency is None or self.concurrency < 1):
            raise ValueError("a closed workload needs concurrency >= 1")
        if self.prefixes is not None and (len(self.prefixes) != len(prompt)
                                          or not np.array_equal(self.prefixes.prompt_tokens(), prompt)):
            raise ValueError("prefixes must give every request's prompt as segments adding up to its prompt_tokens")
        object.__setattr__(self, "prompt_tokens", prompt)
        object.__setattr__(self, "output_tokens", output)
        object.__setattr__(self, "arrival_s", arrival)

    @classmethod
    def from_requests(cls, name: str, requests: Iterable[Request], **kwargs) -> Workload:
        """Build a workload from :class:`Request` objects (sorted by arrival); ``kwargs`` are the other fields."""
        ordered = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        return cls(
            name=name,
            prompt_tokens=[r.prompt_tokens for r in ordered],
            output_tokens=[r.output_tokens for r in ordered],
            arrival_s=[r.arrival_s for r in ordered],
            **kwargs,
        )

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Workload):
            return NotImplemented
        return (
            (self.name, self.arrival_mode, self.concurrency, self.seed, self.arrival_process)
            == (other.name, other.arrival_mode, other.concurrency, other.seed, other.arrival_process)
            and np.array_equal(self.prompt_tokens, other.prompt_tokens)
            and np.array_equal(self.output_tokens, other.output_tokens)
            and np.array_equal(self.arrival_s, other.arrival_s)
            and self.prefixes == other.prefixes
        )

    __hash__ = None  # holds arrays

    @property
    def requests(self) -> tuple[Request, ...]:
        """The requests as objects, ``request_id`` = position in arrival order."""
        return tuple(
            Request(i, arrival, prompt, output)
            for i, (arrival, prompt, output) in enumerate(
                zip(self.arrival_s.tolist(), self.prompt_tokens.tolist(), self.output_tokens.tolist())
            )
        )
