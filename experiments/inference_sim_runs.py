"""servesim against inference-sim's published vLLM measurements on H100, A100 and L40S.

    .venv/bin/python experiments/inference_sim_runs.py ERROR_RECORDS_CSV... [--gpu H100|A100-80GB|L40S]
        [--jobs N] [--rows]

inference-sim's comparison of serving simulators (github.com/inference-sim/sim-to-real-accuracy-validation)
publishes, per experiment and load stage, what vLLM 0.15.1 measured: the ``actual`` column of its
``results_iter24/error_records.csv`` (commit 8fb2a1b; ``git show 8fb2a1b:results_iter24/error_records.csv`` in a
clone), the mean TTFT and E2E of each stage of 38 experiments, and ``results_trainval/error_records.csv`` those
of 15 more on H100. That repository carries no licence, so servesim ships none of its numbers: give the files'
paths (an experiment in several files is replayed once). The runs' raw folders are not published; what is replayed:

- **Workloads**: inference-perf ``shared_prefix`` prompts, 10 groups × 10 prompts (the configs of inference-sim's
  published H100 runs of these profiles, github.com/inference-sim/training ``default_args/*/results/config.yaml``),
  system prompt, question and output lengths and load stages by the experiment's profile, as those configs and
  inference-sim's ``testdata/roofline_goldendataset.json`` (Apache-2.0) give them (:data:`PROFILES`). The A100
  and L40S experiments are ``general-lite``, whose stages (2.5 then 6 requests/s) that file gives for its H100
  experiments of that profile.
- **Server**: vLLM 0.15.1 (inference-sim's runs used its stock release), ``max_num_seqs`` 128 and the experiment's
  ``max_num_batched_tokens``, its precision (FP16 as BF16, FP8 as W8A8: :data:`PRECISIONS`); ``A100-80GB`` is
  taken as the SXM card. Not replayed: the memory
  fraction (0.95 in two experiments, servesim's default is vLLM's 0.9) and CPU KV offloading (nine H100
  experiments), which matter only once the KV cache is full.

Prints the errors per GPU and over every stage; ``--rows`` adds a row per stage. Errors are predicted / measured −
1; TPOT is ``(E2E − TTFT) / (output − 1)`` of the stage means, as ``servesim validate results`` compares it.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.cli.output import Column, render_table
from servesim.errors import ServesimError
from servesim.validate.inference_perf import ScaledExponential, SharedPrefixData, measured_stage
from servesim.validate.replay import replay
from servesim.validate.report import grouped_errors
from servesim.validate.results import Deployment, ServerFlags, run_case

#: Per profile: (system prompt, question, output) tokens and the load stages, (requests/s, seconds) each.
PROFILES = {
    "general": ((100, 447, 248), ((8.0, 600), (20.0, 600))),
    "general-lite": ((100, 447, 248), ((2.5, 600), (6.0, 600))),
    "codegen": ((100, 466, 247), ((5.0, 600), (10.0, 600))),
    "roleplay": ((150, 600, 251), ((6.0, 1200),)),
    "reasoning": ((100, 934, 1448), ((4.0, 1200),)),
    "reasoning-lite": ((100, 934, 1448), ((1.0, 1200),)),
}
GROUPS, PROMPTS_PER_GROUP = 10, 10
#: The columns of an error-records file this reads.
COLUMNS = ("experiment_folder", "stage_index", "metric_name", "actual", "model", "hardware", "tp", "precision",
           "max_num_batched_tokens")
GPUS = {"H100": "H100-SXM", "A100-80GB": "A100-SXM-80GB", "L40S": "L40S"}
#: The weights: FP16 runs as BF16 (the same kernels' times), FP8 as W8A8 (the FP8-dynamic checkpoint: per-channel
#: weights, per-token activations).
PRECISIONS = {"FP16": "bf16", "BF16": "bf16", "FP8": "fp8"}
RELEASE = "vllm==0.15.1"
MAX_NUM_SEQS = 128


def profile_of(experiment: str) -> str:
    """The workload profile an experiment folder's name gives (``36-qwen3-14b-tp1-general-lite-1``)."""
    names = [name for name in PROFILES if f"-{name}" in experiment]
    if not names:
        raise ServesimError(f"{experiment}: its name gives no known profile ({', '.join(PROFILES)})")
    return max(names, key=len)


def read_stages(path: Path) -> list[dict]:
    """One record per experiment and stage: its settings and measured mean TTFT and E2E (ms)."""
    measured: dict[tuple[str, int], dict] = defaultdict(dict)
    settings = {}
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = sorted(set(COLUMNS) - set(reader.fieldnames or ()))
        if missing:
            sys.exit(f"error: {path}: lacks the column(s) {', '.join(missing)}; give an error_records.csv of "
                     f"inference-sim/sim-to-real-accuracy-validation")
        for row in reader:
            stage = int(row["stage_index"])
            if stage < 0 or row["metric_name"] not in ("ttft_mean", "e2e_mean"):
                continue
            experiment = row["experiment_folder"].rstrip("/").rsplit("/", 1)[-1]
            measured[experiment, stage][row["metric_name"]] = float(row["actual"])
            settings[experiment] = row
    return [{"experiment": experiment, "stage": stage, **measured[experiment, stage], "row": settings[experiment]}
            for experiment, stage in sorted(measured)]


def stage_case(record: dict, seed: int):
    """The replay case of one experiment stage."""
    row = record["row"]
    profile = profile_of(record["experiment"])
    (system, question, output), stages = PROFILES[profile]
    rate, duration = stages[record["stage"]]
    data = SharedPrefixData(GROUPS, PROMPTS_PER_GROUP, system, question, output)
    deployment = Deployment(model=row["model"], gpu=GPUS[row["hardware"]], engine=RELEASE, tp=int(row["tp"]),
                            dtype=PRECISIONS[row["precision"]])
    server = ServerFlags(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=int(row["max_num_batched_tokens"]))
    run = measured_stage(f"{record['experiment']}#{record['stage']} @{rate:g}/s", data,
                         ScaledExponential(rate, duration), int(rate * duration), record["ttft_mean"],
                         record["e2e_mean"], system + question, np.random.default_rng(seed + record["stage"]),
                         deployment, server)
    return run_case(run, Deployment(), seed, server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("error_records", type=Path, nargs="+",
                        help="results_iter24/error_records.csv (or results_trainval/) of "
                             "inference-sim/sim-to-real-accuracy-validation")
    parser.add_argument("--gpu", choices=sorted(GPUS), help="only this GPU's experiments")
    parser.add_argument("--jobs", type=int, default=None, help="replay processes (default: the CPU count)")
    parser.add_argument("--rows", action="store_true", help="print a row per stage")
    args = parser.parse_args()
    for path in args.error_records:
        if not path.is_file():
            sys.exit(f"error: {path}: no such file; give results_iter24/error_records.csv of "
                     f"inference-sim/sim-to-real-accuracy-validation")
    stages = {(r["experiment"], r["stage"]): r for path in args.error_records for r in read_stages(path)}
    records = [r for r in stages.values() if args.gpu in (None, r["row"]["hardware"])]
    cases, refused = [], []
    for record in records:
        try:
            cases.append(stage_case(record, seed=0))
        except ServesimError as exc:  # a model without a preset, an unknown profile
            refused.append(str(exc))
    rows, skipped = replay(cases, "mlp", jobs=args.jobs)
    if not rows:
        sys.exit(f"error: none of the {len(records)} stages could be replayed: {refused[:1] or skipped[:1]}")
    frame = pd.DataFrame(rows)
    summary_columns = [Column("rows", "stages", "d")] + [
        Column(f"{metric}_{kind}_pct", f"{label} {'MAPE' if kind == 'mape' else 'bias'} %", "+.1f" if kind == "bias"
               else ".1f") for metric, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E"))
        for kind in ("mape", "bias")]
    by_gpu = grouped_errors(frame, ["gpu"]) + [{"gpu": "all", **grouped_errors(frame.assign(all=1), ["all"])[0]}]
    print(render_table(by_gpu, [Column("gpu", "GPU", align="<"), *summary_columns],
                       f"servesim ({RELEASE}) against inference-sim's measured stage means"))
    if args.rows:
        print()
        print(render_table(rows, [Column("case_id", "experiment stage", align="<"), Column("gpu", "GPU", align="<"),
                                  Column("measured_ttft_ms", "TTFT meas.", ".1f"),
                                  Column("ttft_error", "TTFT err", "+.1%"),
                                  Column("measured_tpot_ms", "TPOT meas.", ".2f"),
                                  Column("tpot_error", "TPOT err", "+.1%"),
                                  Column("measured_e2e_ms", "E2E meas.", ",.0f"),
                                  Column("e2e_error", "E2E err", "+.1%")], "per stage"))
    for reason in [*refused, *(f"{item.case_id}: {item.reason}" for item in skipped)]:
        print(f"not replayed: {reason}")


if __name__ == "__main__":
    main()
