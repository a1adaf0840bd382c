"""Serving-engine settings that decide memory and batching.

The defaults are each engine release's (servesim/serving/engines.py; docs/engines.md names the source file of
each); every one can be overridden by the user.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from servesim.errors import ServesimError


@dataclass(frozen=True)
class EngineSettings:
    """The knobs of one engine instance that the planner and the simulator honour; the engine registry
    (servesim/serving/engines.py) gives each release's defaults."""

    engine: str  # vllm | sglang
    version: str
    memory_fraction: float  # vLLM gpu_memory_utilization; SGLang mem_fraction_static
    max_num_batched_tokens: int  # vLLM token budget per step; SGLang chunked_prefill_size
    max_num_seqs: int  # vLLM max_num_seqs; SGLang max_running_requests
    block_size: int  # tokens per KV page
    enable_chunked_prefill: bool = True
    kv_cache_dtype: str = "auto"  # --kv-cache-dtype: auto (the activation dtype) or fp8
    enable_prefix_caching: bool = True  # vLLM --enable-prefix-caching; SGLang's radix cache
    async_scheduling: bool = False  # vLLM --async-scheduling; SGLang's overlap scheduler
    #: The MoE kernel of MXFP4 experts: auto (the engine's default for the GPU), marlin (vLLM's
    #: VLLM_MXFP4_USE_MARLIN=1), triton, flashinfer or flashinfer-mxfp8 (Blackwell; vLLM's
    #: VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1); checked by the engine for the GPU (EngineKernels.mxfp4_moe_backend).
    mxfp4_moe_backend: str = "auto"
    #: The MoE kernel of BF16 and FP8 experts: auto (the engine's default for the GPU and model), triton or
    #: flashinfer-trtllm (Blackwell; vLLM's VLLM_USE_FLASHINFER_MOE_FP8=1, SGLang's --moe-runner-backend
    #: flashinfer_trtllm); checked by the engine for the GPU (EngineKernels.moe_backend).
    moe_backend: str = "auto"
    #: SGLang --scheduler-recv-interval (server_args.py, default 1): the scheduler polls for new requests only once
    #: its counter reaches this, the counter growing by 1 per decode batch and by 1000 per prefill batch
    #: (managers/scheduler_recv_skipper.py, SchedulerRecvSkipper; weights in environ.py). 1: every iteration.
    scheduler_recv_interval: int = 1
    #: SGLang --schedule-conservativeness (default 1.0; 0.3 times that with attention data parallelism,
    #: server_args.py ``_handle_data_parallelism``): scales the new-token ratio its admission starts from.
    schedule_conservativeness: float = 1.0
    #: vLLM --max-cudagraph-capture-size: the largest step, in tokens, captured in a CUDA graph (None: vLLM's
    #: default for the model, ``Vllm.cudagraph_capture_tokens``).
    max_cudagraph_capture_size: int | None = None
    #: --stream-interval (both engines; vLLM from 0.12.0): the API server streams a request's first token, then every
    #: N-th and its last (servesim/serving/metrics.py ``streamed_positions``); what a client times ITL between.
    stream_interval: int = 1

    def __post_init__(self) -> None:
        if self.scheduler_recv_interval < 1:
            raise ServesimError(f"--scheduler-recv-interval must be 1 or more, not {self.scheduler_recv_interval}")
        if self.engine != "sglang" and self.scheduler_recv_interval != 1:
            raise ServesimError(f"--scheduler-recv-interval is an SGLang flag; {self.engine} has none: drop it or "
                                f"use --engine sglang")
        if self.max_cudagraph_capture_size is not None:
            if self.engine != "vllm":
                raise ServesimError(f"--max-cudagraph-capture-size is a vLLM flag; {self.engine} captures its decode "
                                    f"batches by its own rule: drop it or use --engine vllm")
            if self.max_cudagraph_capture_size < 1:
                raise ServesimError(f"--max-cudagraph-capture-size must be 1 or more, not "
                                    f"{self.max_cudagraph_capture_size}")
        if self.stream_interval < 1:
            raise ServesimError(f"--stream-interval must be 1 or more, not {self.stream_interval}")
        if self.stream_interval > 1 and (self.engine, self.version) == ("vllm", "0.11.0"):
            raise ServesimError("vLLM 0.11.0 has no --stream-interval (it came in 0.12.0); drop it or use "
                                "--engine vllm==0.12.0 or later")
        # vllm/config/scheduler.py SchedulerConfig verification: a step must have room for one token per sequence.
        if self.engine == "vllm" and self.max_num_batched_tokens < self.max_num_seqs:
            raise ServesimError(
                f"vLLM needs max_num_batched_tokens ({self.max_num_batched_tokens}) >= max_num_seqs "
                f"({self.max_num_seqs}); raise --max-num-batched-tokens or lower --max-num-seqs"
            )

    def with_overrides(self, **overrides: float | int | str | None) -> EngineSettings:
        """A copy with the given fields replaced (``None`` keeps the default)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

