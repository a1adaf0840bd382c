"""Fit the host-overhead constants of servesim/serving/overhead.py to measured serving runs; it prints them for that
file.

Replays aiconfigurator-core's silicon_sample.csv rows (aggregated vLLM/SGLang runs on H100 and H200) with the
per-step overhead terms at zero, fits ``step_us`` and ``per_seq_us`` per engine on the training rows
(servesim.validate.calibration.TRAIN_RULE) and prints the constants with the train and test MAPE they give.
Predictions under the fitted constants come from the exact linear sensitivities of the replay for an engine that
schedules synchronously, and from replays under candidate constants for one with async scheduling (see
servesim/validate/calibration.py).

    nice -n 10 .venv/bin/python tools/calibrate_overhead.py --estimator roofline

With ``--release`` it chooses one term of one release alone (``--term``, the device-side step term by default),
among the values ``--grid`` lists, on runs measured with that release under a known protocol: the inference-perf
report folders given with ``--results`` and the training GPU's silicon rows replayed as that release
(``--exclude-model`` leaves out models whose kernel times are known to be off):

    .venv/bin/python tools/calibrate_overhead.py --estimator mlp --release vllm==0.15.1 --results runs/*/results \
        --gpu H100-SXM --exclude-model openai/gpt-oss-120b
    .venv/bin/python tools/calibrate_overhead.py --estimator mlp --release vllm==0.15.1 --gpu H100-SXM \
        --term per_prompt_token_us --grid 0,3,6,9
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from servesim.validate.calibration import TRAIN_RULE, calibrate_cases, is_training_row
from servesim.validate.report import GROUP_KEYS, bias_by_concurrency, grouped_errors, scatter_plot
from servesim.validate.silicon import load_silicon_rows, silicon_cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--estimator", default="roofline", help="kernel estimator (default: roofline)")
    parser.add_argument("--rows-csv", type=Path, default=None, help="write the calibration rows and predictions")
    parser.add_argument("--plot", type=Path, default=None, help="write the predicted-vs-measured scatter (PNG)")
    parser.add_argument("--release", default=None, help="choose one term of this release alone (vllm==0.15.1)")
    parser.add_argument("--results", type=Path, nargs="*", default=[], help="inference-perf report folders")
    parser.add_argument("--gpu", default=None, help="GPU the --results runs were measured on")
    parser.add_argument("--exclude-model", action="append", default=[], help="silicon model id to leave out")
    parser.add_argument("--term", choices=RELEASE_TERMS, default="device_step_us",
                        help="the term --release chooses (default: device_step_us)")
    parser.add_argument("--grid", type=lambda text: [float(v) for v in text.split(",")],
                        default=[0.0, 150.0, 300.0, 470.2], help="candidate values of --term, comma-separated")
    args = parser.parse_args()
    if args.release is not None:
        fit_release(args)
        return

    start = time.perf_counter()
    cases, skipped = silicon_cases(load_silicon_rows())
    done = 0

    def tick(_case) -> None:
        nonlocal done
        done += 1
        if sys.stderr.isatty():
            print(f"\rreplayed {done}/{len(cases)}", end="", file=sys.stderr)

    result, refused = calibrate_cases(cases, args.estimator, lambda case: is_training_row({"gpu": case.gpu}),
                                      TRAIN_RULE, on_case=tick)
    frame = result.frame
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print(f"estimator {args.estimator}; {len(frame)} rows replayed, {len(skipped) + len(refused)} skipped; "
          f"{TRAIN_RULE}; {time.perf_counter() - start:.0f} s")
    for engine, overhead in result.overheads.items():
        print(f"{engine}: step_us={overhead.step_us:.1f} per_seq_us={overhead.per_seq_us:.3f} "
              f"device_step_us={overhead.device_step_us:.1f} device_per_seq_us={overhead.device_per_seq_us:.3f}")
    for keys in (["engine", "split"], [*GROUP_KEYS, "split"]):
        print(pd.DataFrame(grouped_errors(result.frame, keys)).round(1).to_string(index=False))
    print(pd.DataFrame(bias_by_concurrency(result.frame, ["split"])).round(1).to_string(index=False))
    if args.plot is not None:
        scatter_plot(result.frame, args.plot, f"servesim vs silicon_sample.csv ({args.estimator} estimator, "
                                              f"fitted host overhead; hollow: test rows)")
    if args.rows_csv is not None:
        result.frame.to_csv(args.rows_csv, index=False, float_format="%.5g")


#: The terms ``--release`` chooses: GPU time a step spends outside its kernels, the API server's time per prompt
#: token (servesim/serving/overhead.py; InferenceX's runs carry their own, servesim/validate/silicon.py) and the CPU
#: cost of an eager launch in a model with MoE layers.
RELEASE_TERMS = ("device_step_us", "per_prompt_token_us", "moe_eager_launch_us")


def fit_release(args: argparse.Namespace) -> None:
    """Choose one term of one release on its runs of known protocol: replay them under each candidate of
    ``--grid`` (``device_per_seq_us`` at zero beside a ``device_step_us``) and keep the one of least TTFT plus TPOT
    MAPE."""
    from dataclasses import replace

    from servesim.serving.engines import parse_engine
    from servesim.validate.calibration import replay_errors, replay_loss
    from servesim.validate.replay import StepModels, case_release
    from servesim.validate.results import Deployment, result_cases

    start = time.perf_counter()
    _, release = parse_engine(args.release)
    cases, _ = result_cases(args.results, Deployment(gpu=args.gpu, engine=release.label))
    silicon, _ = silicon_cases(load_silicon_rows())
    cases += [case for case in silicon if is_training_row({"gpu": case.gpu}) and case.engine == release.engine
              and case_release(case) == release.label and case.model_id not in args.exclude_model]
    if args.term == "per_prompt_token_us":  # the candidates replace the runs' own API-server cost
        cases = [replace(case, per_prompt_token_us=None) for case in cases]
    base = StepModels(args.estimator, {release.engine: release.overhead})
    losses = {}
    # A device step term is chosen with no per-request device term beside it.
    fixed = {"device_per_seq_us": 0.0} if args.term == "device_step_us" else {}
    for value in args.grid:
        candidate = replace(release.overhead, **fixed, **{args.term: value})
        # A launch cost changes the layer times themselves, which candidates of it cannot share.
        shares_with = None if args.term == "moe_eager_launch_us" else base
        frame = replay_errors(cases, StepModels(args.estimator, {release.engine: candidate}, shares_with=shares_with))
        losses[value] = replay_loss(frame)
        print(f"{args.term}={value:g}: {len(frame)} runs, TTFT + TPOT MAPE {100 * losses[value]:.1f} %, "
              f"{time.perf_counter() - start:.0f} s")
        print(pd.DataFrame(grouped_errors(frame, ["model_id"])).round(1).to_string(index=False), flush=True)
    best = min(losses, key=losses.get)
    shipped = (release.overhead.launch_us(moe=True) if args.term == "moe_eager_launch_us"
               else getattr(release.overhead, args.term))
    print(f"{release.label}: {args.term}={best:g} (TTFT + TPOT MAPE {100 * losses[best]:.1f} %; the release has "
          f"{shipped:g})")


if __name__ == "__main__":
    main()
