"""Plan from your own trace: replay the arrivals and lengths of support_trace.csv (arrival_s, prompt_tokens,
output_tokens and prompt_id: rows with one id send the same prompt, which a prefix cache serves again) at a
target of 8 requests/s, and print the JSON document `servesim plan --json` would print.

    python examples/plan_from_trace.py                   # the MLP estimator
    python examples/plan_from_trace.py --estimator roofline
"""

import argparse
import json
from pathlib import Path

import servesim

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--estimator", default="mlp", help="kernel time estimator: mlp (default) or roofline")
parser.add_argument("--jobs", type=int, default=None, help="parallel searches [default: the CPU count]")
parser.add_argument("--out", type=Path, default=None, help="also write the whole plan as JSON here")
args = parser.parse_args()

trace = Path(__file__).with_name("support_trace.csv")   # made by examples/make_trace.py
plan = servesim.plan(
    "llama3-8b",
    "H100,L40S",
    tp=1, pp=1,
    workload=str(trace),   # a CSV or JSONL trace; every row is one request
    arrival="trace",       # keep the trace's own gaps, rescaled to each load searched (default: poisson)
    qps=8,
    slos={"ttft_p90": 1500, "tpot_p99": 80},
    estimator=args.estimator,
    jobs=args.jobs,
)

payload = servesim.plan_payload(plan)   # the dict of `servesim plan --json` (keys in docs/planner.md)
workload = payload["workload"]
print(f"trace {workload['name']}: {workload['requests']} requests, mean {workload['mean_prompt_tokens']:.0f} prompt "
      f"+ {workload['mean_output_tokens']:.0f} output tokens")
for option in payload["options"]:
    print(json.dumps({key: option[key] for key in ("rank", "gpu", "layout", "status", "capacity_qps", "replicas",
                                                   "usd_per_hour", "usd_per_million_output_tokens")}))
recommendation = payload["recommendation"]
if recommendation is None:
    raise SystemExit(f"no option meets the SLOs: {payload['infeasible']}")
print(f"recommendation: {recommendation['gpu']} {recommendation['layout']}")
print(f"launch_command: {recommendation['launch_command']}")
if args.out:
    args.out.write_text(json.dumps(payload, indent=2))
    print(f"wrote {args.out}")
