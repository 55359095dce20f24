"""Gemma 2 (Gemma2ForCausalLM: 2B, 9B), from HF folders and from llama.cpp's ``gemma2`` GGUFs.

Gemma 3's network (``models/gemma3``: sandwich norms, GeGLU, the scaled embedding,
``query_pre_attn_scalar``) without q/k norm, with one RoPE base for every layer, sliding-window
layers alternating with global ones, and two soft-caps, each ``cap * tanh(x / cap)``:

* on the attention scores (``attn_logit_softcapping``, 50): TVM 0.27's paged-KV attention kernels
  have no soft-cap, so the compiler swaps in Lantern's own kernels with it
  (``emulated.custom_attention``) on every target, the CPU library included;
* on the final logits (``final_logit_softcapping``, 30), in the model's head.

As for Gemma 3, the local layers' window (4096 on Gemma 2) is kept by the same kernels.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from lantern.models import gemma3
from lantern.models.family import Family, GGUFLayout
from lantern.models.gemma3.model import Gemma3Config, Gemma3ForCausalLM

PATTERN = 2  # transformers' and llama.cpp's default: every other layer attends globally


@dataclasses.dataclass
class Gemma2Config(Gemma3Config):
    final_softcap: float = 0.0  # on the logits, 0 for none

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "Gemma2Config":
        caps = {key: float(cfg.get(key) or 0.0) for key in ("attn_logit_softcapping", "final_logit_softcapping")}
        base = Gemma3Config.from_hf({"sliding_window_pattern": PATTERN, **{k: v for k, v in cfg.items() if k not in caps}})
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(Gemma3Config)}
        return cls(
            **{
                **fields,
                "qk_norm": False,
                "rope_local_theta": base.rope_theta,  # one base for every layer
                "attention_softcap": caps["attn_logit_softcapping"],
            },
            final_softcap=caps["final_logit_softcapping"],
        )


class Gemma2ForCausalLM(Gemma3ForCausalLM):
    """Gemma 3's decoder (its attention skips the q/k norms this config lacks), logits soft-capped."""

    cfg: Gemma2Config

    def _logits(self, hidden: nn.Tensor) -> nn.Tensor:
        logits = super()._logits(hidden)
        cap = self.cfg.final_softcap
        return op.tanh(logits / cap) * cap if cap else logits


def gguf_metadata(cfg: Gemma2Config) -> dict:
    meta = gemma3.gguf_metadata_of(cfg, "gemma2")
    if cfg.attention_softcap:
        meta["gemma2.attn_logit_softcapping"] = float(cfg.attention_softcap)
    if cfg.final_softcap:
        meta["gemma2.final_logit_softcapping"] = float(cfg.final_softcap)
    return meta


def config_from_gguf(meta: dict, tensors) -> dict:
    """Gemma 3's reading under llama.cpp's gemma2 keys; a file without a window has llama.cpp's 4096,
    and llama.cpp reads both caps as optional keys (an absent one is off)."""
    cfg = gemma3.config_from_gguf(meta, tensors, "gemma2", PATTERN)
    cfg.setdefault("sliding_window", 4096)
    cfg.update(
        architectures=["Gemma2ForCausalLM"],
        model_type="gemma2",
        attn_logit_softcapping=meta.get("gemma2.attn_logit_softcapping"),
        final_logit_softcapping=meta.get("gemma2.final_logit_softcapping"),
    )
    return cfg


GGUF = GGUFLayout(
    architecture="gemma2",
    tensors=gemma3.gguf_tensors,
    metadata=gguf_metadata,
    unsupported=lambda cfg: gemma3.gguf_unsupported(cfg, "gemma2"),
    config_from_metadata=config_from_gguf,
    names_from_gguf=lambda tensors, cfg: gemma3.names_from_gguf(tensors, cfg, "gemma2"),
    windows=True,
)

FAMILY = Family(
    name="gemma2",
    architectures=("Gemma2ForCausalLM",),
    config=Gemma2Config,
    model=Gemma2ForCausalLM,
    to_lantern=gemma3.to_lantern,
    gguf=GGUF,
    calibration_forward=gemma3.calibration_forward,
)
