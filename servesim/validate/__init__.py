"""End-to-end validation: replay measured serving runs and kernel timings through servesim and compare.

- ``silicon``: aiconfigurator-core's measured vLLM/SGLang runs (silicon_sample.csv) replayed by the simulator;
- ``ops``: Vidur's measured per-layer operator times against the kernel estimators;
- ``results``: a user's own ``vllm bench serve`` / GuideLLM result files;
- ``calibration``: fitting the host-overhead constants (``servesim.serving.overhead``) on a training subset;
- ``report``: MAPE tables, bias by concurrency and the predicted-vs-measured scatter plot.

docs/validation.md gives the commands and their output.
"""
