"""Readers of measured datasets (aiconfigurator-core tables, Vidur CSVs) into tidy pandas frames.

Lab code like :mod:`servesim.training` and :mod:`servesim.collect`: training, the collector, the tools and
``servesim validate`` (inside its commands) read them; the planner never imports them (tests/test_layering.py).
"""
