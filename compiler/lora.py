"""Merge a PEFT LoRA adapter into base weights at build time (``W += scale * B @ A``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from .errors import LanternError
from .importer import read_safetensors
from .tensors import Tensors

_PREFIX = "base_model.model."


def adapter_hash(folder: Path) -> str:
    h = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        h.update((folder / name).read_bytes())
    return h.hexdigest()


def read_adapter(folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    cfg_path, weights_path = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    for p in (cfg_path, weights_path):
        if not p.exists():
            raise LanternError(f"missing LoRA file: {p}")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as err:
        raise LanternError(f"adapter_config.json is not valid JSON: {err}") from None
    if cfg.get("peft_type", "LORA") != "LORA":
        raise LanternError(f"unsupported adapter type '{cfg.get('peft_type')}' (only LORA)")
    if cfg.get("fan_in_fan_out"):
        raise LanternError("LoRA adapters with fan_in_fan_out=true are not supported")
    return cfg, read_safetensors(weights_path)


def merge_lora(weights: Tensors, folder: Path) -> Tensors:
    """Return ``weights`` with the adapter merged into each matrix it adapts when that matrix is
    made; raise now if the adapter does not fit the base."""
    cfg, tensors = read_adapter(folder)
    r, alpha = cfg["r"], cfg.get("lora_alpha", cfg["r"])
    scale = alpha / np.sqrt(r) if cfg.get("use_rslora") else alpha / r
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for name, t in tensors.items():
        stem = name[len(_PREFIX) :] if name.startswith(_PREFIX) else name
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in stem:
                module = stem.split(marker)[0]
                pairs.setdefault(module, {})[part] = t
                break
        else:
            raise LanternError(f"LoRA tensor '{name}' is not a lora_A/lora_B weight")
    if not pairs:
        raise LanternError(f"LoRA adapter in {folder} holds no lora_A/lora_B weights")
    weights = Tensors.of(weights)
    merged = {}
    for module, ab in sorted(pairs.items()):
        base_name = f"{module}.weight"
        if base_name not in weights:
            raise LanternError(f"LoRA does not match its base: the base has no weight '{base_name}'")
        if "lora_A" not in ab or "lora_B" not in ab:
            raise LanternError(f"LoRA does not match its base: '{module}' lacks lora_A or lora_B")
        a, b, shape = ab["lora_A"], ab["lora_B"], weights.shape(base_name)
        if a.shape[1] != shape[1] or b.shape[0] != shape[0] or a.shape[0] != b.shape[1]:
            raise LanternError(
                f"LoRA does not match its base: '{module}' has A{list(a.shape)} B{list(b.shape)} "
                f"for a base weight of shape {list(shape)}"
            )
        merged[base_name] = lambda load=weights.loader(base_name), a=a, b=b: (  # noqa: B008 (bound now, on purpose)
            load().astype(np.float64) + scale * (b.astype(np.float64) @ a.astype(np.float64))
        ).astype(np.float32)
    return weights.replaced(merged)
