"""Capacity planning: per-GPU estimates, SLO capacity search, replicas, cost and ranking."""
