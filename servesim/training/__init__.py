"""The lab side of servesim: training the kernel-time MLP, reading its measured datasets into samples, the
baselines it is compared with, and fitting the communication model's forests.

Nothing the planner imports at run time imports this package (tests/test_layering.py): it needs the ``train``
extra (torch, scikit-learn, pyarrow, aiconfigurator-core), and the runtime reads only what it writes (the
weights under ``servesim/estimator/weights`` and ``servesim/comm/comm_forests.npz``).
"""
