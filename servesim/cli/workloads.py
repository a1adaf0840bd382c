"""``servesim workload``: describe a workload (lengths, arrivals and prompt sharing) and optionally write its
requests to CSV."""

from __future__ import annotations

import math

import click

from servesim.cli.output import Column, emit, output_format_options, to_csv
from servesim.cli.params import DIMENSION, REQUEST_COUNT, SEED, OutputFile
from servesim.errors import ServesimError
from servesim.workloads import (
    ARRIVALS,
    NoArrivalTimes,
    DEFAULT_REQUESTS,
    HASH_BLOCK_TOKENS,
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
#: the columns ``--out`` adds when the prompts say which share text (see :func:`requests_csv`)
SEGMENT_KEYS = ("segment_ids", "segment_tokens", "output_id")


def describe_rows(description: dict) -> list[dict]:
    """Two table rows (prompt, output tokens) from a :func:`describe_workload` result."""
    arrival = description["arrival"]
    if description["arrival_mode"] == "closed":
        closed = f"closed x{description['concurrency']}"
        arrival = closed if arrival == "burst" else f"{closed}, {arrival}"
    common = {key: description[key] for key in ("workload", "requests", "rate_per_s", "gap_cv")}
    return [{**common, "arrival": arrival, "tokens": kind, **description[f"{kind}_tokens"]}
            for kind in ("prompt", "output")]


def sharing_note(description: dict) -> str | None:
    """One line on a workload's prompt sharing, from a :func:`describe_workload` result (None without it)."""
    sharing = description["prefix_sharing"]
    if sharing is None:
        return None
    return (f"{description['workload']}: {sharing['distinct_prompts']:,} distinct prompts, "
            f"{sharing['requests_reusing']:.1%} of requests start with text an earlier one sent "
            f"({sharing['distinct_prefixes']:,} distinct reused prefixes); an unbounded prefix cache of "
            f"{sharing['cache_block_tokens']}-token blocks serves at most {sharing['cache_hit_upper_bound']:.1%} "
            f"of prompt tokens")


def _joined(values: list[int]) -> str:
    return " ".join(map(str, values))


def requests_csv(workload: Workload) -> str:
    """The workload's requests as CSV (``request_id, arrival_s, prompt_tokens, output_tokens``), which
    ``servesim workload`` reads back as a trace. When the prompts say which share text, three more columns give
    each request's segments exactly: ``segment_ids`` and ``segment_tokens`` (space-separated, one entry per
    segment) and ``output_id``."""
    columns = [range(len(workload)), workload.arrival_s.round(6).tolist(), workload.prompt_tokens.tolist(),
               workload.output_tokens.tolist()]
    keys = REQUEST_KEYS
    prefixes = workload.prefixes
    if prefixes is not None:
        bounds = prefixes.offsets.tolist()
        ids, tokens = prefixes.segment_ids.tolist(), prefixes.segment_tokens.tolist()
        columns += [[_joined(ids[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])],
                    [_joined(tokens[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])],
                    prefixes.output_ids.tolist()]
        keys = REQUEST_KEYS + SEGMENT_KEYS
    rows = [dict(zip(keys, values)) for values in zip(*columns)]
    return to_csv(rows, keys)


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
              help="Column names of a CSV/JSONL trace in a format servesim does not recognise (also prompt_id=COL "
                   "or hash_ids=COL for which prompts share text).")
@click.option("--hash-block-tokens", type=click.IntRange(min=1), default=HASH_BLOCK_TOKENS, show_default=True,
              help="Prompt tokens per entry of a trace's hash_ids (Mooncake's traces use 512).")
@click.option("--out", type=OutputFile(), default=None,
              help="Write the generated requests to this CSV (one source only).")
@output_format_options
def workload(sources, num_requests, qps, concurrency, arrival, cv, time_scale, seed, max_prompt_tokens,
             max_output_tokens, columns, hash_block_tokens, out, output_format) -> None:
    """Describe workloads: request count, prompt/output token mean and percentiles, arrival rate and burstiness,
    and when prompts share text, how much a prefix cache could serve at most.

    A source is a built-in profile (arxiv, splitwise-conv, splitwise-code) or preset (chat-shared-prefix), a length
    spec (fixed:1024:128, uniform:512-2048:64-256, lognormal:2048,0.5:256,1.0, zipf:16-8192,1.1:16-1024), a
    shared-prompt spec (shared-prefix:8,16:2048:128:256, repeat:100:1024:128, multi-turn:32,5:256:256) or a
    CSV/JSONL trace (Vidur, Azure LLM inference trace, Mooncake, servesim --out files, or any file with --columns).

    \b
    servesim workload splitwise-conv splitwise-code
    servesim workload arxiv --qps 4 --out arxiv.csv
    servesim workload fixed:1024:128 --concurrency 64 --requests 500
    servesim workload chat-shared-prefix shared-prefix:8,16:2048:128:256 --qps 8
    """
    if out is not None and len(sources) != 1:
        raise ServesimError("--out writes one workload's requests; give a single source")
    mapping = parse_columns(columns) if columns else None

    def build(source: str, arrival: str | None) -> Workload:
        return build_workload(
            source,
            num_requests,
            qps=qps, concurrency=concurrency, seed=seed, arrival=arrival, cv=cv, time_scale=time_scale,
            max_prompt_tokens=max_prompt_tokens, max_output_tokens=max_output_tokens, columns=mapping,
            hash_block_tokens=hash_block_tokens,
        )

    workloads, descriptions, untimed = [], [], []
    for source in sources:
        try:
            built = build(source, arrival)
            description = describe_workload(built)
        except NoArrivalTimes:
            if len(sources) == 1:
                raise
            # Described by its lengths alone: the others' own timing is what was asked for, and this source has none.
            built = build(source, "burst")
            description = {**describe_workload(built), "arrival_mode": None, "arrival": "none",
                           "rate_per_s": math.nan, "gap_cv": math.nan, "duration_s": math.nan}
            untimed.append(built.name)
        workloads.append(built)
        descriptions.append(description)
    rows = [row for description in descriptions for row in describe_rows(description)]
    notes = [f"seed {seed}; token counts per request; req/s and gap CV (1 = Poisson) of the generated arrivals"]
    notes += [f"{name}: no arrival times of its own, so lengths only; give --qps, --concurrency or --arrival burst "
              f"to describe arrivals for every source" for name in untimed]
    notes += filter(None, map(sharing_note, descriptions))
    if out is not None:
        out.write_text(requests_csv(workloads[0]), encoding="utf-8")
        notes.append(f"wrote {len(workloads[0])} requests to {out}")
    emit(rows, COLUMNS, output_format, notes=notes, json_payload=descriptions)


COMMANDS = [workload]
