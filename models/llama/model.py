"""The Llama-shaped decoder in relax nn: Llama 1-3 and SmolLM2, and with one switch each Qwen2 and Qwen3.

This file is the architecture and nothing else: checkpoint names live in
``loader.py``, weight layouts in ``lantern.compiler.quantize``. Attention and
RoPE run inside TVM's paged KV cache (``nn.llm``), as in MLC LLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tvm import relax as rx
from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache, RopeMode, TIRPagedKVCache
from tvm.target import Target

from lantern.errors import LanternError
from lantern.quantize import QuantSpec, make_embedding, make_linear

from .rope import model_rotation, resolve_longrope, resolve_yarn, rope


# config.json fields that change the architecture in ways no family here implements: refused by name
# rather than compiled into a silently different model.
UNSUPPORTED_FIELDS = {
    "num_local_experts": "mixture-of-experts layers",
    "num_experts": "mixture-of-experts layers",
    "vision_config": "a vision tower",
    "audio_config": "an audio tower",
    "attn_logit_softcapping": "attention-logit soft-capping",
    "final_logit_softcapping": "final-logit soft-capping",
}


def sliding_window(cfg: dict[str, Any]) -> int | None:
    """The attention window a config turns on (Mistral 7B v0.1: 4096, Phi-3 4k: 2047), or None. Qwen
    configs carry a size that ``use_sliding_window: false`` leaves off."""
    size = cfg.get("sliding_window")
    if not size or cfg.get("use_sliding_window") is False:
        return None
    if cfg.get("layer_types") is not None and "sliding_attention" not in cfg["layer_types"]:
        return None
    return int(size)


def sliding_layers(cfg: dict[str, Any], default: list[str] | None = None) -> tuple[bool, ...]:
    """Per layer, whether it attends within the window: config.json's ``layer_types`` (transformers
    >= 4.5x writes them), else ``default``, else Qwen's ``max_window_layers`` (layers from that one on
    are windowed), else every layer when the config has a window (Mistral, Phi-3)."""
    n = cfg["num_hidden_layers"]
    if sliding_window(cfg) is None:
        return (False,) * n
    kinds = cfg.get("layer_types") or default
    if kinds is None:
        first = cfg.get("max_window_layers", 0) if cfg.get("use_sliding_window") else 0
        return tuple(i >= first for i in range(n))
    if len(kinds) != n or set(kinds) - {"full_attention", "sliding_attention"}:
        raise LanternError(
            f"config.json field 'layer_types': expected {n} entries of 'full_attention'/'sliding_attention', got {kinds}"
        )
    return tuple(t == "sliding_attention" for t in kinds)


def decoder_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The fields every Llama-shaped decoder reads from config.json (HF names and defaults)."""
    for key, what in UNSUPPORTED_FIELDS.items():
        if cfg.get(key):
            raise LanternError(
                f"config.json field '{key}' asks for {what}, which the "
                f"{cfg.get('model_type', '?')} family here does not implement"
            )
    heads = cfg["num_attention_heads"]
    # transformers >= 5 writes `rope_parameters` (theta inside); older configs `rope_scaling`
    rope_scaling = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    rope_theta = float(rope_scaling.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    partial = float(rope_scaling.pop("partial_rotary_factor", None) or cfg.get("partial_rotary_factor") or 1.0)
    if partial != 1.0:
        raise LanternError(
            f"config.json field 'partial_rotary_factor': RoPE on {partial:g} of each head is not supported (only on all of it)"
        )
    if "type" in rope_scaling and "rope_type" not in rope_scaling:
        rope_scaling["rope_type"] = rope_scaling.pop("type")
    if rope_scaling.get("rope_type") == "su":  # longrope's first name (Phi-3 128k configs)
        rope_scaling["rope_type"] = "longrope"
    if rope_scaling.get("rope_type") in ("default", None):
        rope_scaling = {}
    if rope_scaling.get("rope_type") not in (None, "llama3", "yarn", "longrope", "linear"):
        key = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
        raise LanternError(
            f"config.json field '{key}': unsupported rope_type "
            f"'{rope_scaling.get('rope_type')}' (supported: default, linear, llama3, yarn, longrope)"
        )
    if cfg.get("hidden_act", "silu") != "silu":
        raise LanternError(f"config.json field 'hidden_act': '{cfg['hidden_act']}' is not supported here (silu)")
    context = cfg.get("max_position_embeddings", 4096)
    if rope_scaling.get("rope_type") == "longrope":
        key = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
        rope_scaling = resolve_longrope(cfg, rope_scaling, cfg.get("head_dim") or cfg["hidden_size"] // heads, key)
    if rope_scaling.get("rope_type") == "yarn":
        key = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
        rope_scaling = resolve_yarn(cfg, rope_scaling, cfg.get("head_dim") or cfg["hidden_size"] // heads, rope_theta, key)
    return dict(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=rope_theta,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        context_window_size=context,
        rope_scaling=rope_scaling,
        prefill_chunk_size=min(512, context),
        sliding_window=sliding_window(cfg) or 0,
        sliding_layers=sliding_layers(cfg),
    )


@dataclass
class LlamaConfig:
    """A Llama-shaped decoder. Qwen2 (``attention_bias``) and Qwen3 (``qk_norm``) are the same
    network with one switch each; their folders own how a checkpoint sets them."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    context_window_size: int
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    prefill_chunk_size: int = 512
    attention_bias: bool = False  # biases on q, k and v (Qwen2)
    qk_norm: bool = False  # RMSNorm over each head of q and k before RoPE (Qwen3)
    attention_softcap: float = 0.0  # scores soft-capped as cap * tanh(score / cap), 0 for none (Gemma 2)
    sliding_window: int = 0  # keys a windowed layer sees behind each query (itself included), 0 for none
    sliding_layers: tuple[bool, ...] = ()  # per layer: whether it is windowed

    @property
    def windowed(self) -> bool:
        """Whether the window cuts anything: some layer has one, shorter than the context. Then the
        compiler swaps in Lantern's attention kernels (``emulated.custom_attention``), which read a
        negative ``sm_scale`` as "this layer is windowed"."""
        return 0 < self.sliding_window < self.context_window_size and any(self.sliding_layers)

    def layer_window(self, layer: int) -> int:
        """Keys layer ``layer`` sees behind each query, 0 for all (the calibration forwards' mask)."""
        return self.sliding_window if self.sliding_window and self.sliding_layers[layer] else 0

    def sm_scale(self, layer: int, scale: float) -> float:
        """The score scale layer ``layer`` passes the KV cache's attention: negative on a windowed
        layer (see ``windowed``)."""
        return -scale if self.windowed and self.sliding_layers[layer] else scale

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "LlamaConfig":
        if cfg.get("attention_bias") or cfg.get("mlp_bias"):
            field_name = "attention_bias" if cfg.get("attention_bias") else "mlp_bias"
            raise LanternError(f"config.json field '{field_name}': Llama layers with biases are not supported")
        return cls(**decoder_fields(cfg))

    def quantized_weights(self) -> set[str]:
        """Names of the ``*.weight`` matrices that become quantized layers."""
        names = {"model.embed_tokens.weight"}
        if not self.tie_word_embeddings:
            names.add("lm_head.weight")
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}"
            names |= {
                f"{p}.self_attn.qkv_proj.weight",
                f"{p}.self_attn.o_proj.weight",
                f"{p}.mlp.gate_up_proj.weight",
                f"{p}.mlp.down_proj.weight",
            }
        return names


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig, spec: QuantSpec):
        self.num_q_heads, self.num_kv_heads, self.head_dim = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        qkv_out = (self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = make_linear(cfg.hidden_size, qkv_out, spec, bias=cfg.attention_bias)
        self.o_proj = make_linear(self.num_q_heads * self.head_dim, cfg.hidden_size, spec)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(cfg.head_dim, -1, cfg.rms_norm_eps, bias=False, dtype=spec.model_dtype)
            self.k_norm = nn.RMSNorm(cfg.head_dim, -1, cfg.rms_norm_eps, bias=False, dtype=spec.model_dtype)
        # longrope (Phi-3.5; its short or long factors by the build's context) and YaRN: rotated here, the
        # KV cache rotates nothing (create_tir_paged_kv_cache; rope.model_rotation)
        self.rotation = model_rotation(cfg.rope_scaling, cfg.context_window_size, cfg.head_dim)
        self.rope_theta = cfg.rope_theta
        self.cfg = cfg

    def forward(self, x: nn.Tensor, kv_cache: PagedKVCache, layer_id: int) -> nn.Tensor:
        b, s, _ = x.shape
        qkv = op.reshape(self.qkv_proj(x), (b, s, self.num_q_heads + 2 * self.num_kv_heads, self.head_dim))
        if self.qk_norm or self.rotation:  # RoPE runs inside the KV cache, so the norms go before it here
            q, k, v = op.split(qkv, [self.num_q_heads, self.num_q_heads + self.num_kv_heads], axis=2)
            if self.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            if self.rotation:
                factors, magnitude = self.rotation
                positions = kv_cache.get_query_positions(b * s)
                q = rope(q, positions, self.rope_theta, factors=factors, magnitude=magnitude)
                k = rope(k, positions, self.rope_theta, factors=factors, magnitude=magnitude)
            qkv = op.concat([q, k, v], dim=2)
        out = kv_cache.attention_with_fused_qkv(
            layer_id, qkv, self.num_q_heads, sm_scale=self.cfg.sm_scale(layer_id, self.head_dim**-0.5)
        )
        return self.o_proj(op.reshape(out, (b, s, self.num_q_heads * self.head_dim)))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig, spec: QuantSpec):
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = make_linear(cfg.hidden_size, 2 * cfg.intermediate_size, spec)
        self.down_proj = make_linear(cfg.intermediate_size, cfg.hidden_size, spec)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        gate, up = op.split(self.gate_up_proj(x), 2, axis=-1)
        return self.down_proj(op.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, spec: QuantSpec):
        dtype = spec.model_dtype
        self.self_attn = LlamaAttention(cfg, spec)
        self.mlp = LlamaMLP(cfg, spec)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)

    def forward(self, x: nn.Tensor, kv_cache: PagedKVCache, layer_id: int) -> nn.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), kv_cache, layer_id)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig, spec: QuantSpec):
        self.embed_tokens = make_embedding(cfg.vocab_size, cfg.hidden_size, spec)
        self.layers = nn.ModuleList([LlamaDecoderLayer(cfg, spec) for _ in range(cfg.num_hidden_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=spec.model_dtype)

    def forward(self, x: nn.Tensor, kv_cache: PagedKVCache) -> nn.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, kv_cache, i)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    """The exported entry points follow MLC's model-library contract (see ``get_default_spec``)."""

    rope_mode = RopeMode.NORMAL  # the KV cache rotates k before appending it (a subclass may rotate q/k itself)
    backbone: type[nn.Module] = LlamaModel  # the decoder stack (a subclass's own network behind the same entry points)

    def __init__(self, cfg: LlamaConfig, spec: QuantSpec, target: Target):
        self.cfg, self.spec, self.target = cfg, spec, target
        self.model = self.backbone(cfg, spec)
        if not cfg.tie_word_embeddings:
            self.lm_head = make_linear(cfg.hidden_size, cfg.vocab_size, spec)

    def _logits(self, hidden: nn.Tensor) -> nn.Tensor:
        if self.cfg.tie_word_embeddings:
            logits = self.model.embed_tokens.lm_head_forward(hidden)
        else:
            logits = self.lm_head(hidden)
        return logits.astype("float32") if logits.dtype != "float32" else logits

    def embed(self, input_ids: nn.Tensor) -> nn.Tensor:
        return self.model.embed_tokens(input_ids)

    def prefill(self, input_embed: nn.Tensor, kv_cache: PagedKVCache):
        hidden = self.model(input_embed, kv_cache)

        def last_position(x: te.Tensor) -> te.Tensor:
            b, s, d = x.shape
            return te.compute((b, 1, d), lambda i, _, k: x[i, s - 1, k], name="last_position")

        return self._logits(op.tensor_expr_op(last_position, "last_position", [hidden])), kv_cache

    def decode(self, input_embed: nn.Tensor, kv_cache: PagedKVCache):
        return self._logits(self.model(input_embed, kv_cache)), kv_cache

    def batch_prefill(self, input_embeds: nn.Tensor, logit_positions: nn.Tensor, kv_cache: PagedKVCache):
        hidden = self.model(input_embeds, kv_cache)
        hidden = op.take(hidden, logit_positions, axis=1)
        return self._logits(hidden), kv_cache

    def batch_decode(self, input_embeds: nn.Tensor, kv_cache: PagedKVCache):
        return self._logits(self.model(input_embeds, kv_cache)), kv_cache

    def batch_verify(self, input_embeds: nn.Tensor, kv_cache: PagedKVCache):
        return self._logits(self.model(input_embeds, kv_cache)), kv_cache

    def create_tir_paged_kv_cache(
        self,
        max_batch_size: tirx.Var,
        max_total_seq_len: tirx.Var,
        prefill_chunk_size: tirx.Var,
        page_size: tirx.Var,
        support_sliding_window: tirx.Var,
    ) -> PagedKVCache:
        cfg = self.cfg
        rotated = model_rotation(cfg.rope_scaling, cfg.context_window_size, cfg.head_dim)  # in LlamaAttention
        rope_scaling = {} if rotated else dict(cfg.rope_scaling)
        return TIRPagedKVCache(
            attn_kind="mha",
            max_batch_size=max_batch_size,
            max_total_seq_len=max_total_seq_len,
            prefill_chunk_size=prefill_chunk_size,
            page_size=page_size,
            support_sliding_window=support_sliding_window,
            layer_partition=rx.ShapeExpr([0, cfg.num_hidden_layers]),
            num_hidden_layers=cfg.num_hidden_layers,
            num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.num_key_value_heads,
            qk_head_dim=cfg.head_dim,
            v_head_dim=cfg.head_dim,
            mla_original_qk_head_dim=0,
            mla_original_v_head_dim=0,
            rope_mode=RopeMode.NONE if rotated else self.rope_mode,
            rope_scale=1,
            rope_theta=cfg.rope_theta,
            rope_scaling=rope_scaling,
            rope_ext_factors=rx.prim_value(0),
            rotary_dim=cfg.head_dim,
            enable_disaggregation=False,
            dtype=self.spec.model_dtype,
            target=self.target,
        )

    def get_default_spec(self) -> dict:
        h, dtype = self.cfg.hidden_size, self.spec.model_dtype
        packed = {"$": {"param_mode": "packed", "effect_mode": "none"}}
        kv = nn.spec.Object(object_type=PagedKVCache)
        return {
            "embed": {"input_ids": nn.spec.Tensor(["seq_len"], "int32"), **packed},
            "prefill": {"input_embed": nn.spec.Tensor([1, "seq_len", h], dtype), "kv_cache": kv, **packed},
            "decode": {"input_embed": nn.spec.Tensor([1, 1, h], dtype), "kv_cache": kv, **packed},
            "batch_prefill": {
                "input_embeds": nn.spec.Tensor([1, "seq_len", h], dtype),
                "logit_positions": nn.spec.Tensor(["batch_size"], "int32"),
                "kv_cache": kv,
                **packed,
            },
            "batch_decode": {"input_embeds": nn.spec.Tensor(["batch_size", 1, h], dtype), "kv_cache": kv, **packed},
            "batch_verify": {"input_embeds": nn.spec.Tensor([1, "seq_len", h], dtype), "kv_cache": kv, **packed},
            "create_tir_paged_kv_cache": {
                "max_batch_size": int,
                "max_total_seq_len": int,
                "prefill_chunk_size": int,
                "page_size": int,
                "support_sliding_window": int,
                "$": {"param_mode": "none", "effect_mode": "none"},
            },
        }
