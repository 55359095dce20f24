"""BERT sentence encoders (BertModel: all-MiniLM, bge, e5, gte), from sentence-transformers folders.

The network is ``model.py``; this file maps checkpoint names (q, k and v fused into one matrix, type
0's embedding row kept: one text is one segment) and writes llama.cpp's ``bert`` GGUF. The folder's
pooling, normalization, length and prompts come from its sentence-transformers files
(``embedding_source.read``), which the importer puts under ``lantern_embedding`` in the config.

Refused by name: relative position embeddings, activations other than exact GELU, decoders, and a
pooling other than mean, CLS or last token.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from lantern.errors import LanternError
from lantern.models.embedding import GGUF_POOLING, embedding_gguf
from lantern.models.family import Family, GGUFTensor
from lantern.tensors import Tensors, join_rows

from .model import BertConfig, BertEncoder

# Lantern parameter -> the checkpoint tensor(s) it is made of, per layer ({i}: the layer)
_LAYER = {
    "qkv_proj.weight": [f"attention.self.{x}.weight" for x in ("query", "key", "value")],
    "qkv_proj.bias": [f"attention.self.{x}.bias" for x in ("query", "key", "value")],
    "o_proj.weight": ["attention.output.dense.weight"],
    "o_proj.bias": ["attention.output.dense.bias"],
    "attention_norm.weight": ["attention.output.LayerNorm.weight"],
    "attention_norm.bias": ["attention.output.LayerNorm.bias"],
    "up_proj.weight": ["intermediate.dense.weight"],
    "up_proj.bias": ["intermediate.dense.bias"],
    "down_proj.weight": ["output.dense.weight"],
    "down_proj.bias": ["output.dense.bias"],
    "output_norm.weight": ["output.LayerNorm.weight"],
    "output_norm.bias": ["output.LayerNorm.bias"],
}
_EMBEDDINGS = {
    "word_embeddings.weight": "embeddings.word_embeddings.weight",
    "position_embeddings.weight": "embeddings.position_embeddings.weight",
    "embeddings_norm.weight": "embeddings.LayerNorm.weight",
    "embeddings_norm.bias": "embeddings.LayerNorm.bias",
}


def to_lantern(hf: Mapping[str, np.ndarray], cfg: BertConfig) -> Tensors:
    """The checkpoint's tensors (``bert.``-prefixed ones too, as BertForMaskedLM saves them) under the
    model's names, each made when asked for."""
    hf = Tensors.of(hf)
    prefix = "bert." if "bert.embeddings.word_embeddings.weight" in hf else ""
    loaders, shapes = {}, {}

    def need(name: str) -> str:
        if prefix + name not in hf:
            raise LanternError(f"checkpoint is missing tensor '{prefix + name}'")
        return prefix + name

    def join(out: str, names: list[str]) -> None:
        found = [need(n) for n in names]
        loaders[out] = hf.loader(found[0]) if len(found) == 1 else join_rows([hf.loader(n) for n in found])
        parts = [hf.shape(n) for n in found]
        shapes[out] = (sum(p[0] for p in parts), *parts[0][1:])

    for out, name in _EMBEDDINGS.items():
        join(out, [name])
    types = need("embeddings.token_type_embeddings.weight")
    loaders["token_type_embedding"] = lambda: np.ascontiguousarray(hf[types][0])
    shapes["token_type_embedding"] = (cfg.hidden_size,)
    for i in range(cfg.num_hidden_layers):
        for out, names in _LAYER.items():
            join(f"layers.{i}.{out}", [f"encoder.layer.{i}.{n}" for n in names])
    expected = {
        "word_embeddings.weight": (cfg.vocab_size, cfg.hidden_size),
        "position_embeddings.weight": (cfg.max_position_embeddings, cfg.hidden_size),
        "layers.0.qkv_proj.weight": (3 * cfg.hidden_size, cfg.hidden_size),
        "layers.0.up_proj.weight": (cfg.intermediate_size, cfg.hidden_size),
    }
    for name, shape in expected.items():
        if shapes[name] != shape:
            raise LanternError(f"tensor '{name}' has shape {list(shapes[name])}, config.json implies {list(shape)}")
    return Tensors(loaders, shapes)


# --------------------------------------------------------------------------- GGUF (llama.cpp's bert)

_GGUF_LAYER = {  # llama.cpp name -> (parameter, which third of the fused q/k/v rows or None)
    "attn_q": ("qkv_proj", 0),
    "attn_k": ("qkv_proj", 1),
    "attn_v": ("qkv_proj", 2),
    "attn_output": ("o_proj", None),
    "attn_output_norm": ("attention_norm", None),
    "ffn_up": ("up_proj", None),
    "ffn_down": ("down_proj", None),
    "layer_output_norm": ("output_norm", None),
}


def gguf_tensors(cfg: BertConfig) -> list[GGUFTensor]:
    h = cfg.hidden_size
    rows = {"up_proj": cfg.intermediate_size}
    out = [
        GGUFTensor("token_embd.weight", "word_embeddings.weight", 0, cfg.vocab_size),
        GGUFTensor("position_embd.weight", "position_embeddings.weight", 0, cfg.max_position_embeddings, float32=True),
        GGUFTensor("token_types.weight", "token_type_embedding", 0, h),  # one row (type 0: one text), 1-D: float32
        GGUFTensor("token_embd_norm.weight", "embeddings_norm.weight", 0, h),
        GGUFTensor("token_embd_norm.bias", "embeddings_norm.bias", 0, h),
    ]
    for n in range(cfg.num_hidden_layers):
        for name, (param, third) in _GGUF_LAYER.items():
            first, count = (third * h, h) if third is not None else (0, rows.get(param, h))
            for kind in ("weight", "bias"):
                out.append(GGUFTensor(f"blk.{n}.{name}.{kind}", f"layers.{n}.{param}.{kind}", first, count))
    return out


def gguf_metadata(cfg: BertConfig) -> dict:
    a = "bert"
    return {
        f"{a}.context_length": cfg.max_position_embeddings,
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.feed_forward_length": cfg.intermediate_size,
        f"{a}.block_count": cfg.num_hidden_layers,
        f"{a}.attention.head_count": cfg.num_attention_heads,
        f"{a}.attention.layer_norm_epsilon": cfg.layer_norm_eps,
        f"{a}.attention.causal": False,
        f"{a}.pooling_type": GGUF_POOLING[cfg.pooling],
        "tokenizer.ggml.token_type_count": 1,
    }


FAMILY = Family(
    name="bert",
    architectures=("BertModel", "BertForMaskedLM"),
    config=BertConfig,
    model=BertEncoder,
    to_lantern=to_lantern,
    gguf=embedding_gguf("bert", gguf_tensors, gguf_metadata),
    kind="embedding",
    default_targets=("webgpu", "wasm", "cpu", "gguf"),
)
