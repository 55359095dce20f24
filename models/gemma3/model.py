"""The Gemma 3 text decoder in relax nn (Gemma3ForCausalLM: 270M, 1B), and its config.json reading.

What differs from the Llama-shaped decoder, and where it lives here:

* sandwich norms: each block normalizes its input and its output, around attention and the MLP;
* GeGLU: ``gelu_tanh(gate) * up``;
* the embedding is scaled by sqrt(hidden) on the way in (not on the tied output head);
* attention scores are scaled by ``query_pre_attn_scalar ** -0.5``, not ``head_dim ** -0.5``;
* per-head q/k RMSNorm (as Qwen3);
* two RoPE bases: sliding-window layers rotate with ``rope_local_theta``, full-attention layers with
  ``rope_theta`` (and its linear scaling). TVM's KV cache applies one base to every layer, so this
  model rotates q and k itself (``rope``) and creates the cache with ``RopeMode.NONE``.

Gemma's (1 + w) RMSNorm is folded into the weights by the loader: the norms here are plain RMSNorm.
The 5:1 local/global pattern (``sliding_layers``) picks each layer's RoPE base and, where the context
is longer than the window, which layers attend within it (``LlamaConfig.windowed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache, RopeMode

from lantern.errors import LanternError
from lantern.models.llama.model import LlamaConfig, LlamaForCausalLM, decoder_fields
from lantern.models.llama.model import sliding_layers
from lantern.models.llama.rope import rope
from lantern.quantize import QuantSpec, make_embedding, make_linear


PATTERN = 6  # transformers' and llama.cpp's default: every sixth layer attends globally


@dataclass
class Gemma3Config(LlamaConfig):
    query_pre_attn_scalar: float = 256.0
    rope_local_theta: float = 10000.0

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "Gemma3Config":
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        if act != "gelu_pytorch_tanh":
            raise LanternError(f"config.json field 'hidden_activation': '{act}' is not Gemma 3's (gelu_pytorch_tanh)")
        for key in ("use_bidirectional_attention", "attention_bias"):
            if cfg.get(key):
                raise LanternError(f"config.json field '{key}': not supported for Gemma 3")
        rope = cfg.get("rope_parameters") or {}
        if "full_attention" in rope:  # transformers >= 5: one RoPE entry per layer type
            full, local = dict(rope["full_attention"]), dict(rope.get("sliding_attention") or {})
            if local.get("rope_type", "default") != "default":
                raise LanternError(
                    f"config.json field 'rope_parameters': unsupported rope_type "
                    f"'{local['rope_type']}' on the sliding-window layers (supported: default)"
                )
            local_theta = local.get("rope_theta", 10000.0)
        else:  # older configs: rope_theta and rope_scaling for the global layers, rope_local_base_freq
            full = dict(rope or cfg.get("rope_scaling") or {})
            full.setdefault("rope_theta", cfg.get("rope_theta", 1_000_000.0))
            local_theta = cfg.get("rope_local_base_freq", 10000.0)
        common = {
            k: v
            for k, v in cfg.items()
            if k not in ("rope_parameters", "rope_scaling", "rope_theta", "hidden_act", "hidden_activation")
        }
        fields = decoder_fields({"tie_word_embeddings": True, **common, "rope_parameters": full})
        if fields["rope_scaling"].get("rope_type") not in (None, "linear"):
            raise LanternError(
                f"config.json field 'rope_parameters': unsupported rope_type "
                f"'{fields['rope_scaling']['rope_type']}' for Gemma 3 (supported: default, linear)"
            )
        # the local/global pattern picks each layer's RoPE base, so it is read even without a window
        pattern = int(cfg.get("sliding_window_pattern", PATTERN))
        fields["sliding_layers"] = sliding_layers(
            {**cfg, "sliding_window": cfg.get("sliding_window") or 1},
            ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(cfg["num_hidden_layers"])],
        )
        return cls(
            **fields,
            qk_norm=True,
            query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar", 256)),
            rope_local_theta=float(local_theta),
        )

    def layer_rope(self, layer: int) -> tuple[float, float]:
        """(theta, linear position scale) of one layer's RoPE: local layers are never scaled."""
        if self.sliding_layers[layer]:
            return self.rope_local_theta, 1.0
        factor = float(self.rope_scaling.get("factor", 1.0)) if self.rope_scaling else 1.0
        return self.rope_theta, factor


class Gemma3Attention(nn.Module):
    def __init__(self, cfg: Gemma3Config, spec: QuantSpec, layer: int):
        self.num_q_heads, self.num_kv_heads, self.head_dim = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.qkv_proj = make_linear(cfg.hidden_size, (self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim, spec)
        self.o_proj = make_linear(self.num_q_heads * self.head_dim, cfg.hidden_size, spec)
        self.qk_norm = cfg.qk_norm  # Gemma 3's; Gemma 2 (models/gemma2) has none
        if self.qk_norm:
            self.q_norm = nn.RMSNorm(cfg.head_dim, -1, cfg.rms_norm_eps, bias=False, dtype=spec.model_dtype)
            self.k_norm = nn.RMSNorm(cfg.head_dim, -1, cfg.rms_norm_eps, bias=False, dtype=spec.model_dtype)
        self.rope_theta, self.rope_scale = cfg.layer_rope(layer)
        self.sm_scale = cfg.sm_scale(layer, cfg.query_pre_attn_scalar**-0.5)  # negative: a windowed layer

    def forward(self, x: nn.Tensor, kv_cache: PagedKVCache, layer_id: int, positions: nn.Tensor) -> nn.Tensor:
        b, s, _ = x.shape
        qkv = op.reshape(self.qkv_proj(x), (b, s, self.num_q_heads + 2 * self.num_kv_heads, self.head_dim))
        q, k, v = op.split(qkv, [self.num_q_heads, self.num_q_heads + self.num_kv_heads], axis=2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = rope(q, positions, self.rope_theta, self.rope_scale)
        k = rope(k, positions, self.rope_theta, self.rope_scale)
        out = kv_cache.attention_with_fused_qkv(layer_id, op.concat([q, k, v], dim=2), self.num_q_heads, sm_scale=self.sm_scale)
        return self.o_proj(op.reshape(out, (b, s, self.num_q_heads * self.head_dim)))


class Gemma3MLP(nn.Module):
    def __init__(self, cfg: Gemma3Config, spec: QuantSpec):
        self.gate_up_proj = make_linear(cfg.hidden_size, 2 * cfg.intermediate_size, spec)
        self.down_proj = make_linear(cfg.intermediate_size, cfg.hidden_size, spec)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        gate, up = op.split(self.gate_up_proj(x), 2, axis=-1)
        return self.down_proj(op.gelu(gate, approximate="tanh") * up)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: Gemma3Config, spec: QuantSpec, layer: int):
        def norm():
            return nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=spec.model_dtype)

        self.self_attn = Gemma3Attention(cfg, spec, layer)
        self.mlp = Gemma3MLP(cfg, spec)
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()

    def forward(self, x: nn.Tensor, kv_cache: PagedKVCache, layer_id: int, positions: nn.Tensor) -> nn.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), kv_cache, layer_id, positions))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma3Model(nn.Module):
    def __init__(self, cfg: Gemma3Config, spec: QuantSpec):
        self.embed_tokens = make_embedding(cfg.vocab_size, cfg.hidden_size, spec)
        self.layers = nn.ModuleList([Gemma3DecoderLayer(cfg, spec, i) for i in range(cfg.num_hidden_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=spec.model_dtype)

    def forward(self, x: nn.Tensor, kv_cache: PagedKVCache) -> nn.Tensor:
        b, s, _ = x.shape
        positions = kv_cache.get_query_positions(b * s)
        for i, layer in enumerate(self.layers):
            x = layer(x, kv_cache, i, positions)
        return self.norm(x)


class Gemma3ForCausalLM(LlamaForCausalLM):
    """MLC's model-library contract, as the Llama decoder exports it; the KV cache leaves RoPE to
    the model (two bases)."""

    rope_mode = RopeMode.NONE
    backbone = Gemma3Model

    def embed(self, input_ids: nn.Tensor) -> nn.Tensor:
        return self.model.embed_tokens(input_ids) * (self.cfg.hidden_size**0.5)
