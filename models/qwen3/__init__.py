"""Qwen3 (dense): the Llama-shaped decoder with an RMSNorm over every head of q and k before RoPE,
a ``head_dim`` of its own (not hidden / heads), and optional q/k/v biases.

Only the config reading is Qwen3's own; the network, the loader and the calibration pass are the
Llama folder's with ``qk_norm`` on. llama.cpp calls the architecture ``qwen3`` (q/k rows unpermuted).
``EMBEDDING`` is Qwen3-Embedding, the same decoder pooled (``llama/embedder.py``).
"""

from __future__ import annotations

from typing import Any

from lantern.models.embedding import GGUF_POOLING, embedding_gguf
from lantern.models.family import Family
from lantern.models.llama import decoder_family, to_lantern
from lantern.models.llama.embedder import embedder_gguf_tensors, embedder_of, embedder_to_lantern, embedding_config
from lantern.models.llama.loader import gguf_metadata, gguf_tensors, gguf_unsupported
from lantern.models.llama.model import LlamaConfig, LlamaForCausalLM, decoder_fields


class Qwen3Config(LlamaConfig):
    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "Qwen3Config":
        return cls(**decoder_fields(cfg), attention_bias=bool(cfg.get("attention_bias", False)), qk_norm=True)


FAMILY = decoder_family("qwen3", ("Qwen3ForCausalLM",), Qwen3Config, "qwen3", rope_permuted=False)


# --------------------------------------------------------------------------- Qwen3-Embedding

Qwen3EmbeddingConfig = embedding_config(Qwen3Config)


def _embedding_metadata(cfg) -> dict:
    return {**gguf_metadata(cfg, "qwen3"), "qwen3.pooling_type": GGUF_POOLING[cfg.pooling]}


def _unsupported(cfg) -> str | None:
    return "llama.cpp's qwen3 runs no Dense layers after the pooling" if cfg.dense else gguf_unsupported(cfg, "qwen3")


# Qwen3-Embedding (config.json says Qwen3ForCausalLM; its weights are a Qwen3Model's): the decoder with
# causal attention, pooled on the last token. llama.cpp runs it as `qwen3` with a pooling type.
EMBEDDING = Family(
    name="qwen3-embedding",
    architectures=("Qwen3ForCausalLM", "Qwen3Model"),
    config=Qwen3EmbeddingConfig,
    model=embedder_of(LlamaForCausalLM),
    to_lantern=embedder_to_lantern(to_lantern),
    gguf=embedding_gguf(
        "qwen3", embedder_gguf_tensors(lambda cfg: gguf_tensors(cfg, rope_permuted=False)), _embedding_metadata, _unsupported
    ),
    kind="embedding",
)
