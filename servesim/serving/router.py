"""Routers that spread requests over replicas: each picks a replica from their outstanding request counts."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from servesim.errors import ServesimError, suggest

#: A router: outstanding requests per replica (waiting + running) -> the replica that gets the next request.
Router = Callable[[Sequence[int]], int]

ROUTERS = ("round_robin", "least_outstanding", "random")


def _round_robin() -> Router:
    turn = -1

    def pick(outstanding: Sequence[int]) -> int:
        nonlocal turn
        turn = (turn + 1) % len(outstanding)
        return turn

    return pick


def _least_outstanding(outstanding: Sequence[int]) -> int:
    """The replica with the fewest requests in it; the lowest index among equals."""
    return min(range(len(outstanding)), key=outstanding.__getitem__)


def _random(seed: int) -> Router:
    rng = np.random.default_rng(seed)
    return lambda outstanding: int(rng.integers(len(outstanding)))


def make_router(name: str, seed: int = 0) -> Router:
    """A fresh router (round-robin keeps a turn, random a seeded generator)."""
    if name == "round_robin":
        return _round_robin()
    if name == "least_outstanding":
        return _least_outstanding
    if name == "random":
        return _random(seed)
    raise ServesimError(f"unknown router {name!r}.{suggest(name, ROUTERS)} Use one of {', '.join(ROUTERS)}.")
