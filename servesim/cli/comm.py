"""``servesim kernel <collective>`` (one question about one collective) and ``servesim eval comm``.

``kernel_group`` and ``eval_group`` are click groups that other modules may add subcommands to.
"""

from __future__ import annotations

import click

from servesim.cli.output import Column, emit, output_format_options
from servesim.errors import ServesimError
from servesim.serving.engines import ENGINES

_IMPLEMENTATIONS = ("auto", "nccl", "custom_graph", "custom_eager")
#: :data:`servesim.training.comm_eval.BREAKDOWNS`, written out so that the CLI does not import the lab package.
_BREAKDOWNS = ("collective", "gpus", "size")


@click.group("kernel")
def kernel_group() -> None:
    """Predict the time of a single kernel or collective on a GPU."""


@click.group("eval")
def eval_group() -> None:
    """Measure the prediction error of servesim's models against measured data."""


def _collective_command(name: str, op: str, summary: str) -> click.Command:
    @kernel_group.command(name, help=f"{summary} Prints its predicted latency and bus bandwidth.")
    @click.option("--gpu", required=True, help="GPU name from 'servesim gpus', e.g. H100 or H20.")
    @click.option("--gpus", "group_size", type=click.IntRange(min=2), default=2, show_default=True,
                  help="GPUs taking part.")
    @click.option("--bytes", "size_text", required=True, help="Message size, e.g. 4096, 64KiB, 16MiB, 1.5GB.")
    @click.option("--engine", type=click.Choice(tuple(ENGINES)), default="vllm", show_default=True,
                  help="Engine whose collective choice (custom all-reduce or NCCL) is modelled.")
    @click.option("--implementation", type=click.Choice(_IMPLEMENTATIONS), default="auto", show_default=True,
                  help="auto: what the engine would run.")
    @click.option("--eager", is_flag=True, help="Outside a CUDA graph (prefill steps too large to capture).")
    @output_format_options
    def command(gpu: str, group_size: int, size_text: str, engine: str, implementation: str, eager: bool,
                output_format: str) -> None:
        from servesim.comm import allreduce_implementation, collective_time_us
        from servesim.comm.sizes import parse_bytes
        from servesim.hardware import get_gpu

        from servesim.limits import MAX_COLLECTIVE_NODES

        spec = get_gpu(gpu)
        most = spec.gpus_per_node * MAX_COLLECTIVE_NODES
        if group_size > most:
            raise ServesimError(f"--gpus {group_size} spans more than {MAX_COLLECTIVE_NODES} nodes of "
                                f"{spec.gpus_per_node} {spec.name}s, beyond what the communication model was "
                                f"measured on; use --gpus between 2 and {most}")
        message_bytes = parse_bytes(size_text)
        if implementation == "auto":
            implementation = (allreduce_implementation(engine, spec, group_size, message_bytes, cuda_graph=not eager)
                              if op == "all_reduce" else "nccl")
        latency_us = collective_time_us(op, message_bytes, group_size, spec, implementation, engine)
        row = {
            "gpu": spec.name, "gpus": group_size, "collective": op, "message_bytes": int(message_bytes),
            "implementation": implementation, "engine": engine if implementation != "nccl" else "-",
            "latency_ms": latency_us / 1e3, "algbw_gbps": message_bytes / latency_us / 1e3,
        }
        columns = [Column("gpu", "GPU", align="<"), Column("gpus", "GPUs"), Column("collective", "collective", align="<"),
                   Column("message_bytes", "bytes", ",d"), Column("implementation", "implementation", align="<"),
                   Column("engine", "engine", align="<"), Column("latency_ms", "latency (ms)", ".4f"),
                   Column("algbw_gbps", "algbw (GB/s)", ",.1f")]
        emit([row], columns, output_format)

    return command


_collective_command("allreduce", "all_reduce", "Time one all-reduce.")
_collective_command("allgather", "all_gather", "Time one all-gather (size: the gathered output).")
_collective_command("reducescatter", "reduce_scatter", "Time one reduce-scatter (size: the input).")
_collective_command("alltoall", "all_to_all", "Time one all-to-all.")
_collective_command("sendrecv", "send_recv", "Time one point-to-point send/recv (pipeline parallelism).")


@eval_group.command("comm")
@click.option("--no-unseen", is_flag=True, help="Skip leave-one-system-out (one fit per system).")
@click.option("--summary", is_flag=True, help="Only one row per system.")
@click.option("--by", type=click.Choice(_BREAKDOWNS), default="collective", show_default=True,
              help="Split each system's rows by collective, by group size or by message-size band.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the cross-validation folds and the forests.")
@output_format_options
def eval_comm(no_unseen: bool, summary: bool, by: str, seed: int, output_format: str) -> None:
    """MAPE of the communication model per system and collective: seen (five-fold cross-validation) and unseen
    (leave one system out), on each system's newest engine release."""
    from servesim.training.comm_eval import evaluate

    rows = evaluate(unseen=not no_unseen, seed=seed, by=by)
    if summary:
        rows = [r for r in rows if r[by] == "all"]
    columns = [Column("system", "system", align="<"), Column(by, by, align="<"),
               Column("rows", "rows"), Column("seen_mape_pct", "seen MAPE %", ".1f"),
               Column("unseen_mape_pct", "unseen MAPE %", ".1f")]
    emit(rows, columns, output_format, title="Communication model accuracy (mean absolute percentage error)",
         notes=["seen: five-fold cross-validation over the measured points (seeded folds), every point scored once;",
                "unseen: the system's rows left out of training (leave-one-system-out);",
                "rows: those of each system's newest engine release (older releases only train)."])


COMMANDS = [kernel_group, eval_group]
