"""servesim: a capacity planner for LLM serving that predicts from GPU specification sheets."""

__version__ = "0.1.0"
