"""Decoder embedders: a chat family's decoder stack run over a padded batch without a KV cache, pooled
into one vector per text, then the folder's Dense layers. Qwen3-Embedding is Qwen3 with causal
attention and last-token pooling; EmbeddingGemma is Gemma 3 with bidirectional attention (within a
symmetric window on the local layers), mean pooling and two Dense layers.

The layers are the chat families' own modules: they attend through
``kv_cache.attention_with_fused_qkv`` and read positions from ``kv_cache.get_query_positions``.
``PaddedBatchAttention`` answers both for a right-padded batch, so no layer is written twice.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op
from tvm.relax.frontend.nn.llm.kv_cache import RopeMode
from tvm.target import Target

from lantern.errors import LanternError
from lantern.models.embedding import POOLINGS, embed_spec, pool
from lantern.models.family import GGUFTensor
from lantern.quantize import QuantSpec, make_linear
from lantern.tensors import Tensors

from .rope import model_rotation, rope


def embedding_config(base: Any) -> Any:
    """``base`` (a decoder's config class) with what a sentence-transformers folder adds: the pooling,
    normalization, Dense layers, prompts, the longest text, and whether attention is bidirectional.
    Embedders have no output head, so the config is read as tied."""

    @dataclasses.dataclass
    class EmbeddingConfig(base):
        pooling: str = "last"
        normalize: bool = False
        dense: tuple[tuple[int, int, bool], ...] = ()  # (in, out, bias) of each Dense layer, in order
        bidirectional: bool = False
        # keys a windowed layer sees: |query - key| < window when bidirectional (transformers' rule for
        # EmbeddingGemma: config.json's sliding_window // 2 + 1), query - key < window when causal
        attention_window: int = 0
        query_prompt: str = ""
        document_prompt: str = ""

        @property
        def dimensions(self) -> int:
            return self.dense[-1][1] if self.dense else self.hidden_size

        @classmethod
        def from_hf(cls, cfg: dict[str, Any]) -> "EmbeddingConfig":
            st = cfg.get("lantern_embedding") or {}
            if "pooling" not in st:
                raise LanternError("a decoder embedder needs its sentence-transformers files: modules.json with a Pooling module")
            if st["pooling"] not in POOLINGS:
                raise LanternError(f"pooling {st['pooling']!r} is not implemented (implemented: {', '.join(POOLINGS)})")
            bidirectional = bool(cfg.get("use_bidirectional_attention"))
            decoder = base.from_hf(
                {**{k: v for k, v in cfg.items() if k != "use_bidirectional_attention"}, "tie_word_embeddings": True}
            )
            if decoder.rope_scaling and not model_rotation(decoder.rope_scaling, decoder.context_window_size, decoder.head_dim):
                if not hasattr(decoder, "layer_rope"):  # Gemma rotates (and scales) its own
                    raise LanternError(
                        f"config.json rope scaling {decoder.rope_scaling.get('rope_type')!r} is not implemented for embedders"
                    )
            fields = {f.name: getattr(decoder, f.name) for f in dataclasses.fields(decoder)}
            dims, dense = decoder.hidden_size, []
            for d in st.get("dense", []):
                if d["in"] != dims:
                    raise LanternError(f"{d['path']}/config.json: in_features {d['in']}, but the vectors before it have {dims}")
                dense.append((d["in"], d["out"], d["bias"]))
                dims = d["out"]
            window = decoder.sliding_window
            context = min(int(st.get("max_seq_length") or decoder.context_window_size), decoder.context_window_size)
            fields.update(context_window_size=context, prefill_chunk_size=context)
            return cls(
                **fields,
                pooling=st["pooling"],
                normalize=bool(st.get("normalize", False)),
                dense=tuple(dense),
                bidirectional=bidirectional,
                attention_window=(window // 2 + 1 if bidirectional else window) if window else 0,
                query_prompt=st.get("query_prompt", ""),
                document_prompt=st.get("document_prompt", ""),
            )

        def quantized_weights(self) -> set[str]:
            return set()  # built unquantized (q0f32, q0f16), as the encoders

    EmbeddingConfig.__name__ = EmbeddingConfig.__qualname__ = base.__name__.replace("Config", "EmbeddingConfig")
    return EmbeddingConfig


class PaddedBatchAttention:
    """The two calls a decoder layer makes of its KV cache, answered for a right-padded batch
    ``mask[b, n]``: positions 0..n-1 in every row, and attention over the row's own real tokens
    (causal or bidirectional, within the window on windowed layers). RoPE is applied here when the
    chat model leaves it to the cache (``rope_theta``), as the cache would."""

    def __init__(self, cfg, mask: nn.Tensor, rope_theta: float | None, dtype: str):
        b, n = mask.shape
        self.cfg, self.rope_theta = cfg, rope_theta
        self.positions = op.reshape(op.broadcast_to(op.reshape(op.arange(0, n, dtype="int32"), (1, n)), (b, n)), (b * n,))
        self.bias = {False: self._bias(mask, 0, dtype)}
        if cfg.attention_window and any(cfg.sliding_layers):
            self.bias[True] = self._bias(mask, cfg.attention_window, dtype)

    def _bias(self, mask: nn.Tensor, window: int, dtype: str) -> nn.Tensor:
        """[b, 1, n, n]: 0 where query i may see key j, a large negative number elsewhere (finite: a row
        with nothing to see, which only padding has, stays a number)."""
        causal, blocked = not self.cfg.bidirectional, -1e4 if dtype == "float16" else -1e9

        def compute(m: te.Tensor) -> te.Tensor:
            def element(b, _, i, j):
                ok = m[b, j] > 0
                if causal:
                    ok = tirx.all(ok, j <= i)
                if window:
                    ok = tirx.all(ok, (i - j if causal else tirx.Max(i - j, j - i)) < window)
                return tirx.Select(ok, tirx.const(0.0, dtype), tirx.const(blocked, dtype))

            bb, n = m.shape
            return te.compute((bb, 1, n, n), element, name="attention_bias")

        return op.tensor_expr_op(compute, "attention_bias", [mask])

    def get_query_positions(self, total: Any) -> nn.Tensor:
        return self.positions

    def attention_with_fused_qkv(self, layer_id: int, qkv: nn.Tensor, num_q_heads: int, sm_scale: float) -> nn.Tensor:
        b, n, heads, d = qkv.shape
        kv_heads = (heads - num_q_heads) // 2
        q, k, v = op.split(qkv, [num_q_heads, num_q_heads + kv_heads], axis=2)
        if self.rope_theta is not None:
            q, k = rope(q, self.positions, self.rope_theta), rope(k, self.positions, self.rope_theta)
        group = num_q_heads // kv_heads
        if group > 1:  # grouped-query attention: each key/value head serves `group` query heads
            k, v = (
                op.reshape(
                    op.broadcast_to(op.reshape(t, (b, n, kv_heads, 1, d)), (b, n, kv_heads, group, d)), (b, n, num_q_heads, d)
                )
                for t in (k, v)
            )
        q, k, v = (op.permute_dims(t, [0, 2, 1, 3]) for t in (q, k, v))  # [b, heads, n, d]
        windowed = bool(self.cfg.sliding_layers and self.cfg.sliding_layers[layer_id]) and True in self.bias
        # a negative scale is the chat cache's "windowed layer" flag (LlamaConfig.sm_scale)
        scores = op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])) * abs(sm_scale) + self.bias[windowed]
        out = op.matmul(op.softmax(scores, axis=-1), v)
        return op.permute_dims(out, [0, 2, 1, 3])  # [b, n, heads, d], as the cache returns it


class DecoderEmbedder(nn.Module):
    """A chat model's decoder stack (``chat.backbone``, its parameters under the chat model's names) as
    an embedding model: ``embed`` (``lantern.models.embedding``) and Dense layers ``dense.<i>``."""

    chat: Any = None  # the chat model class whose backbone, embedding scale and RoPE mode are used
    embedding_scale: bool = False  # tokens' embeddings times sqrt(hidden) (Gemma)

    def __init__(self, cfg, spec: QuantSpec, target: Target):
        self.cfg, self.spec = cfg, spec
        self.model = self.chat.backbone(cfg, spec)
        self.dense = nn.ModuleList([make_linear(i, o, spec, bias=bias) for i, o, bias in cfg.dense])

    def embed(self, input_ids: nn.Tensor, attention_mask: nn.Tensor) -> nn.Tensor:
        b, n = input_ids.shape
        h, dtype = self.cfg.hidden_size, self.spec.model_dtype
        x = op.reshape(self.model.embed_tokens(op.reshape(input_ids, (b * n,))), (b, n, h))
        if self.embedding_scale:
            x = x * (h**0.5)
        rotated_by_model = self.chat.rope_mode == RopeMode.NONE or model_rotation(
            self.cfg.rope_scaling, self.cfg.context_window_size, self.cfg.head_dim
        )
        attention = PaddedBatchAttention(self.cfg, attention_mask, None if rotated_by_model else self.cfg.rope_theta, dtype)
        out = pool(self.model(x, attention), op.astype(attention_mask, dtype), self.cfg.pooling)
        for layer in self.dense:
            out = layer(out)
        return op.astype(out, "float32")

    def get_default_spec(self) -> dict:
        return embed_spec()


def embedder_of(chat: Any, embedding_scale: bool = False) -> type:
    """The ``DecoderEmbedder`` of one chat model class."""
    return type(f"{chat.__name__}Embedder", (DecoderEmbedder,), {"chat": chat, "embedding_scale": embedding_scale})


def embedder_to_lantern(chat_to_lantern: Callable[[Tensors, Any], Tensors]) -> Callable[[Mapping[str, np.ndarray], Any], Tensors]:
    """The chat family's checkpoint mapping, for a base model's checkpoint (``Qwen3Model`` and
    ``Gemma3TextModel`` save no ``model.`` prefix), with the Dense layers' ``dense.<i>`` tensors kept."""

    def convert(hf: Mapping[str, np.ndarray], cfg: Any) -> Tensors:
        hf = Tensors.of(hf)
        if "model.embed_tokens.weight" not in hf:
            hf = hf.renamed(lambda name: name if name.startswith("dense.") else f"model.{name}")
        dense = [k for k in hf if k.startswith("dense.")]
        return chat_to_lantern(hf, cfg).replaced({k: hf.loader(k) for k in dense}, {k: hf.shape(k) for k in dense})

    return convert


def embedder_gguf_tensors(chat_tensors: Callable[[Any], list[GGUFTensor]]) -> Callable[[Any], list[GGUFTensor]]:
    """The chat family's llama.cpp tensors and the Dense layers as llama.cpp's ``dense_2`` and ``dense_3``
    (named after sentence-transformers' 2_Dense and 3_Dense folders)."""

    def tensors(cfg: Any) -> list[GGUFTensor]:
        dense = [GGUFTensor(f"dense_{i + 2}.weight", f"dense.{i}.weight", 0, out) for i, (_, out, _) in enumerate(cfg.dense)]
        return chat_tensors(cfg) + dense

    return tensors


def gguf_dense_unsupported(cfg: Any) -> str | None:
    """Why llama.cpp could not run these Dense layers, or None: it has two slots without biases."""
    if len(cfg.dense) > 2 or any(bias for _, _, bias in cfg.dense):
        return "llama.cpp runs at most two Dense layers after the pooling, without biases"
    return None
