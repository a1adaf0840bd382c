"""Fit the host-overhead constants of servesim/serving/overhead.py to measured serving runs; it prints them for that
file.

Replays aiconfigurator-core's silicon_sample.csv rows (aggregated vLLM/SGLang runs on H100 and H200) with the
per-step overhead terms at zero, fits ``step_us`` and ``per_seq_us`` per engine on the training rows
(servesim.validate.calibration.TRAIN_RULE) and prints the constants with the train and test MAPE they give.
Predictions under the fitted constants come from the exact linear sensitivities of the replay for an engine that
schedules synchronously, and from replays under candidate constants for one with async scheduling (see
servesim/validate/calibration.py).

    nice -n 10 .venv/bin/python tools/calibrate_overhead.py --estimator roofline
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
    args = parser.parse_args()

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


if __name__ == "__main__":
    main()
