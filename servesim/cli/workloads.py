"""``servesim workload``: describe a workload (lengths and arrivals) and optionally write its requests to CSV."""

from __future__ import annotations

import click

from servesim.cli.output import Column, emit, output_format_options, to_csv
from servesim.cli.params import DIMENSION, REQUEST_COUNT, SEED, OutputFile
from servesim.errors import ServesimError
from servesim.workloads import (
    ARRIVALS,
    DEFAULT_REQUESTS,
    Workload,
    build_workload,
    describe_workload,
    parse_columns,
)

COLUMNS = (
    Column("workload", "workload", align="<"),
    Column("requests", "requests", ",d"),
    Column("arrival", "arrival", align="<"),
    Column("rate_per_s", "req/s", ".2f"),
    Column("gap_cv", "gap CV", ".2f"),
    Column("tokens", "tokens", align="<"),
    Column("mean", "mean", ",.1f"),
    Column("p50", "p50", ",.0f"),
    Column("p90", "p90", ",.0f"),
    Column("p99", "p99", ",.0f"),
    Column("max", "max", ",.0f"),
)

REQUEST_KEYS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens")


def describe_rows(description: dict) -> list[dict]:
    """Two table rows (prompt, output tokens) from a :func:`describe_workload` result."""
    arrival = description["arrival"]
    if description["arrival_mode"] == "closed":
        closed = f"closed x{description['concurrency']}"
        arrival = closed if arrival == "burst" else f"{closed}, {arrival}"
    common = {key: description[key] for key in ("workload", "requests", "rate_per_s", "gap_cv")}
    return [{**common, "arrival": arrival, "tokens": kind, **description[f"{kind}_tokens"]}
            for kind in ("prompt", "output")]


def requests_csv(workload: Workload) -> str:
    """The workload's requests as CSV (``request_id, arrival_s, prompt_tokens, output_tokens``), which
    ``servesim workload`` reads back as a trace."""
    rows = [
        dict(zip(REQUEST_KEYS, values))
        for values in zip(range(len(workload)), workload.arrival_s.round(6).tolist(),
                          workload.prompt_tokens.tolist(), workload.output_tokens.tolist())
    ]
    return to_csv(rows, REQUEST_KEYS)


@click.command("workload")
@click.argument("sources", nargs=-1, required=True, metavar="PROFILE|SPEC|TRACE...")
@click.option("-n", "--requests", "num_requests", type=REQUEST_COUNT, default=None,
              help=f"Requests to generate [default: {DEFAULT_REQUESTS}; a trace: all its rows].")
@click.option("--qps", type=float, default=None, help="Arrival rate in requests per second.")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="Closed loop: N clients, each sending its next request when its last one finishes.")
@click.option("--arrival", type=click.Choice(ARRIVALS), default=None,
              help="Arrival process [default: poisson with --qps, burst with --concurrency alone, else the "
                   "source's own timing].")
@click.option("--cv", type=float, default=1.0, show_default=True,
              help="Gap coefficient of variation for gamma arrivals (>1 burstier than Poisson).")
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="Multiply a trace's own arrival times (0.5 replays twice as fast).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Random seed; the same seed, the same requests.")
@click.option("--max-prompt-tokens", type=DIMENSION, default=None, help="Truncate longer prompts.")
@click.option("--max-output-tokens", type=DIMENSION, default=None, help="Truncate longer outputs.")
@click.option("--columns", default=None, metavar="prompt=COL,output=COL[,arrival=COL]",
              help="Column names of a CSV/JSONL trace in a format servesim does not recognise.")
@click.option("--out", type=OutputFile(), default=None,
              help="Write the generated requests to this CSV (one source only).")
@output_format_options
def workload(sources, num_requests, qps, concurrency, arrival, cv, time_scale, seed, max_prompt_tokens,
             max_output_tokens, columns, out, output_format) -> None:
    """Describe workloads: request count, prompt/output token mean and percentiles, arrival rate and burstiness.

    A source is a built-in profile (arxiv, splitwise-conv, splitwise-code), a length spec (fixed:1024:128,
    uniform:512-2048:64-256, lognormal:2048,0.5:256,1.0, zipf:16-8192,1.1:16-1024) or a CSV/JSONL trace (Vidur,
    Azure LLM inference trace, servesim --out files, or any file with --columns).

    \b
    servesim workload splitwise-conv splitwise-code
    servesim workload arxiv --qps 4 --out arxiv.csv
    servesim workload fixed:1024:128 --concurrency 64 --requests 500
    """
    if out is not None and len(sources) != 1:
        raise ServesimError("--out writes one workload's requests; give a single source")
    mapping = parse_columns(columns) if columns else None
    workloads = [
        build_workload(
            source,
            num_requests,
            qps=qps, concurrency=concurrency, seed=seed, arrival=arrival, cv=cv, time_scale=time_scale,
            max_prompt_tokens=max_prompt_tokens, max_output_tokens=max_output_tokens, columns=mapping,
        )
        for source in sources
    ]
    descriptions = [describe_workload(w) for w in workloads]
    rows = [row for description in descriptions for row in describe_rows(description)]
    notes = [f"seed {seed}; token counts per request; req/s and gap CV (1 = Poisson) of the generated arrivals"]
    if out is not None:
        out.write_text(requests_csv(workloads[0]), encoding="utf-8")
        notes.append(f"wrote {len(workloads[0])} requests to {out}")
    emit(rows, COLUMNS, output_format, notes=notes, json_payload=descriptions)


COMMANDS = [workload]
