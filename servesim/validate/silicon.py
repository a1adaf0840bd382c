"""aiconfigurator-core's measured serving runs (``systems/silicon_sample.csv``) as replayable cases.

Each aggregated-mode row is one closed-loop benchmark of a vLLM or SGLang server: ``concurrency`` clients (the
row's ``batch_size`` where the source did not record it) each send a request of ``isl`` prompt tokens asking for
``osl`` output tokens, and the next one when it completes; the row stores the **mean** TTFT and TPOT over the
run's requests (aiconfigurator's collection reads ``mean_ttft`` and ``mean_tpot`` of the benchmark's result),
queueing behind the other clients included.

Two benchmark protocols are in the file, told apart by the row's ``source``:

- InferenceX exports (``source_file=2026-04-06.csv``, ``db-dump/...``): ``benchmark_serving.py --dataset-name random
  --random-range-ratio 0.8 --num-prompts CONC*10 --max-concurrency CONC --ignore-eos``; that script draws each
  request's lengths uniformly from ``[0.8 × len, len]``.
- aiconfigurator's own collection (``aic-auto-gap-analysis`` paths): fixed lengths; the request count is not
  recorded and is taken as 10 × concurrency like InferenceX.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

import pandas as pd

from servesim.errors import ServesimError
from servesim.serving.engines import ENGINES
from servesim.validate.replay import ServingCase, Skipped, preset_for

#: GPUs and engines the validation covers by default: every GPU of the file with vLLM or SGLang runs.
SILICON_GPUS = ("H100-SXM", "H200", "B200", "B300", "GB200")
SILICON_ENGINES = tuple(ENGINES)
#: The presets of the dense models whose rows the accuracy bar is set on (Llama-3.1-8B, Llama-3.1-70B, Qwen3-32B);
#: the file's other replayable rows (the Qwen3-235B-A22B MoE) are reported beside them.
BAR_PRESETS = ("llama3.1-8b", "llama3.1-70b", "qwen3-32b")

#: silicon_sample ``gemm_quant`` -> servesim weight format; a missing value is an unquantised BF16 checkpoint. The file
#: labels gpt-oss's MXFP4 checkpoint ``nvfp4`` (its Hopper runs too, which have no FP4 Tensor cores, see
#: :data:`MXFP4_CHECKPOINTS`); other models' ``nvfp4`` rows are NVIDIA's NVFP4 checkpoints, replayed where servesim
#: models the release (servesim.models.memory.NVFP4_LINEAR_ROLES) and reported skipped with the expansion's reason
#: elsewhere.
#: ``int4_wo`` is Kimi-K2.5's checkpoint of INT4 weight-only experts (servesim's ``int4``).
_GEMM_QUANT_DTYPES = {"": "bf16", "bf16": "bf16", "fp8": "fp8", "fp8_block": "fp8-block", "nvfp4": "nvfp4",
                      "int4_wo": "int4"}
#: Models whose ``nvfp4`` rows ran an MXFP4 checkpoint: gpt-oss ships its experts in MXFP4 only.
MXFP4_CHECKPOINTS = frozenset({"openai/gpt-oss-120b", "openai/gpt-oss-20b"})
#: Models whose ``fp8`` rows ran a block-scaled FP8 checkpoint that servesim's preset (the BF16 release's config)
#: does not declare: InferenceX serves ``Qwen/Qwen3.5-397B-A17B-FP8`` (``.github/configs/nvidia-master.yaml``), and
#: aiconfigurator's vLLM rows of ``Qwen/Qwen3-235B-A22B-FP8`` name that checkpoint (its SGLang rows say
#: ``fp8_block``): Qwen's FP8 releases, whose weights carry one scale per 128 x 128 block (``weight_block_size``),
#: which vLLM reads from the checkpoint whatever the label.
FP8_BLOCK_CHECKPOINTS = frozenset({"Qwen/Qwen3.5-397B-A17B", "Qwen/Qwen3-235B-A22B-FP8"})


def _weight_format(model_id: str, quant: str) -> str:
    """servesim's ``--dtype`` for a row's ``gemm_quant``."""
    dtype = _GEMM_QUANT_DTYPES[quant]
    if dtype == "nvfp4" and model_id in MXFP4_CHECKPOINTS:
        return "mxfp4"
    return "fp8-block" if dtype == "fp8" and model_id in FP8_BLOCK_CHECKPOINTS else dtype


@dataclass(frozen=True)
class BenchmarkProtocol:
    """How a run was made. The client: ``requests_per_client`` × concurrency requests, each length uniform over
    ``[length_ratio × nominal, nominal]`` (``length_ratio = 1``: fixed lengths). The server: the KV-cache dtype its
    launch passed (``auto`` when it passed none), whether it capped the running requests at the concurrency and its
    token budget per step as a multiple of the nominal prompt length (0: the release's default)."""

    name: str
    requests_per_client: int
    length_ratio: float
    kv_cache_dtype: str
    max_num_seqs_is_concurrency: bool
    async_scheduling: bool | None = None  # None: the release's default
    prefix_caching: bool | None = None
    mxfp4_moe_backend: str = "auto"
    batched_tokens_per_isl: int = 0
    # True: --enable-expert-parallel whatever the row's EP (the experts spread over TP); False: never, whatever the
    # row's EP; None: as the row says.
    expert_parallel: bool | None = None
    moe_backend: str = "auto"  # the MoE kernel the release picked for BF16 and FP8 experts, where servesim's differs
    per_prompt_token_us: float | None = None  # the API server's time per token of its prompt text (None: release's)
    memory_fraction: float | None = None  # --gpu-memory-utilization (None: the release's default)
    max_cudagraph_capture_size: int | None = None  # --max-cudagraph-capture-size (None: the release's default)


#: The API server's time per prompt token of InferenceX's prompts, µs: its client (``benchmark_serving.py
#: --dataset-name random``) sends text decoded from random token ids, which the server tokenises again, one request
#: at a time (vLLM's API server, SGLang's tokenizer manager). Its H100 vLLM runs show the cost: at 4 clients
#: gpt-oss-120b's 8k-token prompts come 39 to 56 ms later than predicted at TP 2, 4 and 8 alike while the 1k-token
#: ones match, a cost that does not shrink with the GPUs. Chosen on the H100 rows replayed as vLLM 0.15.1
#: (gpt-oss-120b, MiniMax-M2.5, Llama-3.1-70B) among 0, 3, 6 and 9 µs for the least TTFT plus TPOT MAPE
#: (``tools/calibrate_overhead.py --estimator mlp --release vllm==0.15.1 --gpu H100-SXM --term per_prompt_token_us
#: --grid 0,3,6,9``, docs/validation-results.md); the SGLang runs, which have no H100 rows, carry the same cost, as
#: the work is the same Hugging Face tokeniser on the same text. A release default would over-state it for prompts
#: of ordinary text: the inference-perf runs of vLLM 0.15.1, whose TTFT the request latency already fits, would gain
#: 3.5 to 4.7 ms each.
INFERENCEX_PROMPT_TOKEN_US = 6.0


def _inferencex(**flags) -> BenchmarkProtocol:
    """An InferenceX protocol: 10 requests per client, lengths uniform over [0.8 × nominal, nominal], its prompts'
    API-server cost, and the server flags of the launch script."""
    return BenchmarkProtocol("InferenceX", requests_per_client=10, length_ratio=0.8,
                             per_prompt_token_us=INFERENCEX_PROMPT_TOKEN_US, **flags)


#: InferenceX's vLLM launch scripts of the Llama-3.1-70B rows (``benchmarks/70b_fp8_h100_slurm.sh`` and
#: ``70b_fp8_h200_slurm.sh``) write ``kv-cache-dtype: fp8``, ``async-scheduling: true`` and
#: ``no-enable-prefix-caching`` into the server's config.yaml and pass ``--max-num-seqs $CONC``.
INFERENCEX = _inferencex(kv_cache_dtype="fp8", max_num_seqs_is_concurrency=True, async_scheduling=True,
                         prefix_caching=False)
#: ``benchmarks/single_node/gptoss_fp4_h100.sh`` and ``gptoss_fp4_h200.sh`` (InferenceX, 2026-03-27, vLLM 0.18.0):
#: ``no-enable-prefix-caching`` and ``max-num-batched-tokens: 8192`` in config.yaml, ``--max-num-seqs $CONC``, no
#: KV-cache dtype (auto), and ``VLLM_MXFP4_USE_MARLIN=1``: the MXFP4 experts run on vLLM's Marlin MoE kernel.
INFERENCEX_GPT_OSS_HOPPER = _inferencex(kv_cache_dtype="auto", max_num_seqs_is_concurrency=True,
                                        prefix_caching=False, mxfp4_moe_backend="marlin")
#: ``benchmarks/single_node/minimaxm2.5_fp8_h200.sh`` (InferenceX, 2026-03-01 to 2026-03-27, vLLM 0.16.0 and
#: 0.18.0): ``vllm serve`` with the layout, ``--gpu-memory-utilization 0.95`` and ``--max-model-len`` only, so the
#: KV cache, running-request cap and prefix cache are vLLM's defaults; so does ``minimaxm2.5_fp8_b200.sh`` of
#: 2026-03-11 (64c20b6b5, the vLLM 0.17.0 runs), which also exports ``VLLM_USE_FLASHINFER_MOE_FP8=0`` (the Triton MoE).
INFERENCEX_MINIMAX = _inferencex(kv_cache_dtype="auto", max_num_seqs_is_concurrency=False, memory_fraction=0.95)
#: The same scripts while they tested ``if [ "$EP_SIZE" -ge 1 ]`` before passing ``--enable-expert-parallel``: true
#: for the default EP of 1, so every run spread the experts over its TP ranks. ``minimaxm2.5_fp8_h200.sh`` did from
#: 2026-03-13 (5e2c705d3, "enable ep", the TP 8 runs) and ``minimaxm2.5_fp8_b200.sh`` from its first version
#: (f342df18e) until 2026-04-03 (bddbf4031, ``-gt 1``), the vLLM 0.17.0 runs.
INFERENCEX_MINIMAX_EP = replace(INFERENCEX_MINIMAX, expert_parallel=True)
#: ``minimaxm2.5_fp8_h100.sh`` (2026-03-27, 626932a11, vLLM 0.18.0): no KV-cache dtype, ``--max-num-seqs 256`` (above
#: every row's concurrency) and ``--no-enable-prefix-caching``.
INFERENCEX_MINIMAX_H100 = _inferencex(kv_cache_dtype="auto", max_num_seqs_is_concurrency=False,
                                      prefix_caching=False)
#: ``minimaxm2.5_fp8_b200.sh`` from 2026-04-03 (bddbf4031) and ``minimaxm2.5_fp8_b300.sh`` (the vLLM 0.19 runs):
#: ``--kv-cache-dtype fp8``, ``--max-num-batched-tokens $((ISL * 2))``, ``--no-enable-prefix-caching`` and
#: ``--max-cudagraph-capture-size 2048`` (steps of up to 2,048 tokens in CUDA graphs; so do the NVFP4 scripts of the
#: 0.19 runs, ``minimaxm2.5_fp4_b200.sh`` from 2026-04-08, 79bd988e9, and ``minimaxm2.5_fp4_b300.sh``).
INFERENCEX_MINIMAX_BLACKWELL = _inferencex(kv_cache_dtype="fp8", max_num_seqs_is_concurrency=False,
                                           prefix_caching=False, batched_tokens_per_isl=2,
                                           max_cudagraph_capture_size=2048)
#: Their vLLM 0.19.0 runs: that release's FP8 MoE oracle (``model_executor/layers/fused_moe/oracle/fp8.py``) takes
#: FlashInfer's TRT-LLM block-FP8 MoE on SM100 for MiniMax-M2.5, whose routing (sigmoid scores with a bias, no expert
#: groups) and FP32 router logits 0.17 and 0.18 refused for it (``experts/trtllm_fp8_moe.py``): the variant where
#: vLLM routes and the kernel runs the experts. servesim's vLLM (0.15.1 and older) times the Triton path.
INFERENCEX_MINIMAX_VLLM_0_19 = replace(INFERENCEX_MINIMAX_BLACKWELL, moe_backend="flashinfer-trtllm")
#: ``benchmarks/single_node/gptoss_fp4_b200.sh`` (InferenceX, 2026-02-25 to 2026-03-27, vLLM 0.15.1):
#: ``kv-cache-dtype: fp8`` and ``no-enable-prefix-caching`` in config.yaml, ``--max-num-seqs 512`` (at least every
#: row's concurrency) and ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1``: FlashInfer's TRT-LLM MXFP4 MoE with MXFP8
#: activations; no async-scheduling flag (the release's default).
INFERENCEX_GPT_OSS_B200 = _inferencex(kv_cache_dtype="fp8", max_num_seqs_is_concurrency=True,
                                      prefix_caching=False, mxfp4_moe_backend="flashinfer-mxfp8")
#: The gpt-oss scripts of 2025-11-02 (``gptoss_fp4_b200_docker.sh``, ``gptoss_fp4_h100_*.sh`` and
#: ``gptoss_fp4_h200_slurm.sh``): no KV-cache dtype until 2025-12-05 (25506e87c) and no ``VLLM_MXFP4_USE_MARLIN``
#: until 2026-01-02 (4e52ed4c6), so the MXFP4 experts ran on the release's default kernel.
_GPT_OSS_KV_FP8_FROM, _GPT_OSS_MARLIN_FROM = "2025-12-05", "2026-01-02"
#: ``benchmarks/single_node/kimik2.5_int4_h200.sh`` and ``kimik2.5_int4_b200.sh`` (InferenceX, 2026-03-27):
#: ``--max-num-seqs $CONC`` and ``--no-enable-prefix-caching``, no KV-cache dtype (the model's, BF16). The B200 script
#: also exports ``VLLM_USE_FLASHINFER_MOE_INT4=1`` (FlashInfer's INT4 MoE), which is not modelled (Marlin is).
#: ``kimik2.5_fp4_b200.sh`` passes the same but never ``--enable-expert-parallel`` (a58dedd5a of 2026-03-11 to
#: 6c3acebfa): its runs the configuration labels ``ep: 4`` ran the experts tensor-parallel over the TP ranks.
INFERENCEX_KIMI = _inferencex(kv_cache_dtype="auto", max_num_seqs_is_concurrency=True, prefix_caching=False,
                              expert_parallel=False)
#: ``kimik2.5_fp4_b200.sh`` from 2026-04-20 (6c3acebfa): ``--kv-cache-dtype fp8``, ``--max-num-batched-tokens
#: $((ISL * 2))`` and ``--max-cudagraph-capture-size 2048`` besides.
INFERENCEX_KIMI_B200_APRIL = replace(INFERENCEX_KIMI, kv_cache_dtype="fp8", batched_tokens_per_isl=2,
                                     max_cudagraph_capture_size=2048)
#: ``minimaxm2.5_fp4_b200.sh`` of the vLLM nightly runs (2026-04-02, 08bcde8f1, the image
#: ``vllm-openai:nightly-5b8c30d6…``): ``--kv-cache-dtype fp8``, ``--no-enable-prefix-caching`` and
#: ``--gpu-memory-utilization 0.95`` but no token budget and no CUDA-graph size.
INFERENCEX_MINIMAX_FP4_NIGHTLY = replace(INFERENCEX_MINIMAX_BLACKWELL, batched_tokens_per_isl=0, memory_fraction=0.95,
                                         max_cudagraph_capture_size=None)
#: InferenceX launches whose flags differ from the Llama-3.1-70B scripts', by the row's model id and GPU.
INFERENCEX_BY_MODEL = {("openai/gpt-oss-120b", "H100-SXM"): INFERENCEX_GPT_OSS_HOPPER,
                       ("openai/gpt-oss-120b", "H200"): INFERENCEX_GPT_OSS_HOPPER,
                       ("openai/gpt-oss-120b", "B200"): INFERENCEX_GPT_OSS_B200,
                       ("moonshotai/Kimi-K2.5", "H200"): INFERENCEX_KIMI,
                       ("moonshotai/Kimi-K2.5", "B200"): INFERENCEX_KIMI,
                       ("MiniMaxAI/MiniMax-M2.5", "H100-SXM"): INFERENCEX_MINIMAX_H100,
                       ("MiniMaxAI/MiniMax-M2.5", "H200"): INFERENCEX_MINIMAX,
                       ("MiniMaxAI/MiniMax-M2.5", "B200"): INFERENCEX_MINIMAX_BLACKWELL,
                       ("MiniMaxAI/MiniMax-M2.5", "B300"): INFERENCEX_MINIMAX_BLACKWELL}
AICONFIGURATOR = BenchmarkProtocol("aiconfigurator", requests_per_client=10, length_ratio=1.0, kv_cache_dtype="auto",
                                   max_num_seqs_is_concurrency=False)


@dataclass(frozen=True)
class SglangLaunch:
    """The flags of an InferenceX SGLang launch the replay follows: the KV-cache dtype (``auto`` where the script
    passes none), ``--chunked-prefill-size`` (None: SGLang's default), whether the radix cache is on and
    ``--scheduler-recv-interval`` (None: not passed, SGLang's default 1), whether it passed ``--enable-ep-moe``
    (the experts over every TP rank, whatever EP the row records), and ``--mem-fraction-static`` where the replay
    follows it (None: SGLang's default)."""

    kv_cache_dtype: str
    chunked_prefill_size: int | None
    radix_cache: bool = False
    recv_interval: int | None = None
    expert_parallel: bool = False
    memory_fraction: float | None = None


def inferencex_sglang_launch(model_id: str, gpu: str, tp: int, concurrency: int, version: str,
                             dtype: str) -> SglangLaunch:
    """The launch flags of an InferenceX SGLang run, from the script its GPU and model ran (versions of the rows'
    dates in ``benchmarks/single_node/``):

    - ``dsr1_fp8_h200.sh`` (2026-03-27, 626932a11): no KV-cache dtype, ``--chunked-prefill-size 32768``,
      ``--disable-radix-cache``, no receive interval;
    - ``dsr1_fp8_b200.sh`` (2026-03-11, 64c20b6b5, as of 626932a11) and ``dsr1_fp8_b300.sh`` (2026-04-17,
      5b302f147): ``fp8_e4m3`` KV, no radix cache; at TP 8 chunks of 32,768 and a receive interval of 10 below 16
      clients, 30 from 16; at TP 4 chunks of 8,192, an interval of 10 and ``--mem-fraction-static 0.95`` (on the
      B200 SGLang's default fraction leaves DeepSeek's weights no room for a KV cache at TP 4);
    - ``qwen3.5_fp8_h200.sh`` (626932a11): ``fp8_e4m3`` KV, chunks of 16,384, no radix cache, no receive interval;
    - ``qwen3.5_fp8_b200.sh`` (2026-03-23, 6a5dad463, as of 626932a11) and ``qwen3.5_bf16_b200.sh`` (2026-02-19,
      9dc87a68c): chunks of 32,768, ``fp8_e4m3`` KV for the FP8 checkpoint only, a receive interval of 10 below 16
      clients, 30 from 16; ``qwen3.5_fp8_b300.sh`` (2026-04-17, c0f62a2ef, the FP8 0.5.10 runs): chunks of 16,384,
      an interval of 10; ``qwen3.5_bf16_b300.sh`` (32274d6c1) and ``qwen3.5_fp4_b300.sh`` (8acbd08b7), both of
      2026-04-17 (their 0.5.10 runs measured the day after), and the earlier 0.5.9 FP8 B300 runs (marked wip,
      2026-04-03) follow the B200 recipe;
    - ``glm5_fp8_h200.sh`` (626932a11): SGLang's defaults but ``--mem-fraction-static 0.85`` (radix cache on, KV in
      the model's dtype); ``glm5_fp8_b200.sh`` and ``glm5_fp8_b300.sh`` (2026-04-17, 6c66a00d9): ``fp8_e4m3`` KV,
      chunks of 32,768, no radix cache;
    - their NVFP4 scripts: ``dsr1_fp4_b200.sh`` (626932a11) and ``dsr1_fp4_b300.sh`` (2026-04-17, 9ebeafb4e):
      ``fp8_e4m3`` KV, chunks of 16,384, no radix cache, a receive interval of 10 below 16 clients, 30 from 16; the
      B200 runs of 2025, which record no release, ran ``dsr1_fp4_b200_docker.sh`` (4b860b78e), which also passed
      ``--enable-ep-moe``;
      ``qwen3.5_fp4_b200.sh`` (2026-04-08, 48d35c480) as the FP8 one; ``glm5_fp4_b200.sh`` (2026-04-02, 800f57aaf):
      no KV-cache dtype, chunks of 131,072, the radix cache on. SGLang serves a DSA model's ``auto`` KV cache in
      ``fp8_e4m3`` on compute capability 10 and in BF16 before (``ServerArgs._set_default_nsa_kv_cache_dtype``; GLM-5
      is one since sgl-project/sglang pull request 18521, 2026-02-10), so that run's cache was FP8.

    Their ``--max-running-requests`` is not replayed (the running requests stay capped at the concurrency): the B200
    DeepSeek and Qwen3.5 scripts cap TP 8 (DeepSeek) and every layout (Qwen3.5) at 128, but the file's 256- and
    512-client runs of DeepSeek-R1 at TP 8 came from its MTP launch (:data:`_PLAIN_BESIDE_MTP`, skipped).
    """
    model = model_id.lower()
    by_clients = 10 if concurrency < 16 else 30
    blackwell_recipe = gpu in ("B200", "B300")
    if "deepseek" in model:
        if dtype == "nvfp4":
            return SglangLaunch("fp8", 16384, recv_interval=by_clients, expert_parallel=not version)
        if gpu == "H200":
            return SglangLaunch("auto", 32768)
        return SglangLaunch("fp8", 32768 if tp == 8 else 8192,
                            recv_interval=(by_clients if tp != 4 else 10) if blackwell_recipe else None,
                            memory_fraction=0.95 if tp == 4 and blackwell_recipe else None)
    if "qwen3.5" in model:
        if gpu == "H200":
            return SglangLaunch("fp8", 16384)
        if gpu == "B300" and version.startswith("0.5.10") and dtype.startswith("fp8"):
            return SglangLaunch("fp8", 16384, recv_interval=10)
        return SglangLaunch("auto" if dtype == "bf16" else "fp8", 32768,
                            recv_interval=by_clients if blackwell_recipe else None)
    if "glm-5" in model:
        if gpu == "H200":
            return SglangLaunch("auto", None, radix_cache=True)
        if dtype == "nvfp4" and gpu == "B200":
            return SglangLaunch("fp8", 131072, radix_cache=True)
        return SglangLaunch("fp8", 32768)
    return SglangLaunch(INFERENCEX.kv_cache_dtype, None)


#: InferenceX's ``benchmarks/gptoss_fp4_h100_docker.sh`` passed its client ``--max-concurrency 512`` whatever the
#: run's concurrency from 2025-11-21 (d22bf9ca9) until 2025-12-08 (4e135fd3f, "fix h100 docker error"), while the
#: server kept ``--max-num-seqs $CONC`` and the client sent ``10 × $CONC`` prompts. The gpt-oss H100 rows measured
#: in that window record 512 clients, but the server ran the nominal few at a time (TP 8, 1k/8k: TPOT 3.57 ms, as at
#: 4 clients; TTFT 118 s of queueing), and neither the cap nor the request count is recorded.
_CLIENT_CAP_BUG = ("openai/gpt-oss-120b", "H100-SXM", "2025-11-21", "2025-12-08")
_MEASURED = re.compile(r"measured=(\d{4}-\d{2}-\d{2})")


def _measured_on(source: str) -> str:
    """The date a row's ``source`` says it was measured on (``YYYY-MM-DD``), or "" where it does not say."""
    measured = _MEASURED.search(source)
    return measured.group(1) if measured else ""


def _protocol_unknown(row: Mapping) -> str | None:
    """Why a row's run cannot be reconstructed, or None."""
    model_id, gpu, first, last = _CLIENT_CAP_BUG
    if (row["model"], row["gpu"]) == (model_id, gpu) and first <= _measured_on(str(row["source"])) <= last:
        return ("measured while InferenceX's gptoss_fp4_h100_docker.sh gave its client 512 clients whatever the "
                "server's --max-num-seqs (fixed in 4e135fd3f): the server's cap and request count are not recorded")
    return None


def protocol_for(source: str, model_id: str = "", gpu: str = "", version: str = "") -> BenchmarkProtocol:
    """The benchmark protocol of a silicon_sample row, from its ``source`` text, model id, GPU and engine version."""
    if "aic-auto-gap-analysis" in source:
        return AICONFIGURATOR
    if (model_id, gpu) == ("MiniMaxAI/MiniMax-M2.5", "B200") and version.startswith("0.17"):
        return INFERENCEX_MINIMAX_EP  # the B200 script before 2026-04-03
    if (model_id, gpu) == ("MiniMaxAI/MiniMax-M2.5", "H200") and _measured_on(source) >= "2026-03-13":
        return INFERENCEX_MINIMAX_EP
    if model_id == "MiniMaxAI/MiniMax-M2.5" and gpu in ("B200", "B300") and version.startswith("0.19"):
        return INFERENCEX_MINIMAX_VLLM_0_19
    if (model_id, gpu) == ("MiniMaxAI/MiniMax-M2.5", "B200") and version.startswith("nightly"):
        return INFERENCEX_MINIMAX_FP4_NIGHTLY  # the B200's nightly runs are its NVFP4 ones
    measured = _measured_on(source)
    if (model_id, gpu) == ("moonshotai/Kimi-K2.5", "B200") and measured >= "2026-04-20":
        return INFERENCEX_KIMI_B200_APRIL
    protocol = INFERENCEX_BY_MODEL.get((model_id, gpu), INFERENCEX)
    if model_id == "openai/gpt-oss-120b" and measured:
        if measured < _GPT_OSS_KV_FP8_FROM and protocol.kv_cache_dtype == "fp8":
            protocol = replace(protocol, kv_cache_dtype="auto")
        if measured < _GPT_OSS_MARLIN_FROM and protocol.mxfp4_moe_backend == "marlin":
            protocol = replace(protocol, mxfp4_moe_backend="auto")
    return protocol


def load_silicon_rows(
    gpus: Iterable[str] = SILICON_GPUS,
    engines: Iterable[str] = SILICON_ENGINES,
    models: Iterable[str] | None = None,
) -> pd.DataFrame:
    """The aggregated-mode silicon_sample rows of ``gpus`` and ``engines`` (and ``models``: Hugging Face ids or
    presets, every model when None)."""
    from servesim.data.aiconfigurator import load_silicon_sample

    frame = load_silicon_sample()
    gpus, engines = tuple(gpus), tuple(engines)
    for kind, names, known in (("GPU", gpus, frame["gpu"]), ("engine", engines, frame["backend"])):
        unknown = sorted(set(names) - set(known.dropna()))
        if unknown:
            raise ServesimError(f"silicon_sample.csv has no {kind} {', '.join(unknown)}; it has "
                                f"{', '.join(sorted(set(known.dropna())))}")
    keep = frame["gpu"].isin(gpus) & frame["backend"].isin(engines) & (frame["mode"] == "aggregated")
    if models is not None:
        wanted = {m.strip().lower() for m in models}
        keep &= frame["model"].map(lambda m: m.lower() in wanted or (preset_for(m) or "") in wanted)
    selected = frame[keep].sort_values(["gpu", "backend", "model", "tp", "isl", "osl", "concurrency"], kind="stable")
    if selected.empty:
        raise ServesimError("no aggregated silicon_sample row matches the selection; widen --gpu/--engine/--model")
    return selected.reset_index(drop=True)


def _int(value) -> int | None:
    return None if pd.isna(value) else int(value)


def _skip(row: Mapping, reason: str) -> Skipped:
    return Skipped(str(row["id"]), str(row["model"]), str(row["gpu"]), str(row["backend"]), reason)


#: InferenceX configurations (``config_id`` in a row's source) that ran attention data parallelism: their search-space
#: entry in ``.github/configs/nvidia-master.yaml`` sets ``dp-attn: true`` and their script passes
#: ``--tensor-parallel-size=1 --data-parallel-size=$TP --enable-expert-parallel``
#: (``benchmarks/single_node/minimaxm2.5_fp4_b200.sh`` and ``_b300.sh`` from 2026-04-08, ``DP_ATTENTION=true``):
#: MiniMax-M2.5 NVFP4 at TP 2 EP 2 with 256 to 1,024 clients on the B200 (707) and 256 to 2,048 on the B300 (727),
#: measured 2026-04-21 and 22. The file labels every expert-parallel vLLM run of InferenceX's exports
#: ``attention_dp`` = TP and ``moe_ep`` = TP², with or without the flag: the others are ``{tp: N, ep: N}`` entries
#: launched ``--tensor-parallel-size N --enable-expert-parallel`` (MiniMax-M2.5 FP8 on H100, B200, B300, NVFP4
#: configurations 703, 706, 726, 729; Kimi-K2.5 NVFP4 on B200, 2026-03-27 to 04-22; none of those scripts passes
#: ``--data-parallel-size``, and the one ``dp-attn`` entry among them, MiniMax-M2.5 FP8 on the B300 at 1,024 clients,
#: runs a script that ignores ``DP_ATTENTION``).
_DP_ATTENTION_CONFIGS = frozenset({707, 727})
_CONFIG_ID = re.compile(r"config_id=(\d+)")


def _layout(row: Mapping, is_moe: bool) -> tuple[int, int, int] | str:
    """The row's (TP, EP, attention DP) as servesim replays it (the MoE degrees only matter for MoE models), or why
    it cannot be.

    Some SGLang rows record ``tp_size`` as TP × EP with ``moe_tp_size`` TP: the row id says ``_tp4_ep4_`` where the
    columns say 16, 4, 4, and the same measurement appears in another source of the file as TP 4, MoE TP 1, EP 4.
    A row whose ``tp`` is the product of MoE degrees both above 1 is read so: TP = ``moe_tp``, EP = ``moe_ep``.
    A vLLM row labelled with attention data parallelism ``attention_dp`` = TP, ``moe_ep`` = TP² is an expert-parallel
    run, the experts over all TP GPUs, with one attention rank per GPU for the launches known to have run them
    (:data:`_DP_ATTENTION_CONFIGS`) and none otherwise."""
    tp = _int(row["tp"])
    attention_dp, moe_tp, moe_ep = (_int(row[c]) for c in ("attention_dp", "moe_tp", "moe_ep"))
    if attention_dp not in (None, 0, 1):
        if attention_dp != tp or moe_ep != tp * tp or str(row.get("backend")) != "vllm":
            return (f"attention data parallelism {attention_dp} with TP {tp} and EP {moe_ep}: not the labels of "
                    f"InferenceX's vLLM expert-parallel runs, whose launch is not known")
        config = _CONFIG_ID.search(str(row.get("source", "")))
        dp = tp if config and int(config.group(1)) in _DP_ATTENTION_CONFIGS else 1
        return tp, tp, dp
    if not is_moe or moe_ep in (None, 0, 1):
        if is_moe and moe_tp not in (None, 0, tp):
            return f"MoE tensor parallelism {moe_tp} differing from TP {tp} is not modelled"
        return tp, 1, 1
    if moe_tp not in (None, 0) and moe_tp > 1 and tp == moe_tp * moe_ep:
        return moe_tp, moe_ep, 1
    if (moe_tp or 1) * moe_ep != tp:
        return f"MoE tensor parallelism {moe_tp} times expert parallelism {moe_ep} differing from TP {tp}"
    return tp, moe_ep, 1


def silicon_case(row: Mapping, seed: int = 0) -> ServingCase | Skipped:
    """The simulation setup of one silicon_sample row, or why it cannot be replayed."""
    from servesim.models import get_model
    from servesim.workloads import build_workload

    preset = preset_for(str(row["model"]))
    if preset is None:
        return _skip(row, f"no servesim preset for {row['model']} ('servesim models' lists them)")
    quant = "" if pd.isna(row["gemm_quant"]) else str(row["gemm_quant"])
    if quant not in _GEMM_QUANT_DTYPES:
        return _skip(row, f"{quant} weights are not modelled (bf16, fp8 and fp8_block are)")
    layout = _layout(row, get_model(preset).is_moe)
    if isinstance(layout, str):
        return _skip(row, layout)
    unknown = _protocol_unknown(row)
    if unknown:
        return _skip(row, unknown)
    concurrency = _int(row["concurrency"]) or _int(row["batch_size"])
    version = "" if pd.isna(row["backend_version"]) else str(row["backend_version"])
    if not concurrency:
        return _skip(row, "neither concurrency nor batch_size is recorded")
    protocol = protocol_for(str(row["source"]), str(row["model"]), str(row["gpu"]), version)
    isl, osl = int(row["isl"]), int(row["osl"])
    if protocol.length_ratio < 1:
        spec = (f"uniform:{int(isl * protocol.length_ratio)}-{isl}:"
                f"{max(1, int(osl * protocol.length_ratio))}-{osl}")
    else:
        spec = f"fixed:{isl}:{osl}"
    workload = build_workload(spec, concurrency * protocol.requests_per_client, concurrency=concurrency, seed=seed)
    weights = _weight_format(str(row["model"]), quant)
    kv_cache_dtype, prefix_caching = protocol.kv_cache_dtype, protocol.prefix_caching
    max_num_seqs = concurrency if protocol.max_num_seqs_is_concurrency else None
    max_num_batched_tokens = isl * protocol.batched_tokens_per_isl or None
    recv_interval, memory_fraction = None, protocol.memory_fraction
    expert_parallel = protocol.expert_parallel
    if protocol.name == "InferenceX" and str(row["backend"]) == "sglang":
        launch = inferencex_sglang_launch(str(row["model"]), str(row["gpu"]), layout[0], concurrency, version,
                                          weights)
        kv_cache_dtype, prefix_caching = launch.kv_cache_dtype, launch.radix_cache
        max_num_batched_tokens, recv_interval = launch.chunked_prefill_size, launch.recv_interval
        if launch.expert_parallel:
            expert_parallel = True
        if launch.memory_fraction is not None:
            memory_fraction = launch.memory_fraction
    return ServingCase(
        case_id=str(row["id"]), model_id=str(row["model"]), preset=preset, gpu=str(row["gpu"]),
        engine=str(row["backend"]),
        engine_version=version,
        dtype=weights, tp=layout[0], ep={True: layout[0], False: 1, None: layout[1]}[expert_parallel],
        dp=layout[2],
        pp=_int(row["pp"]) or 1,
        isl=isl, osl=osl,
        concurrency=concurrency, workload=workload, measured_ttft_ms=float(row["ttft_ms"]),
        measured_tpot_ms=float(row["tpot_ms"]), source=str(row["source"]), extra={"protocol": protocol.name},
        kv_cache_dtype=kv_cache_dtype, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        async_scheduling=protocol.async_scheduling, prefix_caching=prefix_caching,
        mxfp4_moe_backend=protocol.mxfp4_moe_backend,
        moe_backend=protocol.moe_backend if weights.startswith("fp8") else "auto",
        per_prompt_token_us=protocol.per_prompt_token_us,
        scheduler_recv_interval=recv_interval, memory_fraction=memory_fraction,
        max_cudagraph_capture_size=protocol.max_cudagraph_capture_size,
    )


#: The columns of an InferenceX run's configuration the file records.
_RUN_CONFIG = ("model", "gpu", "backend", "backend_version", "gemm_quant", "moe_quant", "isl", "osl", "concurrency",
               "tp", "moe_tp", "moe_ep")
_MEASURED_AT = re.compile(r"measured=([^;]+)")


def _result(rows: pd.DataFrame) -> pd.Series:
    """A row's measured TTFT and TPOT to 0.01 ms: the precision of the least precise of the file's copies of a run."""
    return rows["ttft_ms"].round(2).astype(str) + "/" + rows["tpot_ms"].round(2).astype(str)


def mixed_runs(rows: pd.DataFrame) -> set[str]:
    """Ids of InferenceX rows the file does not tell apart: a configuration (:data:`_RUN_CONFIG`) measured at one
    time with different results, and the copies of those results that InferenceX's later exports hold
    (measured the same day). InferenceX ran some configurations with and without MTP speculative decoding at once
    (``dsr1-fp8-b200-sglang`` beside ``dsr1-fp8-b200-sglang-mtp``, same image and search space, in
    ``.github/configs/nvidia-master.yaml`` of 2026-03-25), and the file keeps both without the speculative-decoding
    setting; which is which cannot be read from it. Repeated runs measured at different times stay."""
    sources = rows["source"].astype(str)
    keyed = rows.assign(measured=sources.str.extract(_MEASURED_AT, expand=False),
                        day=sources.str.extract(_MEASURED, expand=False), result=_result(rows))
    keyed = keyed[keyed["measured"].notna()]
    config = list(_RUN_CONFIG)
    at_once = keyed.groupby([keyed[c] for c in (*config, "measured")], dropna=False)["result"].transform("nunique")
    ambiguous = keyed.loc[at_once > 1, [*config, "day", "result"]].drop_duplicates()
    copies = keyed.merge(ambiguous, on=[*config, "day", "result"])
    return set(copies["id"].astype(str))


#: InferenceX launches that ran MTP speculative decoding, told apart from its plain runs by their image and layout:
#: (model, GPU, image, TP, EP). ``.github/configs/nvidia-master.yaml`` of 2026-03-21 runs ``qwen3.5-fp8-b200-sglang``
#: on ``lmsysorg/sglang:v0.5.9-cu129-amd64`` at TP 4 EP 4 and TP 8 EP 1 only, and ``qwen3.5-fp8-b200-sglang-mtp``
#: (``spec-decoding: mtp``) on ``lmsysorg/sglang:v0.5.9-cu130`` at TP 4 EP 1. The B300's work-in-progress runs of
#: 2026-04-03 (no configuration of them is public) used the same image and layout, and decode like MTP: 5.3 ms a token
#: at 4 clients against 8.6 ms for the plain 0.5.10 run of that layout, and slower than it from 128 clients.
_MTP_LAUNCHES = frozenset({("Qwen/Qwen3.5-397B-A17B", "B200", "lmsysorg/sglang:v0.5.9-cu130", 4, 1),
                           ("Qwen/Qwen3.5-397B-A17B", "B300", "lmsysorg/sglang:v0.5.9-cu130", 4, 1)})
#: InferenceX launches of the same image and layout as an MTP launch that ran beside them, with the most clients of
#: each (ISL, OSL) their own configuration ran: a row of that image and layout beyond them was the MTP launch's.
#: ``nvidia-master.yaml`` at 12ba0ae07 (2026-03-25) runs ``dsr1-fp8-b200-sglang`` at TP 8 with 4 to 64 clients for
#: 1k/1k and 1k/8k and 4 for 8k/1k, and ``dsr1-fp8-b200-sglang-mtp`` on the same image at TP 8 with 4 to 512 for
#: all three.
_PLAIN_BESIDE_MTP = {("deepseek-ai/DeepSeek-R1", "B200", "lmsysorg/sglang:v0.5.9-cu130", 8, 1):
                     {(1024, 1024): 64, (1024, 8192): 64, (8192, 1024): 4}}
_IMAGE = re.compile(r"image=([^;]+)")


def mtp_runs(rows: pd.DataFrame) -> set[str]:
    """Ids of rows measured with MTP speculative decoding (:data:`_MTP_LAUNCHES`, and the runs beyond the plain
    configurations of :data:`_PLAIN_BESIDE_MTP`), which servesim does not model, and of the copies of their results
    (the same configuration and result) in exports that do not name the image."""
    launch = pd.Series(list(zip(rows["model"], rows["gpu"], rows["source"].astype(str).str.extract(_IMAGE)[0],
                                rows["tp"], rows["moe_ep"].fillna(1))), index=rows.index)
    beyond_plain = pd.Series([key in _PLAIN_BESIDE_MTP and clients > _PLAIN_BESIDE_MTP[key].get((isl, osl), 0)
                              for key, isl, osl, clients in zip(launch, rows["isl"], rows["osl"],
                                                                rows["concurrency"])], index=rows.index)
    keyed = rows.assign(result=_result(rows))
    config = [*_RUN_CONFIG, "result"]
    mtp = keyed.loc[launch.isin(_MTP_LAUNCHES) | beyond_plain, config].drop_duplicates()
    return set(keyed.merge(mtp, on=config)["id"].astype(str))


#: Why the rows of :func:`mixed_runs` and :func:`mtp_runs` are not replayed.
_MIXED_REASON = ("another run of the same configuration at the same time differs (InferenceX ran some with and without "
                 "MTP speculative decoding, which the file does not record)")
_MTP_REASON = ("measured with MTP speculative decoding (its InferenceX launch's image and layout), which servesim does "
               "not model")


def unreplayable_runs(rows: pd.DataFrame) -> dict[str, str]:
    """Ids of the rows among ``rows`` whose run cannot be reconstructed from the others (:func:`mixed_runs`,
    :func:`mtp_runs`), with the reason."""
    return {**dict.fromkeys(mtp_runs(rows), _MTP_REASON), **dict.fromkeys(mixed_runs(rows), _MIXED_REASON)}


@functools.cache
def _file_unreplayable_runs() -> Mapping[str, str]:
    """:func:`unreplayable_runs` over every aggregated row of the file."""
    return MappingProxyType(unreplayable_runs(load_silicon_rows()))


def silicon_cases(rows: pd.DataFrame, seed: int = 0,
                  among: pd.DataFrame | None = None) -> tuple[list[ServingCase], list[Skipped]]:
    """Cases of the rows that can be replayed, and the others with their reasons. Runs the file does not tell apart
    are found among ``among`` (every aggregated row of the file by default), whatever the selection: a row chosen
    alone is skipped as it is in the whole file."""
    unreplayable = _file_unreplayable_runs() if among is None else unreplayable_runs(among)
    cases, skipped = [], []
    for row in rows.to_dict("records"):
        reason = unreplayable.get(str(row["id"]))
        outcome = _skip(row, reason) if reason else silicon_case(row, seed)
        (skipped if isinstance(outcome, Skipped) else cases).append(outcome)
    return cases, skipped
