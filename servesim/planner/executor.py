"""Where option searches run: local processes or a Ray cluster, behind one ``map`` interface.

The task function and its arguments are plain picklable values (:class:`servesim.planner.search.OptionTask`), so
the same function gives the same results on either executor; results come back in task order.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Protocol

from servesim.errors import ServesimError

EXECUTORS = ("local", "ray")


class Executor(Protocol):
    name: str

    @property
    def workers(self) -> int:
        """How many tasks run at once."""
        ...

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any],
            on_done: Callable[[int], None] | None = None) -> list[Any]:
        """``[fn(task) for task in tasks]``, computed in parallel; ``on_done`` is called with each task's index as it
        finishes."""
        ...

    def close(self) -> None: ...


class LocalExecutor:
    """A pool of ``jobs`` worker processes on this machine (in-process when ``jobs`` is 1)."""

    name = "local"

    def __init__(self, jobs: int | None = None) -> None:
        if jobs is not None and jobs < 1:
            raise ServesimError(f"--jobs must be at least 1, not {jobs}")
        self.jobs = jobs or os.cpu_count() or 1

    @property
    def workers(self) -> int:
        return self.jobs

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any],
            on_done: Callable[[int], None] | None = None) -> list[Any]:
        if self.jobs == 1 or len(tasks) <= 1:
            results = []
            for i, task in enumerate(tasks):
                results.append(fn(task))
                if on_done:
                    on_done(i)
            return results
        results: list[Any] = [None] * len(tasks)
        with ProcessPoolExecutor(max_workers=min(self.jobs, len(tasks))) as pool:
            futures = {pool.submit(fn, task): i for i, task in enumerate(tasks)}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                if on_done:
                    on_done(futures[future])
        return results

    def close(self) -> None:
        pass


class RayExecutor:
    """Tasks as Ray remote functions, one CPU each: on a cluster at ``address``, or on a Ray instance started here
    with ``jobs`` CPUs. Every Ray node needs servesim installed."""

    name = "ray"

    def __init__(self, address: str | None = None, jobs: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ServesimError("--executor ray needs Ray, which is not installed: pip install 'servesim[ray]'") from None
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            try:
                ray.init(address=address, num_cpus=None if address else jobs, include_dashboard=False,
                         log_to_driver=False, configure_logging=False)
            except ConnectionError as exc:
                raise ServesimError(f"cannot connect to the Ray cluster at {address}: {exc}; check --address "
                                    f"(host:port of the head node, or 'auto')") from None

    @property
    def workers(self) -> int:
        return max(1, int(self._ray.cluster_resources().get("CPU", 1)))

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any],
            on_done: Callable[[int], None] | None = None) -> list[Any]:
        ray = self._ray
        remote = ray.remote(num_cpus=1)(fn)
        refs = [remote.remote(task) for task in tasks]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            if on_done:
                for ref in done:
                    on_done(index[ref])
        return ray.get(refs)

    def close(self) -> None:
        """Stop the Ray instance if this executor started it."""
        if self._started:
            self._ray.shutdown()
            self._started = False


def make_executor(name: str, jobs: int | None = None, address: str | None = None) -> Executor:
    """The executor called ``name`` (``local`` or ``ray``)."""
    if address is not None and name != "ray":
        raise ServesimError("--address names a Ray cluster; use it with --executor ray")
    if name == "local":
        return LocalExecutor(jobs)
    if name == "ray":
        return RayExecutor(address, jobs)
    raise ServesimError(f"unknown executor {name!r}; use one of {', '.join(EXECUTORS)}")
