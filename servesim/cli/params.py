"""Option types shared by the commands, so that a bad value is refused where it is typed, with one line, before any
work starts: a seed numpy accepts, a rate or limit that is a positive finite number, a file to write into a folder
that exists."""

from __future__ import annotations

import math
import os
import shlex
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


def _unwritable(folder: Path) -> str | None:
    """Why no file can be created in the existing folder ``folder`` (tried, not guessed from permission bits: a
    read-only file system or /sys refuses writes that the mode bits allow), or None."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


class OutputFile(click.Path):
    """A file to write: not a folder, in a folder that exists and takes new files, and not a file that exists but
    cannot be overwritten (checked before the command runs, not after)."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False, path_type=Path)

    def convert(self, value, param, ctx) -> Path:
        if not str(value).strip():
            self.fail("needs a file name", param, ctx)
        path = super().convert(value, param, ctx)
        folder = path.parent
        if not folder.is_dir():
            self.fail(f"folder '{folder}' does not exist; create it or write elsewhere", param, ctx)
        why = _unwritable(folder)
        if why is None and path.exists() and not os.access(path, os.W_OK):
            why = "the file is read-only"
        if why is None and path.exists() and not path.is_file():
            why = "it is not a regular file"
        if why is not None:
            self.fail(f"cannot write '{path}' ({why}); give a path in a folder you can write to", param, ctx)
        return path


class OutputFolder(click.Path):
    """A folder to write files into: an existing folder that takes new files, or one that can be created (its
    nearest existing parent takes new folders). Checked before the command runs, not after."""

    def __init__(self) -> None:
        super().__init__(file_okay=False, path_type=Path)

    def convert(self, value, param, ctx) -> Path:
        if not str(value).strip():
            self.fail("needs a folder name", param, ctx)
        path = super().convert(value, param, ctx)
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            self.fail(f"'{existing}' is a file, so folder '{path}' cannot be created there; give another folder",
                      param, ctx)
        why = _unwritable(existing)
        if why is not None:
            where = "" if existing == path else f" (its parent '{existing}' is not writable)"
            self.fail(f"cannot write into folder '{path}'{where}: {why}; give a folder you can write to",
                      param, ctx)
        return path


__all__ = ["DIMENSION", "POSITIVE_FINITE", "REPLICA_COUNT", "REQUEST_COUNT", "SEED", "OutputFile", "OutputFolder",
           "PositiveFinite"]


def engine_spec(ctx, param, spec: str | None) -> str | None:
    """Click callback: an engine of the registry or one of its releases (``vllm==0.12.0``), refused with servesim's
    one-line error before any work; None passes (an option left to its default)."""
    from servesim.serving.engines import parse_engine

    if spec is None:
        return None
    parse_engine(spec)
    return spec.strip().lower()


def engine_option(func):
    """Add ``--engine``: an engine of the registry (its newest modelled release) or one of its releases."""
    from servesim.serving.engines import ENGINE_CHOICES

    return click.option("--engine", default="vllm", show_default=True, callback=engine_spec, metavar="ENGINE[==RELEASE]",
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


def ep_option(func):
    """Add ``--ep``: the GPUs of each TP group a MoE model's experts are split over (1: none)."""
    return click.option("--ep", default=1, show_default=True, type=DIMENSION,
                        help="Expert parallelism: split the routed experts over this many of the TP GPUs, each "
                             "expert's width over the rest (vLLM --enable-expert-parallel: 1 or TP; SGLang "
                             "--ep-size: a divisor of TP). MoE models only.")(func)


def dp_option(func):
    """Add ``--dp``: attention data-parallel ranks sharing a MoE model's TP group (1: none)."""
    return click.option("--dp", default=1, show_default=True, type=DIMENSION,
                        help="Attention data parallelism: split the TP GPUs into this many ranks, each with its own "
                             "requests, KV cache and attention over TP/DP GPUs, joined for the MoE layers (vLLM "
                             "--data-parallel-size DP --tensor-parallel-size TP/DP; SGLang --dp-size DP "
                             "--enable-dp-attention). MoE models only.")(func)


def plan_degree(ctx, param, text: str) -> int | None:
    """Click callback of plan's ``--ep`` and ``--dp``: a positive integer, or ``search`` (None)."""
    if text.strip().lower() == "search":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        flag = f"--{param.name}"
        raise click.BadParameter(f"{text!r} is neither a positive integer nor 'search'; use e.g. {flag} 1, {flag} 8 "
                                 f"or {flag} search")
    return value


def scheduler_recv_interval_option(func):
    """Add ``--scheduler-recv-interval`` (SGLang) as ``scheduler_recv_interval`` (None when not given)."""
    return click.option("--scheduler-recv-interval", type=DIMENSION, default=None,
                        help="SGLang --scheduler-recv-interval: take new requests in every N decode batches "
                             "[default: 1].")(func)


def max_cudagraph_capture_size_option(func):
    """Add ``--max-cudagraph-capture-size`` (vLLM) as ``max_cudagraph_capture_size`` (None when not given)."""
    return click.option("--max-cudagraph-capture-size", type=DIMENSION, default=None,
                        help="vLLM --max-cudagraph-capture-size: the largest step, in tokens, run in a CUDA graph; "
                             "larger steps run eagerly [default: min(2 x max_num_seqs, 512); gpt-oss 1024].")(func)


def stream_interval_option(func):
    """Add ``--stream-interval`` (both engines) as ``stream_interval`` (None when not given)."""
    return click.option("--stream-interval", type=DIMENSION, default=None,
                        help="Tokens per streamed chunk (the engines' --stream-interval; vLLM 0.12.0 on): the first "
                             "token goes at once, then every N-th and the last; ITL is timed between chunks "
                             "[default: 1].")(func)


def mxfp4_moe_backend_option(func):
    """Add ``--mxfp4-moe-backend`` (:data:`servesim.kernels.engines.MXFP4_MOE_BACKENDS`) as ``mxfp4_moe_backend``."""
    from servesim.kernels.engines import MXFP4_MOE_BACKENDS

    return click.option("--mxfp4-moe-backend", type=click.Choice(MXFP4_MOE_BACKENDS), default="auto",
                        show_default=True,
                        help="MoE kernel of MXFP4 experts (gpt-oss): auto (vLLM: Marlin below compute capability "
                             "9.0, Triton on Hopper; both engines: FlashInfer's TRT-LLM MoE on Blackwell), marlin "
                             "(vLLM with VLLM_MXFP4_USE_MARLIN=1), triton, flashinfer (Blackwell, BF16 activations) "
                             "or flashinfer-mxfp8 (vLLM on Blackwell with "
                             "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1).")(func)


def moe_backend_option(func):
    """Add ``--moe-backend`` (:data:`servesim.kernels.engines.MOE_BACKENDS`) as ``moe_backend``."""
    from servesim.kernels.engines import MOE_BACKENDS

    return click.option("--moe-backend", type=click.Choice(MOE_BACKENDS), default="auto", show_default=True,
                        help="MoE kernel of BF16 and FP8 experts: auto (SGLang: FlashInfer's TRT-LLM MoE on "
                             "Blackwell for the models it picks it for; otherwise the Triton fused MoE), triton, or "
                             "flashinfer-trtllm (Blackwell; vLLM with VLLM_USE_FLASHINFER_MOE_FP8=1, SGLang "
                             "--moe-runner-backend flashinfer_trtllm).")(func)


def cap_lengths_fix(source: str, workload_flags: list[str], context_tokens: int | None, longest_output: int) -> str:
    """What to do about a workload whose requests exceed the model's context of ``context_tokens``: the
    ``servesim workload`` command that writes it again with outputs cut to a quarter of the context at most and
    prompts to the rest (``workload_flags`` rebuild the same requests: rate, count, seed), then the file to pass."""
    if not context_tokens:
        from servesim.models.config import CAP_LENGTHS

        return CAP_LENGTHS
    max_output = min(longest_output, context_tokens // 4)
    command = shlex.join(["servesim", "workload", source, *workload_flags,
                          "--max-prompt-tokens", str(context_tokens - max_output),
                          "--max-output-tokens", str(max_output), "--out", "capped.csv"])
    return f"cap its lengths ({command}, then --workload capped.csv) or choose a model with a longer context"


def workload_flags(num_requests: int | None = None, qps: float | None = None, concurrency: int | None = None,
                   arrival: str | None = None, cv: float | None = None, seed: int = 0,
                   columns: str | None = None) -> list[str]:
    """The ``servesim workload`` flags that build the same requests as these options of another command."""
    given = (("-n", num_requests), ("--qps", qps), ("--concurrency", concurrency), ("--arrival", arrival),
             ("--cv", cv if arrival == "gamma" else None), ("--seed", seed or None), ("--columns", columns))
    return [text for flag, value in given if value is not None for text in (flag, str(value))]
