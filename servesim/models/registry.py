"""Finding a model: a built-in preset, a local ``config.json``, or a Hugging Face hub id."""

from __future__ import annotations

import functools
import json
import os
from importlib import resources
from pathlib import Path

from servesim.errors import ServesimError, not_utf8, suggest
from servesim.models.config import ModelConfig, config_from_hf_dict


@functools.cache
def _preset_files() -> dict[str, str]:
    folder = resources.files("servesim.models").joinpath("presets")
    return {
        entry.name.removesuffix(".json"): entry.read_text(encoding="utf-8")
        for entry in folder.iterdir()
        if entry.name.endswith(".json")
    }


def preset_names() -> list[str]:
    return sorted(_preset_files())


def preset_record(name: str) -> dict:
    """The preset's JSON: ``{"hf_id": ..., "config": {<config.json keys>}}``."""
    return json.loads(_preset_files()[name])


@functools.cache
def _presets_by_hf_id() -> dict[str, str]:
    return {preset_record(name)["hf_id"]: name for name in preset_names()}


def preset_for_hf_id(hf_id: str) -> str | None:
    """The preset whose own checkpoint is the Hugging Face id ``hf_id`` (as ``servesim models`` spells it), or
    None."""
    return _presets_by_hf_id().get(hf_id)


@functools.cache
def load_preset(name: str) -> ModelConfig:
    record = preset_record(name)
    return config_from_hf_dict(record["config"], name=name, source=record["hf_id"])


#: Seconds to wait for a connection to the hub before treating it as unreachable.
HUB_TIMEOUT_S = 2.0


def _hub_host() -> str:
    """The host hub ids are fetched from (``HF_ENDPOINT`` when set)."""
    from urllib.parse import urlsplit

    return urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"


def _offline_reason() -> str | None:
    """Why a hub id can only come from the local cache (``HF_HUB_OFFLINE`` set, or the hub unreachable), or None
    when the hub answers."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    return None if _hub_reachable() else f"{_hub_host()} cannot be reached"


def _hub_reachable(timeout_s: float = HUB_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub opens within ``timeout_s`` (name lookup included). Without it, loading
    a hub id would retry for half a minute before failing."""
    import socket
    import threading
    from urllib.parse import urlsplit

    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    opened: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            opened.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=connect, daemon=True)  # a name lookup ignores the socket timeout
    thread.start()
    thread.join(timeout_s)
    return bool(opened)


def _load_with_autoconfig(ref: str) -> ModelConfig:
    """Load a local directory / config.json or a hub id through ``transformers.AutoConfig``."""
    path = Path(ref)
    if path.name.endswith(".json"):
        if not path.is_file():
            raise ServesimError(f"model config file {ref} does not exist; give a preset ('servesim models'), a "
                                f"config.json that exists or a Hugging Face hub id (org/name)")
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ServesimError(not_utf8(ref)) from None
        except json.JSONDecodeError as exc:
            raise ServesimError(f"{ref} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(cfg, dict):
            raise ServesimError(f"{ref} holds a JSON {type(cfg).__name__}, not a model config (a JSON object)")
        # A checkpoint's config.json is named after its folder; a file named otherwise (aiconfigurator-core's
        # model_configs/<org>--<model>_config.json) after itself.
        name = (path.parent.name if path.name == "config.json"
                else path.name.removesuffix(".json").removesuffix("_config"))
        return config_from_hf_dict(cfg, name=name or ref, source=ref)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from transformers import AutoConfig
    except ImportError:  # pragma: no cover - transformers is a runtime dependency
        raise ServesimError("loading a config by hub id needs transformers: pip install transformers") from None
    offline = None if path.is_dir() else _offline_reason()
    try:
        hf_config = AutoConfig.from_pretrained(ref, local_files_only=offline is not None)
    except Exception as exc:  # transformers raises OSError, ValueError, HTTP errors...
        if offline is not None:
            raise ServesimError(
                f"cannot load model config from hub id {ref!r}: {offline} and the config is not in the local "
                f"Hugging Face cache; pass a local path to its config.json, or use a preset ('servesim models')"
            ) from None
        where = "directory" if path.is_dir() else "hub id"
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ServesimError(
            f"cannot load model config from {where} {ref!r} ({reason}); without network access use a preset "
            f"('servesim models') or a local path to a config.json"
        ) from None
    cfg = hf_config.to_dict()
    text_config = cfg.get("text_config")
    if isinstance(text_config, dict) and "hidden_size" not in cfg:
        cfg = {**text_config, "model_type": text_config.get("model_type", cfg.get("model_type"))}
    return config_from_hf_dict(cfg, name=path.name if path.is_dir() else ref, source=ref)


def get_model(ref: str) -> ModelConfig:
    """Resolve ``ref``: a preset name (case-insensitive), else a local path, else a hub id ('org/name')."""
    key = ref.strip().lower()
    if key in _preset_files():
        return load_preset(key)
    own_checkpoint = preset_for_hf_id(ref.strip())
    if own_checkpoint is not None and not Path(ref).exists():  # no download needed
        return load_preset(own_checkpoint)
    if Path(ref).exists() or "/" in ref:
        return _load_with_autoconfig(ref)
    raise ServesimError(
        f"unknown model {ref!r}.{suggest(ref, preset_names())} Run 'servesim models' for the presets, "
        f"or pass a path to a config.json or a Hugging Face hub id (org/name)."
    )
