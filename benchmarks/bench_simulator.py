"""Simulator speed, and the error of its step-time approximation (representative batches, docs/serving.md).

    .venv/bin/python benchmarks/bench_simulator.py [--requests 10000] [--engine vllm] [--model llama3.1-8b] [--gpu H100]
        [--tp 1] [--estimator roofline] [--rate REQ_PER_S] [--sample 0.02] [--mean-context]

Simulates splitwise-conv requests (the trace's own arrival rate, or ``--rate``) with a cold step-time model, then
again with the warm one (as a capacity search reuses it), and prints requests simulated per second. Then compares,
on a sample of the steps (every step taken through the scheduler), the representative-batch time with the exact
batch's time. ``--mean-context`` puts every decode of a representative batch at the mean context (the longest
one no longer apart), to measure what keeping it buys; its runs take the Python loop, whose step times it patches
(the compiled loop's are its own).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time

import numpy as np

from servesim.hardware import get_gpu
from servesim.models import get_model
from servesim.models.parallel import Parallelism
from servesim.serving import simulator, step_cache
from servesim.serving.deployment import build_deployment
from servesim.serving.engines import ENGINE_CHOICES
from servesim.serving.step_time import StepTimeModel
from servesim.workloads import build_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--engine", default="vllm", choices=ENGINE_CHOICES)
    # Llama-3.1-8B: Llama-3-8B's layers with a 128k context, which the trace's longest requests need.
    parser.add_argument("--model", default="llama3.1-8b")
    parser.add_argument("--gpu", default="H100")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--estimator", default="roofline")
    parser.add_argument("--rate", type=float, default=None, help="Requests/s (default: the trace's own).")
    parser.add_argument("--sample", type=float, default=0.02, help="Fraction of steps checked against exact times.")
    parser.add_argument("--mean-context", action="store_true", help="Representative decodes all at the mean context.")
    args = parser.parse_args()
    if args.mean_context:
        step_cache.decode_spread = lambda context, max_context: 0
    deployment = build_deployment(get_model(args.model), get_gpu(args.gpu), Parallelism(args.tp, 1), args.engine,
                                  estimator=args.estimator)
    workload = build_workload("splitwise-conv", args.requests, seed=0)
    if args.rate:
        workload = dataclasses.replace(workload, arrival_s=workload.arrival_s / workload.arrival_s[-1]
                                       * len(workload) / args.rate)
    step_model = StepTimeModel(deployment)
    for label in ("cold", "warm"):
        start = time.perf_counter()
        result = simulator.simulate(deployment, workload, step_model=step_model,
                                    fast_forward_decodes=not args.mean_context)
        elapsed = time.perf_counter() - start
        print(f"{label}: {len(workload):,} requests, {len(result.steps.start_s):,} steps, simulated "
              f"{result.duration_s:,.0f} s of serving in {elapsed:.2f} s -> {len(workload) / elapsed:,.0f} requests/s, "
              f"{len(result.steps.start_s) / elapsed:,.0f} steps/s; "
              f"{step_model.step_time_us.cache_info().currsize:,} batches, "
              f"{len(step_model.attention_by_batch):,} attention batches and "
              f"{step_model.rest_time_us.cache_info().currsize:,} token/request counts timed")

    sampled, finish = [], simulator.finish_step
    rng = random.Random(0)

    def recording(step, end_s):
        if rng.random() < args.sample:  # the exact batch, before the step advances its requests
            sampled.append((step.batch(), step_cache.step_time_us(step_model, step)))
        return finish(step, end_s)

    simulator.finish_step = recording
    simulator.simulate(deployment, workload, step_model=step_model, fast_forward_decodes=False)
    simulator.finish_step = finish
    for kind in ("decode-only", "with prefill"):
        errors = []
        for batch, (overhead_us, stages_us) in sampled:
            if (kind == "decode-only") == batch.is_decode_only:
                exact = step_model.step_time_us(batch).latency_us
                errors.append((overhead_us + sum(stages_us) - exact) / exact * 100)
        if not errors:
            continue
        errors = np.array(errors)
        print(f"{kind} steps: {len(errors)} sampled, step-time error mean {errors.mean():+.2f} %, "
              f"mean |error| {np.abs(errors).mean():.2f} %, max |error| {np.abs(errors).max():.2f} %")


if __name__ == "__main__":
    main()
