"""Choose GPUs for a chat service: which GPU, layout and how many replicas serve 20 requests/s of multi-turn chat
within the latency targets, at the lowest cost.

    python examples/chat_service.py                      # the MLP estimator, 500 requests per load
    python examples/chat_service.py --estimator roofline -n 100    # a rougher answer in seconds
"""

import argparse

import servesim

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--estimator", default="mlp", help="kernel time estimator: mlp (default) or roofline")
parser.add_argument("-n", "--num-requests", type=int, default=500, help="requests simulated per load")
parser.add_argument("--jobs", type=int, default=None, help="parallel searches [default: the CPU count]")
args = parser.parse_args()

plan = servesim.plan(
    "qwen3-8b",
    ["H100", "A100", "L40S"],            # GPU names or aliases, as in `servesim gpus`
    tp=1, pp=1,                          # one GPU per replica; leave out to try every layout within a node
    workload="chat-shared-prefix",       # 4-turn conversations sharing 8 system prompts (docs/workloads.md)
    num_requests=args.num_requests,
    qps=20,                              # total load to serve: replicas = ceil(20 / capacity per replica)
    slos={"ttft_p90": 1000, "tpot_p90": 50},   # milliseconds
    estimator=args.estimator,
    jobs=args.jobs,
)

# Every option searched, cheapest first among those that meet the SLOs.
for option in plan.options:
    capacity = f"{option.capacity_qps:6.2f} req/s/replica" if option.capacity_qps else "no capacity within SLOs"
    cost = f"{option.replicas} × {option.usd_per_hour / option.replicas:.2f} $/h" if option.replicas else option.status
    print(f"{option.rank or '-'}  {option.label:<16} {capacity}  {cost}")

if plan.recommended is None:
    raise SystemExit(f"no option meets the SLOs: {plan.infeasible}")
print(f"\nRecommendation: {plan.explanation}")
print(f"Launch: {plan.recommended.result.task.deployment.launch_command()}")
