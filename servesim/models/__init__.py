"""LLM architecture configs: presets, Hugging Face config.json loading, and memory accounting."""

from servesim.models.config import SUPPORTED_MODEL_TYPES, ModelConfig, config_from_hf_dict
from servesim.models.registry import get_model, load_preset, preset_names

__all__ = ["ModelConfig", "SUPPORTED_MODEL_TYPES", "config_from_hf_dict", "get_model", "load_preset", "preset_names"]
