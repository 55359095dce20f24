"""Qwen3 (dense): the Llama-shaped decoder with an RMSNorm over every head of q and k before RoPE,
a ``head_dim`` of its own (not hidden / heads), and optional q/k/v biases.

Only the config reading is Qwen3's own; the network, the loader and the calibration pass are the
Llama folder's with ``qk_norm`` on. llama.cpp calls the architecture ``qwen3`` (q/k rows unpermuted).
"""

from __future__ import annotations

from typing import Any

from lantern.models.llama import decoder_family
from lantern.models.llama.model import LlamaConfig, decoder_fields


class Qwen3Config(LlamaConfig):
    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "Qwen3Config":
        return cls(**decoder_fields(cfg), attention_bias=bool(cfg.get("attention_bias", False)), qk_norm=True)


FAMILY = decoder_family("qwen3", ("Qwen3ForCausalLM",), Qwen3Config, "qwen3", rope_permuted=False)
