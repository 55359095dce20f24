"""The BERT encoder in relax nn (all-MiniLM, bge, e5, gte): bidirectional attention over a padded
batch, absolute positions, token types, post-LayerNorm blocks and exact (erf) GELU, then the pooling
the sentence-transformers folder names.

The library's one entry point is ``embed`` (``lantern.models.embedding``).
Every position's type is 0, as for one text (sentence-transformers passes no second segment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op
from tvm.target import Target

from lantern.errors import LanternError
from lantern.models.embedding import POOLINGS, embed_spec, pool
from lantern.quantize import QuantSpec, make_embedding, make_linear


@dataclass
class BertConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    pooling: str  # one of POOLINGS (from the folder's 1_Pooling/config.json)
    normalize: bool  # sentence-transformers' Normalize module follows the pooling
    context_window_size: int  # the most tokens one text may have ([CLS] and [SEP] included)
    prefill_chunk_size: int  # = the context: a text is embedded in one call (MLC's metadata needs one)
    # what the chat families' configs have and an encoder does not (the FamilyConfig contract)
    num_key_value_heads: int = 0
    head_dim: int = 0
    tie_word_embeddings: bool = False
    attention_softcap: float = 0.0
    sliding_window: int = 0
    sliding_layers: tuple[bool, ...] = ()
    query_prompt: str = ""  # sentence-transformers' "query" prompt, prepended to queries ("" if none)
    document_prompt: str = ""

    @property
    def windowed(self) -> bool:
        return False

    @property
    def dimensions(self) -> int:
        return self.hidden_size  # a pooled vector's length

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "BertConfig":
        """config.json, with the sentence-transformers fields the importer adds under ``lantern_embedding``."""
        for field_name, allowed in (("position_embedding_type", "absolute"), ("hidden_act", "gelu")):
            if cfg.get(field_name, allowed) != allowed:
                raise LanternError(
                    f"config.json {field_name} is {cfg[field_name]!r}: only {allowed!r} is implemented for BERT encoders"
                )
        if cfg.get("is_decoder") or cfg.get("add_cross_attention"):
            raise LanternError("config.json is_decoder/add_cross_attention: only BERT encoders are implemented")
        st = cfg.get("lantern_embedding") or {}
        if st.get("dense"):
            raise LanternError("modules.json: Dense modules after a BERT encoder are not implemented")
        pooling = st.get("pooling", "cls")
        if pooling not in POOLINGS:
            raise LanternError(f"pooling {pooling!r} is not implemented (implemented: {', '.join(POOLINGS)})")
        heads = cfg["num_attention_heads"]
        if cfg["hidden_size"] % heads:
            raise LanternError(f"config.json hidden_size {cfg['hidden_size']} is not a multiple of num_attention_heads {heads}")
        positions = cfg.get("max_position_embeddings", 512)
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            max_position_embeddings=positions,
            type_vocab_size=cfg.get("type_vocab_size", 2),
            layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
            pooling=pooling,
            normalize=bool(st.get("normalize", False)),
            context_window_size=min(int(st.get("max_seq_length") or positions), positions),
            prefill_chunk_size=min(int(st.get("max_seq_length") or positions), positions),
            query_prompt=st.get("query_prompt", ""),
            document_prompt=st.get("document_prompt", ""),
        )

    def quantized_weights(self) -> set[str]:
        return set()  # encoders are built unquantized (q0f32, q0f16): see compiler/embedding notes


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig, spec: QuantSpec, cpu: bool = False):
        h, dtype = cfg.hidden_size, spec.model_dtype
        self.heads, self.head_dim = cfg.num_attention_heads, h // cfg.num_attention_heads
        # the CPU libraries (native and wasm, float32) attend in one kernel of their own (cpu_schedule)
        self.attention_kernel = None
        if cpu and dtype == "float32" and self.head_dim % 4 == 0:
            from lantern.cpu_schedule import encoder_attention

            self.attention_kernel = encoder_attention(self.heads, self.head_dim, cfg.context_window_size)
        self.qkv_proj = make_linear(h, 3 * h, spec, bias=True)
        self.o_proj = make_linear(h, h, spec, bias=True)
        self.attention_norm = nn.LayerNorm(h, cfg.layer_norm_eps, dtype=dtype)
        self.up_proj = make_linear(h, cfg.intermediate_size, spec, bias=True)
        self.down_proj = make_linear(cfg.intermediate_size, h, spec, bias=True)
        self.output_norm = nn.LayerNorm(h, cfg.layer_norm_eps, dtype=dtype)

    def forward(self, x: nn.Tensor, bias: nn.Tensor) -> nn.Tensor:
        b, n, h = x.shape
        if self.attention_kernel is not None:
            out = nn.Tensor.placeholder((b, n, h), x.dtype)
            attended = op.tensor_ir_op(self.attention_kernel, "encoder_attention", [self.qkv_proj(x), bias], out)
        else:
            qkv = op.reshape(self.qkv_proj(x), (b, n, 3, self.heads, self.head_dim))
            q, k, v = (op.permute_dims(op.squeeze(t, 2), [0, 2, 1, 3]) for t in op.split(qkv, 3, axis=2))
            scores = op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])) * (self.head_dim**-0.5) + bias
            attended = op.matmul(op.softmax(scores, axis=-1), v)  # [b, heads, n, head_dim]
            attended = op.reshape(op.permute_dims(attended, [0, 2, 1, 3]), (b, n, h))
        x = self.attention_norm(x + self.o_proj(attended))
        return self.output_norm(x + self.down_proj(op.gelu(self.up_proj(x))))


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig, spec: QuantSpec, target: Target):
        self.cfg, self.spec = cfg, spec
        dtype = spec.model_dtype
        self.word_embeddings = make_embedding(cfg.vocab_size, cfg.hidden_size, spec)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size, dtype=dtype)
        self.token_type_embedding = nn.Parameter((cfg.hidden_size,), dtype)  # type 0's row: every position's
        self.embeddings_norm = nn.LayerNorm(cfg.hidden_size, cfg.layer_norm_eps, dtype=dtype)
        cpu = target.kind.name == "llvm"
        self.layers = nn.ModuleList([BertLayer(cfg, spec, cpu) for _ in range(cfg.num_hidden_layers)])

    def embed(self, input_ids: nn.Tensor, attention_mask: nn.Tensor) -> nn.Tensor:
        """Pooled vectors [b, hidden] of a right-padded batch (``attention_mask`` 1 on tokens, 0 on padding)."""
        b, n = input_ids.shape
        dtype = self.spec.model_dtype
        positions = op.broadcast_to(op.reshape(op.arange(0, n, dtype="int32"), (1, n)), (b, n))
        x = op.reshape(self.word_embeddings(op.reshape(input_ids, (b * n,))), (b, n, self.cfg.hidden_size))
        x = x + op.reshape(self.position_embeddings(op.reshape(positions, (b * n,))), (b, n, self.cfg.hidden_size))
        x = self.embeddings_norm(x + self.token_type_embedding)
        mask = op.astype(attention_mask, dtype)
        # padding keys get a score far below any real one (a finite value: -inf would NaN an empty row)
        bias = op.reshape((mask - 1.0) * 1e4 if dtype == "float16" else (mask - 1.0) * 1e9, (b, 1, 1, n))
        for layer in self.layers:
            x = layer(x, bias)
        return op.astype(pool(x, mask, self.cfg.pooling), "float32")

    def get_default_spec(self) -> dict:
        return embed_spec()
