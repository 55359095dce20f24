"""Qwen2 / Qwen2.5: the Llama-shaped decoder with biases on q, k and v (tied or untied head).

Only the config reading is Qwen2's own; the network, the loader and the calibration pass are the
Llama folder's with ``attention_bias`` on. llama.cpp calls the architecture ``qwen2`` and, unlike
``llama``, stores q/k rows unpermuted.
"""

from __future__ import annotations

from typing import Any

from lantern.models.llama import decoder_family
from lantern.models.llama.model import LlamaConfig, decoder_fields


class Qwen2Config(LlamaConfig):
    """Qwen2 configs always carry a ``sliding_window`` size; only ``use_sliding_window`` turns it on,
    for the layers from ``max_window_layers`` on (``decoder_fields``)."""

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "Qwen2Config":
        return cls(**decoder_fields(cfg), attention_bias=True)


FAMILY = decoder_family("qwen2", ("Qwen2ForCausalLM",), Qwen2Config, "qwen2", rope_permuted=False)
