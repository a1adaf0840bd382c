"""Option types shared by the commands, so that a bad value is refused where it is typed, with one line, before any
work starts: a seed numpy accepts, a rate or limit that is a positive finite number, a file to write into a folder
that exists."""

from __future__ import annotations

import math
from pathlib import Path

import click

from servesim.limits import MAX_REPLICAS, MAX_REQUESTS, MAX_TOKENS

#: numpy's generators take seeds in [0, 2**32).
SEED = click.IntRange(0, 2**32 - 1)

#: A kernel dimension, head count or token count.
DIMENSION = click.IntRange(1, MAX_TOKENS)
#: Requests to simulate or generate.
REQUEST_COUNT = click.IntRange(1, MAX_REQUESTS)
#: Engine replicas to simulate.
REPLICA_COUNT = click.IntRange(1, MAX_REPLICAS)


class PositiveFinite(click.ParamType):
    """A float above zero and finite: rates and latency limits (click's FloatRange lets inf and nan through)."""

    name = "float"

    def convert(self, value, param, ctx) -> float:
        number = click.FLOAT.convert(value, param, ctx)
        if not (number > 0 and math.isfinite(number)):
            self.fail(f"{value!r} is not a positive finite number", param, ctx)
        return number


POSITIVE_FINITE = PositiveFinite()


class OutputFile(click.Path):
    """A file to write: not a folder, in a folder that exists (checked before the command runs, not after)."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False, path_type=Path)

    def convert(self, value, param, ctx) -> Path:
        if not str(value).strip():
            self.fail("needs a file name", param, ctx)
        path = super().convert(value, param, ctx)
        folder = path.parent
        if not folder.is_dir():
            self.fail(f"folder '{folder}' does not exist; create it or write elsewhere", param, ctx)
        return path


__all__ = ["DIMENSION", "POSITIVE_FINITE", "REPLICA_COUNT", "REQUEST_COUNT", "SEED", "OutputFile", "PositiveFinite"]


def engine_option(func):
    """Add ``--engine``: an engine of the registry (its newest modelled release) or one of its releases
    (``vllm==0.12.0``), refused with servesim's one-line error before any work."""
    from servesim.serving.engines import ENGINE_CHOICES, parse_engine

    def check(ctx, param, spec: str) -> str:
        parse_engine(spec)
        return spec.strip().lower()

    return click.option("--engine", default="vllm", show_default=True, callback=check, metavar="ENGINE[==RELEASE]",
                        help=f"Serving engine and release whose kernels, defaults, memory rules and scheduler are "
                             f"modelled: {', '.join(ENGINE_CHOICES)} (an engine alone: its newest modelled "
                             f"release).")(func)


def engine_behaviour_options(func):
    """Add ``--prefix-caching/--no-prefix-caching`` and ``--async-scheduling/--no-async-scheduling`` (default: the
    release's own), as ``prefix_caching`` and ``async_scheduling`` (None when not given)."""
    func = click.option("--async-scheduling/--no-async-scheduling", default=None,
                        help="Host schedules step n+1 while step n runs (vLLM --async-scheduling, SGLang's overlap "
                             "scheduler) [default: the release's].")(func)
    return click.option("--prefix-caching/--no-prefix-caching", default=None,
                        help="Prefix cache (vLLM automatic prefix caching, SGLang's radix cache) [default: on, as "
                             "in every modelled release].")(func)
