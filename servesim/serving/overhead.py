"""Overhead of an engine step beyond its kernels and collectives, per engine and version.

An engine step costs the GPU its kernels and collectives; around them the engine's CPU schedules the batch,
prepares inputs, launches kernels or replays CUDA graphs and hands the sampled tokens back, and the GPU spends time
no kernel model accounts for. servesim models that cost with these terms:

- ``step_us``: fixed cost of one step (scheduling, input preparation, the sampler hand-off);
- ``per_seq_us``: what each request in the batch adds (scheduler bookkeeping, block tables, detokenisation);
- ``eager_launch_us``: the CPU cost of launching one kernel outside a CUDA graph: a stretch of eager kernels lasts
  their GPU time or their launches' CPU time, whichever is longer (the GPU cannot finish kernels faster than the
  CPU issues them);
- ``moe_eager_launch_us``: the same in a model with MoE layers run without graphs, where the engine's code issues
  more launches (and more Python) around each modelled kernel (None: ``eager_launch_us``); attention between the
  pieces of a piecewise graph launches at ``eager_launch_us``, the MoE layers being inside the pieces;
- ``graph_launch_us``: replaying one captured CUDA graph;
- ``device_step_us`` and ``device_per_seq_us``: GPU time of a step that the kernel model leaves out (gaps
  between kernels, synchronisation, the sampler's bookkeeping), spread over the pipeline stages by their layers.
  It is on the GPU's critical path, so async scheduling, which hides host time behind the previous step, does not
  hide it;
- ``request_us`` and ``per_prompt_token_us``: the API server's work on a request before the engine sees it
  (HTTP handling, tokenisation, the hand-off to the engine process), done one request at a time, so a burst of
  requests reaches the engine spread out, as real clients' requests do;
- ``request_latency_us``: the time between client and engine that no queue adds to and no engine step
  holds: the HTTP round trip, the hand-offs between the API server and the engine process both ways, the
  streamed token's way back. Measured at the client it adds to every TTFT and E2E (and in a closed loop delays
  the client's next request); the simulator charges it on the way in.

The table is keyed by the engine and the version whose kernels servesim models (``servesim.kernels.engines``);
the engine registry (``servesim.serving.engines``) gives each release its constants. ``tools/calibrate_overhead.py``
fits the host and device terms to measured serving runs (docs/validation.md); the launch terms keep their prior
values or those read from public measurements, stated below, but for vLLM 0.15.1's MoE launch cost, chosen on runs
whose prompt steps ran eagerly (:data:`VLLM_0_15_1_MOE_EAGER_LAUNCH_US`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from servesim.errors import ServesimError


@dataclass(frozen=True)
class HostOverhead:
    """Host-overhead constants of one engine version, µs."""

    step_us: float
    per_seq_us: float
    eager_launch_us: float
    graph_launch_us: float
    device_step_us: float = 0.0
    device_per_seq_us: float = 0.0
    request_us: float = 0.0
    per_prompt_token_us: float = 0.0
    request_latency_us: float = 0.0
    moe_eager_launch_us: float | None = None

    def __post_init__(self) -> None:
        for name in ("step_us", "per_seq_us", "eager_launch_us", "graph_launch_us", "device_step_us",
                     "device_per_seq_us", "request_us", "per_prompt_token_us", "request_latency_us",
                     "moe_eager_launch_us"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ServesimError(f"host overhead {name} must be non-negative, not {value}")

    def launch_us(self, moe: bool) -> float:
        """The CPU cost of one eager launch of a model with (``moe``) or without MoE layers."""
        return self.moe_eager_launch_us if moe and self.moe_eager_launch_us is not None else self.eager_launch_us

    def front_end_us(self, prompt_tokens: int) -> float:
        """The API server's time on one request of ``prompt_tokens`` tokens before the engine sees it."""
        return self.request_us + self.per_prompt_token_us * prompt_tokens

    def engine_only(self) -> HostOverhead:
        """These constants without the API server's costs and the request latency: the engine driven in-process,
        as ``vllm bench latency`` and SGLang's ``bench_one_batch`` drive it."""
        return replace(self, request_us=0.0, per_prompt_token_us=0.0, request_latency_us=0.0)

    @property
    def has_front_end(self) -> bool:
        """Whether a request reaches the engine later than its client sends it."""
        return self.request_us > 0 or self.per_prompt_token_us > 0 or self.request_latency_us > 0

    def device_overhead_us(self, num_seqs: int) -> float:
        """GPU time of a step of ``num_seqs`` requests that its kernels do not account for."""
        return self.device_step_us + self.device_per_seq_us * num_seqs

    def step_overhead_us(self, num_seqs: int, graph_launches: int) -> float:
        """Host time of one step with ``num_seqs`` requests that replays ``graph_launches`` CUDA graphs."""
        return self.step_us + self.per_seq_us * num_seqs + self.graph_launch_us * graph_launches


#: Launch costs before calibration: a CUDA kernel launch from Python through PyTorch takes about 5 µs of CPU
#: time, a graph replay about 15 µs (cudaGraphLaunch plus the input copies). Not fitted: see the module docstring.
_EAGER_LAUNCH_US = 5.0
_GRAPH_LAUNCH_US = 15.0

#: SGLang's CPU cost per eager launch, µs, of a dense model and of one with MoE layers. SGLang runs prompt batches
#: eagerly: CUDA graphs cover decode batches, and its piecewise graphs for prompts are off by default up to 0.5.9
#: (``enable_piecewise_cuda_graph = False`` in python/sglang/srt/server_args.py; 0.5.10 turns them on but for listed
#: model classes), so every module's Python runs per kernel. Read from public measurements, not fitted, each over the
#: launches servesim models for the step measured: SGLang's Llama-3-8B decode of one request without CUDA graphs,
#: 8.2 to 9.3 ms (against 7.1 to 7.4 ms graphed; sgl-project/sglang pull request 1401), over 324 launches (``servesim
#: kernels --model llama3-8b --engine sglang --batch decode:128``): 25 to 29 µs each; and its log of a DeepSeek-V3
#: prompt of one new token at TP 8, "forward cost" 82.64 ms eager against 23.1 ms with a prompt CUDA graph (pull
#: request 12160), over 1,232 launches (1,108 kernels, the shared expert inside the fused MoE, and 124 collectives:
#: ``servesim kernels --model deepseek-v3 --engine sglang --tp 8 --dtype fp8-block --batch prefill:1+1``): 67.1 µs,
#: the MoE layers' routing, sorting and quantisation launching around each modelled kernel. vLLM runs prompts
#: through torch.compile's code or piecewise graphs and keeps the 5 µs prior.
SGLANG_EAGER_LAUNCH_US = 27.0
SGLANG_MOE_EAGER_LAUNCH_US = 67.1

#: (engine, version) -> constants. ``step_us``, ``per_seq_us``, ``device_step_us`` and ``device_per_seq_us`` were
#: fitted by ``tools/calibrate_overhead.py --estimator mlp`` (the default estimator) on the H100 rows of
#: aiconfigurator-core's silicon_sample.csv (vLLM: 0.12.0 runs, scheduled synchronously, and InferenceX runs with
#: the async scheduling, FP8 KV cache and no prefix caching their launch scripts set; SGLang: 0.5.1.post1 and
#: 0.5.8.post1 runs with the overlap scheduler) and checked on the H200 rows (docs/validation.md). They absorb what
#: the kernel estimator leaves out of a step, so they are refitted whenever the default estimator, its weights or
#: the simulator's step times change. The API server's terms fitted to zero on those rows and stay there.
HOST_OVERHEAD: Mapping[tuple[str, str], HostOverhead] = MappingProxyType(
    {
        ("vllm", "0.11.0"): HostOverhead(
            step_us=302.3, per_seq_us=33.118, eager_launch_us=_EAGER_LAUNCH_US, graph_launch_us=_GRAPH_LAUNCH_US,
            device_step_us=470.2, device_per_seq_us=4.007,
        ),
        ("sglang", "0.5.3"): HostOverhead(
            step_us=81.5, per_seq_us=20.077, eager_launch_us=SGLANG_EAGER_LAUNCH_US, graph_launch_us=_GRAPH_LAUNCH_US,
            device_step_us=126.4, device_per_seq_us=23.573, moe_eager_launch_us=SGLANG_MOE_EAGER_LAUNCH_US,
        ),
    }
)


#: vLLM's request latency outside the engine, µs (``request_latency_us``), for the releases whose measured runs
#: show it: the mean over the 20 load stages of inference-sim's public inference-perf runs (vLLM on H100 SXM,
#: Llama-2-7B/70B, CodeLlama-34B, Mixtral-8x7B; every request succeeded) of the median TTFT less the 2.5 steps
#: async scheduling accounts for: 6.1 to 13.0 ms per stage, ``python experiments/request_latency.py``
#: (docs/validation-results.md). It is read from the measured TTFT and step times alone, not fitted through
#: servesim's kernel predictions.
VLLM_REQUEST_LATENCY_US = 8600.0

#: vLLM 0.15.1's device-side step term, µs (``device_step_us``; ``device_per_seq_us`` zero), chosen on its runs of
#: known protocol on the training GPU alone: the inference-perf stages above and InferenceX's Llama-3.1-70B H100
#: rows, replayed under 0, 150, 300 and 470.2 µs; 300 gave the least TTFT plus TPOT MAPE (``tools/
#: calibrate_overhead.py --estimator mlp --release vllm==0.15.1 --results ... --exclude-model openai/gpt-oss-120b``,
#: docs/validation-results.md; gpt-oss is left out because its Marlin MoE times are off, docs/kernels.md).
VLLM_0_15_1_DEVICE_STEP_US = 300.0

#: vLLM 0.15.1's CPU cost per eager launch of a model with MoE layers, µs (``moe_eager_launch_us``; dense models keep
#: the 5 µs prior). A step above the deployment's largest CUDA graph runs the torch.compile'd code without graphs,
#: and each MoE layer's FusedMoE op runs its Python (routing, block alignment, activation quantisation) around the
#: modelled kernels. Chosen on the release's runs of known protocol on the training GPU, as the device term above
#: (MiniMax-M2.5's InferenceX H100 rows, whose 1k-token prompt steps exceed the 512-token graphs, and the
#: inference-perf stages with Mixtral-8x7B), among 5, 40, 60, 70, 80 and 100 µs: ``tools/calibrate_overhead.py
#: --estimator mlp --release vllm==0.15.1 --results ... --gpu H100-SXM --exclude-model openai/gpt-oss-120b --term
#: moe_eager_launch_us --grid 5,40,60,70,80,100`` (docs/validation-results.md).
VLLM_0_15_1_MOE_EAGER_LAUNCH_US = 40.0


def host_overhead(engine: str, version: str) -> HostOverhead:
    """The constants of ``engine`` at ``version``; raises ServesimError for a version without calibration."""
    try:
        return HOST_OVERHEAD[(engine, version)]
    except KeyError:
        known = ", ".join(f"{e} {v}" for e, v in HOST_OVERHEAD)
        raise ServesimError(
            f"no host-overhead constants for {engine} {version} (calibrated: {known}); run "
            f"tools/calibrate_overhead.py and add them to servesim/serving/overhead.py"
        ) from None
