"""Step times: the split into attention and the rest is exact, and the simulator's representative batches stay
close to the exact batch (and equal it on the grid)."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from servesim.errors import ServesimError
from servesim.estimator import get_estimator
from servesim.hardware import get_gpu
from servesim.kernels.batch import BatchSpec, PrefillChunk
from servesim.kernels.types import AttentionDecode, AttentionPrefill, Collective, Kernel
from servesim.models import get_model
from servesim.models.parallel import Parallelism, stage_layers
from servesim.serving import step_cache
from servesim.serving.deployment import build_deployment
from servesim.serving.state import Step
from servesim.serving.step_time import StepTimeModel

GPU = get_gpu("H100")

BATCHES = {
    "decode in a full graph": BatchSpec(decodes=(100, 900, 3000)),
    "decode past the graphs": BatchSpec(decodes=(1000,) * 600),
    "piecewise mixed": BatchSpec((PrefillChunk(300, 0),), (500,) * 7),
    "eager mixed with a cached prefix": BatchSpec((PrefillChunk(300, 1200), PrefillChunk(2000, 0)), (900,) * 40),
    "prefill only": BatchSpec((PrefillChunk(4000, 100),)),
}


def _attention_parts(model: StepTimeModel, batch: BatchSpec, stage: int) -> tuple[float, int]:
    """A stage's attention kernel time in ``batch`` and its number of attention launches, from the expanded
    kernels of ``batch``."""
    step = model.expand_stage(batch, stage)
    parts = [(float(model.estimator.predict_us([op], model.gpu)[0]) * repeats, repeats)
             for op, repeats in step.op_counts if isinstance(op, (AttentionDecode, AttentionPrefill))]
    return sum(us for us, _ in parts), sum(n for _, n in parts)


def _launch_bound(model: StepTimeModel, kernel_us: float, launches: int, graph_mode: str) -> float:
    """Eager kernels last their time or the CPU's time to launch them, whichever is longer: a step without graphs
    launches at the model's cost, attention between a piecewise graph's pieces at the plain one."""
    if graph_mode == "full":
        return kernel_us
    return max(kernel_us, launches * (model.piecewise_launch_us if graph_mode == "piecewise" else model.launch_us))


def kernel_by_kernel_us(model: StepTimeModel, batch: BatchSpec) -> tuple[tuple[float, ...], float]:
    """Each stage's time and the host overhead, from every kernel and collective of the expanded step: eager
    kernels (and collectives) lasting at least their launches, attention eager outside full graphs, a graph launch
    per stage and per eager attention call in a piecewise graph, and each stage's share of the device time the
    kernels leave out. A step of decodes and prompt chunks times its attention as the smaller of its launched
    kernels and the decodes' and the chunks' kernels apart."""
    stages, launches = [], 0
    mixed = bool(batch.prefills and batch.decodes)
    for stage in range(model.par.pp):
        step = model.expand_stage(batch, stage)
        attention_us = _launch_bound(model, *_attention_parts(model, batch, stage), step.graph_mode)
        if mixed:
            apart = [_attention_parts(model, part, stage)
                     for part in (BatchSpec(decodes=batch.decodes), BatchSpec(prefills=batch.prefills))]
            attention_us = min(attention_us, _launch_bound(model, sum(us for us, _ in apart),
                                                           sum(n for _, n in apart), step.graph_mode))
        # Outside attention: a step with prompt chunks times the ops on its sampled rows (one per request) apart
        # from the others, each part lasting at least its launches when eager.
        sampled = set(model._step_part("sampled_rows", batch)) if batch.prefills else set()
        parts = {False: [0.0, 0], True: [0.0, 0]}  # on the sampled rows or not -> [time, launches]
        for op, repeats in step.op_counts:
            part = parts[op in sampled]
            if isinstance(op, Collective):
                part[0] += model.collective_time_us(op, step.graph_mode != "none") * repeats
                part[1] += repeats
                continue
            assert isinstance(op, Kernel)
            if isinstance(op, (AttentionDecode, AttentionPrefill)):
                launches += repeats if step.graph_mode == "piecewise" else 0
                continue
            part[0] += float(model.estimator.predict_us([op], model.gpu)[0]) * repeats
            part[1] += repeats
        total = attention_us + sum(_launch_bound(model, us, n, "none" if step.graph_mode == "none" else "full")
                                   for us, n in parts.values())
        launches += step.graph_mode != "none"
        layers = len(stage_layers(model.model.num_layers, model.par.pp, stage))
        stages.append(total + model.overhead.device_overhead_us(batch.num_requests) * layers / model.model.num_layers)
    return tuple(stages), model.overhead.step_overhead_us(batch.num_requests, launches)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("model_name, par", [("llama3-8b", Parallelism(1, 1)), ("llama3-70b", Parallelism(4, 2)),
                                             ("qwen3-30b-a3b", Parallelism(2, 1))])
@pytest.mark.parametrize("launch_us", [None, 200.0])  # the release's launch cost; one that binds every eager step
def test_attention_and_the_rest_add_up_to_every_kernel(engine, model_name, par, launch_us):
    deployment = build_deployment(get_model(model_name), GPU, par, engine)
    overhead = deployment.release.overhead
    model = StepTimeModel(deployment, get_estimator("mlp"),
                          overhead if launch_us is None else replace(overhead, eager_launch_us=launch_us,
                                                                     moe_eager_launch_us=None))
    for name, batch in BATCHES.items():
        stages_us, overhead_us = kernel_by_kernel_us(model, batch)
        step = model.step_time_us(batch)
        # The MLP predicts a batch of kernels at once, so the last bits differ from one kernel at a time.
        assert step.stage_us == pytest.approx(stages_us, rel=1e-6), name
        assert step.overhead_us == pytest.approx(overhead_us, rel=1e-12), name


def test_an_eager_step_lasts_at_least_its_launches():
    """The CPU launches an eager step's kernels one after another: the step lasts at least that long, and no
    longer than it once the launches are cheap enough to hide behind the kernels."""
    deployment = build_deployment(get_model("llama3-8b"), GPU, Parallelism(1, 1), "sglang")
    batch = BatchSpec((PrefillChunk(64, 0),))
    launches = sum(n for _, n in StepTimeModel(deployment).expand_stage(batch, 0).op_counts)
    times_us = {launch_us: StepTimeModel(deployment, get_estimator("mlp"),
                                         replace(deployment.release.overhead, eager_launch_us=launch_us,
                                                 device_step_us=0.0, device_per_seq_us=0.0)
                                         ).step_time_us(batch).stage_us[0]
                for launch_us in (0.0, 1000.0)}
    assert times_us[1000.0] == pytest.approx(launches * 1000.0, rel=1e-9)
    assert 0 < times_us[0.0] < launches * 1000.0


def test_a_moe_model_pays_the_engines_moe_launch_cost():
    """Where an engine's MoE layers launch more around each modelled kernel (SGLang), a MoE model's eager launch
    costs that; a dense model's, and any model's where no MoE cost is given, the plain one."""
    dense = build_deployment(get_model("llama3-8b"), GPU, Parallelism(1, 1), "sglang")
    moe = build_deployment(get_model("qwen3-30b-a3b"), GPU, Parallelism(1, 1), "sglang")
    overhead = dense.release.overhead
    assert overhead.moe_eager_launch_us is not None and overhead.moe_eager_launch_us != overhead.eager_launch_us
    assert StepTimeModel(dense).launch_us == overhead.eager_launch_us
    assert StepTimeModel(moe).launch_us == overhead.moe_eager_launch_us
    plain = replace(overhead, moe_eager_launch_us=None)
    assert StepTimeModel(moe, overhead=plain).launch_us == overhead.eager_launch_us


def test_vllm_0_15_1_charges_moe_models_more_per_eager_launch():
    """vLLM 0.15.1's eager MoE steps run each MoE layer's Python around its kernels: a MoE model's launches cost
    more than a dense one's there, and as much as a dense one's in the releases not fitted for it."""
    dense, moe = get_model("llama3-8b"), get_model("qwen3-30b-a3b")
    launch_us = {(m.name, e): StepTimeModel(build_deployment(m, GPU, Parallelism(1, 1), e)).launch_us
                 for m in (dense, moe) for e in ("vllm==0.15.1", "vllm==0.12.0")}
    assert launch_us[(moe.name, "vllm==0.15.1")] > launch_us[(dense.name, "vllm==0.15.1")]
    assert launch_us[(moe.name, "vllm==0.12.0")] == launch_us[(dense.name, "vllm==0.12.0")]


def mixed_step(chunks: list[tuple[int, int]], contexts: list[int]) -> tuple[Step, BatchSpec]:
    prefills = tuple(PrefillChunk(new, cached) for new, cached in chunks)
    step = Step(requests=(), new_tokens=(), num_decodes=len(contexts), decode_context_tokens=sum(contexts),
                decode_max_context=max(contexts, default=0), prefills=prefills)
    return step, BatchSpec(prefills, tuple(contexts))


@pytest.fixture(scope="module")
def llama8b_models():
    return {engine: StepTimeModel(build_deployment(get_model("llama3-8b"), GPU, Parallelism(1, 1), engine),
                                  get_estimator("roofline"))
            for engine in ("vllm", "sglang")}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("chunks, decodes", [
    ([(1024, 0)], 0),  # 1,024 tokens, one request
    ([(30, 1024), (30, 1024)], 4),  # equal chunks: 64 tokens, 6 requests
])
def test_representative_step_is_exact_on_the_grid(llama8b_models, engine, chunks, decodes):
    model = llama8b_models[engine]
    step, batch = mixed_step(chunks, [1024] * decodes)
    overhead_us, stages_us = step_cache.step_time_us(model, step)
    exact = model.step_time_us(batch)
    assert stages_us == pytest.approx(exact.stage_us, rel=1e-12)
    assert overhead_us == pytest.approx(exact.overhead_us, rel=1e-12)


def test_unequal_chunks_stand_in_as_equal_ones_with_the_same_attention_work():
    chunks = (PrefillChunk(2000, 0), PrefillChunk(100, 3000))
    new, cached = step_cache.equal_chunks(chunks)

    def work(new_tokens, cached_tokens):
        return new_tokens * cached_tokens + new_tokens ** 2 / 2

    assert 2 * work(new, cached) == pytest.approx(sum(work(c.new_tokens, c.cached_tokens) for c in chunks))
    assert step_cache.equal_chunks(chunks[:1]) == (2000, 0)


def test_rest_is_not_interpolated_across_the_end_of_cuda_graphs(llama8b_models):
    model = llama8b_models["vllm"]  # graphs up to 512 tokens; the grid around 520 is 512 and 640
    assert step_cache.rest_token_bounds(model, 520, "none") == (513, 640)
    assert step_cache.rest_token_bounds(model, 504, "piecewise") == (456, 512)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_representative_steps_stay_close_to_the_exact_batch(llama8b_models, engine):
    model = llama8b_models[engine]
    rng = random.Random(0)
    errors = []
    for _ in range(60):
        chunks = [(rng.randint(1, 3000), rng.choice([0, rng.randint(1, 6000)])) for _ in range(rng.randint(1, 2))]
        decodes = rng.choice([0, 1, rng.randint(2, 300)])
        step, batch = mixed_step(chunks, [rng.randint(1, 8000)] * decodes)
        overhead_us, stages_us = step_cache.step_time_us(model, step)
        exact = model.step_time_us(batch)
        errors.append(sum(stages_us) / sum(exact.stage_us) - 1)
        assert overhead_us == pytest.approx(exact.overhead_us, rel=1e-9)
    # Contexts and cached prefixes are rounded to the grid, not interpolated: up to 1/16 of a context off.
    errors = np.abs(errors)
    assert errors.max() < 0.08
    assert errors.mean() < 0.01


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_decode_steps_with_one_long_context_keep_its_cost(engine):
    # Requests at every stage of their output, one far longer than the rest: the longest one's CTAs outlast the
    # grid's, which the mlp estimator sees and the mean context alone would hide.
    model = StepTimeModel(build_deployment(get_model("llama3-70b"), GPU, Parallelism(4, 1), engine),
                          get_estimator("mlp"))
    rng = random.Random(1)
    errors = []
    for _ in range(20):
        contexts = [rng.randint(200, 1500) for _ in range(rng.randint(16, 160))] + [rng.randint(3000, 6000)]
        step, batch = mixed_step([], contexts)
        overhead_us, stages_us = step_cache.step_time_us(model, step)
        errors.append(sum(stages_us) / sum(model.step_time_us(batch).stage_us) - 1)
    assert abs(np.mean(errors)) < 0.01
    assert np.max(np.abs(errors)) < 0.05


def test_models_of_one_tp_share_layer_times_across_pipeline_depths():
    # A capacity search times several layouts of one TP in one process: the second model reuses the first's
    # attention and kernel times, and gives exactly the step times it would give alone (a kernel's prediction does
    # not depend on the kernels predicted with it).
    estimator = get_estimator("mlp")
    llama70 = get_model("llama3-70b")
    alone = StepTimeModel(build_deployment(llama70, GPU, Parallelism(4, 2), "vllm"), estimator)
    first = StepTimeModel(build_deployment(llama70, GPU, Parallelism(4, 1), "vllm"), estimator)
    for batch in BATCHES.values():
        first.step_time_us(batch)
    shared = StepTimeModel(build_deployment(llama70, GPU, Parallelism(4, 2), "vllm"), estimator, shares_with=first)
    assert shared.attention_by_batch is first.attention_by_batch and len(shared.attention_by_batch) == len(BATCHES)
    for batch in BATCHES.values():
        assert shared.step_time_us(batch) == alone.step_time_us(batch)
    with pytest.raises(ServesimError, match="cannot share"):
        StepTimeModel(build_deployment(llama70, GPU, Parallelism(2, 2), "vllm"), estimator, shares_with=first)
    with pytest.raises(ServesimError, match="cannot share"):
        StepTimeModel(build_deployment(llama70, GPU, Parallelism(4, 2), "vllm"), get_estimator("mlp"),
                      shares_with=first)



@pytest.mark.parametrize("settings, largest", [
    ({}, 512),  # vLLM's server default max_num_seqs (1024 on the H100): min(2 x 1024, 512)
    ({"max_num_seqs": 8}, 16),
    ({"max_cudagraph_capture_size": 2048}, 2048),
    ({"max_cudagraph_capture_size": 2048, "max_num_batched_tokens": 1024}, 1024),  # never above the token budget
])
def test_vllm_runs_steps_up_to_the_deployments_capture_size_in_cuda_graphs(settings, largest):
    """vLLM replays steps of up to its largest capture size as CUDA graphs and runs larger ones eagerly; the size
    follows max_num_seqs unless --max-cudagraph-capture-size gives it."""
    deployment = build_deployment(get_model("llama3-8b"), GPU, Parallelism(1, 1), "vllm", **settings)
    model = StepTimeModel(deployment)
    assert deployment.cudagraph_capture_tokens == largest
    assert model.graph_plan(largest, False).mode == "piecewise"
    assert model.graph_plan(largest + 1, False).mode == "none"
    eager = StepTimeModel(deployment, overhead=replace(deployment.release.overhead, eager_launch_us=1000.0))
    batch = BatchSpec((PrefillChunk(largest + 1 - 3, 0),), (64,) * 3)  # a prompt chunk beside three decodes
    launches = sum(n for _, n in eager.expand_stage(batch, 0).op_counts)
    assert eager.step_time_us(batch).stage_us[0] >= launches * 1000.0  # launched one kernel at a time


def test_gpt_oss_takes_vllms_larger_capture_size():
    """vLLM raises gpt-oss's largest CUDA graph to 1024 tokens when the user gives none (992 in 0.11.0)."""
    model = get_model("gpt-oss-120b")
    assert build_deployment(model, GPU, Parallelism(2, 1), "vllm", "mxfp4").cudagraph_capture_tokens == 1024
    assert build_deployment(model, GPU, Parallelism(2, 1), "vllm==0.11.0", "mxfp4").cudagraph_capture_tokens == 992
    given = build_deployment(model, GPU, Parallelism(2, 1), "vllm", "mxfp4", max_cudagraph_capture_size=256)
    assert given.cudagraph_capture_tokens == 256


def test_the_capture_size_decides_which_step_times_a_model_may_share():
    """Two vLLM deployments whose largest CUDA graphs differ time the same steps differently: the simulator refuses
    a step-time model of the one for the other, and the launch command names the size that was assumed."""
    base = build_deployment(get_model("llama3-8b"), GPU, Parallelism(1, 1), "vllm")
    wide = build_deployment(get_model("llama3-8b"), GPU, Parallelism(1, 1), "vllm", max_cudagraph_capture_size=2048)
    assert base.timing_identity() != wide.timing_identity()
    assert "--max-cudagraph-capture-size 2048" in wide.launch_command()
    assert "capture" not in base.launch_command()
    old = build_deployment(get_model("llama3-8b"), GPU, Parallelism(1, 1), "vllm==0.11.0", max_cudagraph_capture_size=64)
    assert "--cuda-graph-sizes 64" in old.launch_command()
    with pytest.raises(ServesimError, match="vLLM flag"):
        build_deployment(get_model("llama3-8b"), GPU, Parallelism(1, 1), "sglang", max_cudagraph_capture_size=64)


def test_the_stream_interval_is_a_launch_flag_of_the_releases_that_have_it():
    """vLLM streams in chunks from 0.12.0 (--stream-interval); 0.11.0 refuses it with the release that works."""
    model = get_model("llama3-8b")
    for engine in ("vllm", "sglang"):
        deployment = build_deployment(model, GPU, Parallelism(1, 1), engine, stream_interval=20)
        assert "--stream-interval 20" in deployment.launch_command()
        assert deployment.timing_identity() == build_deployment(model, GPU, Parallelism(1, 1), engine).timing_identity()
    with pytest.raises(ServesimError, match="vllm==0.12.0"):
        build_deployment(model, GPU, Parallelism(1, 1), "vllm==0.11.0", stream_interval=20)
    assert build_deployment(model, GPU, Parallelism(1, 1), "vllm==0.12.0", stream_interval=20)


def test_a_moe_models_launch_cost_binds_steps_without_graphs_only():
    """The MoE layers' Python runs in a vLLM step without graphs; in a piecewise graph they are inside the captured
    pieces and only attention launches between them, at the plain cost. So a MoE launch cost moves a step above
    the capture size and leaves a piecewise one alone."""
    deployment = build_deployment(get_model("qwen3-30b-a3b"), GPU, Parallelism(1, 1), "vllm")
    overhead = replace(deployment.release.overhead, device_step_us=0.0, device_per_seq_us=0.0)
    costly = replace(overhead, moe_eager_launch_us=1000.0)
    piecewise = BatchSpec((PrefillChunk(100, 0),), (64,) * 8)
    eager = BatchSpec((PrefillChunk(1000, 0),), (64,) * 8)
    models = [StepTimeModel(deployment, get_estimator("mlp"), o) for o in (overhead, costly)]
    assert models[0].graph_plan(piecewise.num_tokens, False).mode == "piecewise"
    assert models[0].graph_plan(eager.num_tokens, False).mode == "none"
    assert models[1].step_time_us(piecewise).stage_us == models[0].step_time_us(piecewise).stage_us
    assert models[1].step_time_us(eager).stage_us[0] > models[0].step_time_us(eager).stage_us[0]
