"""Bounds on what a user may ask for, each with its reason, so that an impossible request is refused with a message
instead of overflowing an integer or exhausting memory."""

from __future__ import annotations

#: Token counts and tensor dimensions: vLLM's and SGLang's kernels and attention metadata index with 32-bit ints.
MAX_TOKENS = 2**31 - 1

#: The most tasks one kernel launch is decomposed into. Each task costs a few hundred bytes of arrays while it is
#: scheduled, so this bounds a launch at about a gigabyte. Serving steps stay far below it: a 1M-token GEMM against a
#: 57,344-wide weight is 1.75M tiles of 128x256. Every request of a step is at least one CTA of each row-wise kernel
#: (RMSNorm, SiLU-and-mul), so this also bounds the requests of one step.
MAX_TASKS_PER_LAUNCH = 2**22

#: Requests to simulate or generate at once. A simulation keeps a few kilobytes per request in flight, so ten million
#: would not fit the memory of a laptop; a million simulate in about a minute.
MAX_REQUESTS = 1_000_000

#: Engine replicas one simulation runs, each with its own scheduler and KV-cache state (about 1.5 kB): far more
#: than any deployment, and a billion would need terabytes.
MAX_REPLICAS = 100_000

#: The largest coefficient of variation a synthetic gap or length distribution takes. Above it, a gamma's shape
#: (1 / cv²) is under 0.01 and most gaps underflow to exactly 0, so a run's measured rate is off by orders of
#: magnitude; and a log-normal whose std is ten times its mean already spreads lengths over five decades.
MAX_CV = 10.0

#: Nodes one modelled collective spans. The communication forests learnt from groups of at most 16 GPUs over at most
#: two nodes, and the engines' TP groups stay within a node (``servesim plan`` keeps TP × PP within one); beyond two
#: nodes the prediction is extrapolation that can even fall with more GPUs (64 H100s came out faster than 16).
MAX_COLLECTIVE_NODES = 2

#: The latest arrival a workload may have, in seconds (about 32 years). Later times mean a unit mistake (nanoseconds
#: read as seconds) or a rate near zero; simulated clocks that large lose the sub-millisecond resolution of a step.
MAX_ARRIVAL_S = 1e9
