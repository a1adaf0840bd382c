"""The Python API in a few lines: build a deployment, simulate a chat workload on it, read the latency
percentiles and the prefix-cache hit ratio, and compare with prefix caching turned off.

    python examples/prefix_caching.py
    python examples/prefix_caching.py --estimator roofline -n 200
"""

import argparse

import servesim

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--estimator", default="mlp", help="kernel time estimator: mlp (default) or roofline")
parser.add_argument("-n", "--num-requests", type=int, default=1000, help="requests to simulate")
args = parser.parse_args()

# One vLLM instance of Qwen3 8B on one H100. servesim.deployment takes names; servesim.build_deployment takes
# the ModelConfig, GpuSpec and Parallelism objects. Engine settings are keyword arguments.
cached = servesim.deployment("qwen3-8b", "H100", tp=1, engine="vllm", estimator=args.estimator)
uncached = servesim.deployment("qwen3-8b", "H100", tp=1, engine="vllm", estimator=args.estimator,
                               enable_prefix_caching=False)
print(cached.label())
print(f"KV cache: {cached.memory.kv_tokens:,} tokens")
print(f"launch: {cached.launch_command()}\n")

print(f"{'prefix cache':<13} {'TTFT p50':>9} {'TTFT p90':>9} {'TPOT p50':>9} {'TPOT p90':>9} {'hit ratio':>10}")
for name, deployment in (("on", cached), ("off", uncached)):
    # The same seeded requests for both: multi-turn chat sharing system prompts, 8 requests/s.
    result = servesim.simulate(deployment, workload="chat-shared-prefix", qps=8, num_requests=args.num_requests)
    s = result.summary()   # also throughputs, E2E, ITL, queueing, KV occupancy (result.requests: per request)
    hit = s["prefix_cache_hit_ratio"] or 0.0   # share of prompt tokens served from the cache
    print(f"{name:<13} {s['ttft_p50_ms']:7.1f}ms {s['ttft_p90_ms']:7.1f}ms {s['tpot_p50_ms']:7.2f}ms "
          f"{s['tpot_p90_ms']:7.2f}ms {hit:10.1%}")
