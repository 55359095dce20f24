"""Gemma 3 text (Gemma3ForCausalLM: 270M, 1B), from HF folders and from llama.cpp's ``gemma3`` GGUFs;
``EMBEDDING`` is EmbeddingGemma, the same decoder attending both ways and pooled (``llama/embedder.py``).

The network and its config (two RoPE bases, the local/global layer pattern, ``query_pre_attn_scalar``)
are ``model.py``; this file maps checkpoint names, folds Gemma's (1 + w) norms into plain RMSNorm
weights, and runs the numpy forward GPTQ calibrates on.

Limits, each refused or stated rather than approximated:

* the local layers' window (512 on 270M and 1B) runs in Lantern's attention kernels over a plain
  full-length KV cache (``emulated.custom_attention``; TVM 0.27's windowed layers are not usable,
  see the notes on issue 15), so it takes a full cache's memory;
* Gemma 2 (soft-capped attention logits) is its own family, ``models/gemma2``, which reuses this one;
* the ``gguf`` target (llama.cpp's gemma3) needs ``query_pre_attn_scalar`` = ``head_dim``, as every
  released Gemma 3 has it (62-layer 27B: hidden / heads): llama.cpp derives the score scale from the
  shapes, not from a key.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from lantern.errors import LanternError
from lantern.models.embedding import GGUF_POOLING, embedding_gguf
from lantern.models.family import Family, GGUFLayout, GGUFTensor, Observe
from lantern.models.llama import to_lantern as llama_to_lantern
from lantern.models.llama.calibration import (
    _rms_norm,
    _rope,
    embedded,
    grouped_attention,
    observed_attention,
    observed_head,
    observed_mlp,
)
from lantern.models.llama.embedder import (
    embedder_gguf_tensors,
    embedder_of,
    embedder_to_lantern,
    embedding_config,
    gguf_dense_unsupported,
)
from lantern.models.llama.loader import gguf_metadata, hf_config_from_gguf, hf_names_from_gguf
from lantern.models.llama.loader import gguf_tensors as llama_gguf_tensors
from lantern.tensors import Tensors

from .model import PATTERN, Gemma3Config, Gemma3ForCausalLM

# the block norms besides input_layernorm (the Llama loader knows that one)
SANDWICH = ("post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def to_lantern(hf: Mapping[str, np.ndarray], cfg: Gemma3Config) -> Tensors:
    """The Llama loader's fused q/k/v and gate/up (with its shape and finiteness checks), the two
    sandwich norms it does not know, and every norm weight as ``1 + w``: Gemma's RMSNorm scales by
    (1 + w), the model's plain RMSNorm by its weight."""
    hf = Tensors.of(hf)
    sandwich = {f"model.layers.{i}.{name}.weight" for i in range(cfg.num_hidden_layers) for name in SANDWICH}
    for name in sorted(sandwich):
        if name not in hf:
            raise LanternError(f"checkpoint is missing tensor '{name}'")
    # the Llama loader's pre-MLP norm is Gemma's pre_feedforward_layernorm
    pre_mlp = {
        f"model.layers.{i}.post_attention_layernorm.weight": f"model.layers.{i}.pre_feedforward_layernorm.weight"
        for i in range(cfg.num_hidden_layers)
    }
    out = llama_to_lantern(
        hf.replaced({k: hf.loader(v) for k, v in pre_mlp.items()}, {k: hf.shape(v) for k, v in pre_mlp.items()}), cfg
    )
    out = out.replaced({k: hf.loader(k) for k in sandwich}, {k: hf.shape(k) for k in sandwich})
    return out.transformed([k for k in out if k.endswith("norm.weight")], lambda w: (1.0 + w).astype(np.float32))


# --------------------------------------------------------------------------- GGUF (llama.cpp's gemma3)

_GGUF_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


# the layer count of each architecture's 27B, whose scores llama.cpp scales by hidden / heads
_LAYERS_27B = {"gemma2": 46, "gemma3": 62}


def _gguf_score_scalar(arch: str, layers: int, hidden: int, heads: int, head_dim: int) -> int:
    """The ``query_pre_attn_scalar`` llama.cpp's gemma2/gemma3 use: they keep no key for it."""
    return hidden // heads if layers == _LAYERS_27B[arch] else head_dim


def gguf_unsupported(cfg: Gemma3Config, arch: str = "gemma3") -> str | None:
    scalar = _gguf_score_scalar(arch, cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim)
    if cfg.query_pre_attn_scalar != scalar:
        return (
            f"llama.cpp's {arch} scales scores by {scalar} ** -0.5 for this shape, the model by "
            f"query_pre_attn_scalar {cfg.query_pre_attn_scalar:g} ** -0.5"
        )
    return None


def gguf_tensors(cfg: Gemma3Config) -> list[GGUFTensor]:
    """The Llama-shaped tensors (q/k rows as HF has them; q/k norms where the config has them),
    with Gemma's four block norms under llama.cpp's names; every norm is stored as 1 + w, as
    llama.cpp's converter stores it."""
    h = cfg.hidden_size
    out = [t for t in llama_gguf_tensors(cfg, rope_permuted=False) if not t.name.endswith(".ffn_norm.weight")]
    for n in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{n}", f"blk.{n}"
        out += [
            GGUFTensor(f"{b}.post_attention_norm.weight", f"{p}.post_attention_layernorm.weight", 0, h),
            GGUFTensor(f"{b}.ffn_norm.weight", f"{p}.pre_feedforward_layernorm.weight", 0, h),
            GGUFTensor(f"{b}.post_ffw_norm.weight", f"{p}.post_feedforward_layernorm.weight", 0, h),
        ]
    return out


def gguf_metadata_of(cfg: Gemma3Config, arch: str = "gemma3") -> dict:
    """llama.cpp's gemma3 (or gemma2) keys: the Llama ones, the window, which layers use it and
    their RoPE base."""
    a = arch
    meta = {
        **gguf_metadata(cfg, a),
        f"{a}.attention.sliding_window": cfg.sliding_window,
        f"{a}.attention.sliding_window_pattern": list(cfg.sliding_layers),
        f"{a}.rope.freq_base_swa": float(cfg.rope_local_theta),
    }
    if cfg.rope_scaling:  # linear, the only kind the config takes; global layers only
        meta.update({f"{a}.rope.scaling.type": "linear", f"{a}.rope.scaling.factor": float(cfg.rope_scaling["factor"])})
    return meta


def config_from_gguf(meta: dict, tensors, arch: str = "gemma3", pattern_every: int = PATTERN) -> dict:
    """llama.cpp's gemma3 keys (or another Gemma architecture's: ``arch``) -> a Gemma 3 config.json.
    What the file leaves out, llama.cpp fixes as done here: the local RoPE base 10000, every
    ``pattern_every``-th layer global, scores scaled by key_length ** -0.5 (hidden / heads for a 27B)."""
    a = arch
    cfg = hf_config_from_gguf(meta, tensors, a, "Gemma3ForCausalLM")
    scalar = _gguf_score_scalar(a, cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"])
    cfg.update(
        model_type="gemma3_text",
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=scalar,
        rope_local_base_freq=float(meta.get(f"{a}.rope.freq_base_swa", 10000.0)),
    )
    pattern = meta.get(f"{a}.attention.sliding_window_pattern", pattern_every)
    if isinstance(pattern, list):  # one flag per layer (what Lantern writes)
        if len(pattern) != cfg["num_hidden_layers"]:
            raise LanternError(
                f"GGUF key '{a}.attention.sliding_window_pattern' has {len(pattern)} entries for "
                f"{cfg['num_hidden_layers']} layers"
            )
        cfg["layer_types"] = ["sliding_attention" if local else "full_attention" for local in pattern]
    else:
        cfg["sliding_window_pattern"] = int(pattern)
    if f"{a}.attention.sliding_window" in meta:
        cfg["sliding_window"] = int(meta[f"{a}.attention.sliding_window"])
    if meta.get(f"{a}.rope.scaling.type") == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(meta[f"{a}.rope.scaling.factor"])}
    return cfg


def names_from_gguf(tensors: Tensors, cfg: dict, arch: str = "gemma3") -> Tensors:
    """llama.cpp's names -> HF's (q/k rows unpermuted in gemma2/gemma3). llama.cpp stores Gemma's
    norms as 1 + w; HF checkpoints carry w."""
    out = hf_names_from_gguf(tensors, cfg, rope_permuted=False, arch=arch, layer_names=_GGUF_LAYER)
    return out.transformed([k for k in out if k.endswith("norm.weight")], lambda w: w - 1.0)


GGUF = GGUFLayout(
    architecture="gemma3",
    tensors=gguf_tensors,
    metadata=gguf_metadata_of,
    unsupported=gguf_unsupported,
    config_from_metadata=config_from_gguf,
    names_from_gguf=names_from_gguf,
    windows=True,
)


# --------------------------------------------------------------------------- calibration (GPTQ)


def _attention(h: np.ndarray, params: dict[str, np.ndarray], i: int, cfg: Gemma3Config) -> np.ndarray:
    p = f"model.layers.{i}"
    seq, heads, kv, dim = h.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q, k, v = np.split(h @ params[f"{p}.self_attn.qkv_proj.weight"].T, [heads * dim, (heads + kv) * dim], axis=1)
    theta, scale = cfg.layer_rope(i)
    q, k = q.reshape(seq, heads, dim), k.reshape(seq, kv, dim)
    if cfg.qk_norm:  # Gemma 3's; Gemma 2 has none
        q = _rms_norm(q, params[f"{p}.self_attn.q_norm.weight"], cfg.rms_norm_eps)
        k = _rms_norm(k, params[f"{p}.self_attn.k_norm.weight"], cfg.rms_norm_eps)
    q, k = _rope(q, theta, scale), _rope(k, theta, scale)
    return grouped_attention(
        q, k, v.reshape(seq, kv, dim), cfg.query_pre_attn_scalar**-0.5, cfg.layer_window(i), cfg.attention_softcap
    )


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def calibration_forward(
    params: dict[str, np.ndarray], cfg: Gemma3Config, sequences: list[list[int]], observe: Observe
) -> list[np.ndarray]:
    """Gemma 3 (and Gemma 2: no q/k norm, soft-capped scores) in numpy over Lantern's parameters
    (norms already 1 + w); the contract of ``lantern.models.llama.calibration.calibration_forward``."""
    eps = cfg.rms_norm_eps
    xs = embedded(params, sequences, cfg.hidden_size**0.5)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        attn = observed_attention(params, xs, i, cfg, _attention, observe)
        xs = [
            x + _rms_norm(a @ params[f"{p}.self_attn.o_proj.weight"].T, params[f"{p}.post_attention_layernorm.weight"], eps)
            for x, a in zip(xs, attn)
        ]
        acts = observed_mlp(params, xs, i, "pre_feedforward_layernorm", eps, _gelu_tanh, observe)
        xs = [
            x + _rms_norm(a @ params[f"{p}.mlp.down_proj.weight"].T, params[f"{p}.post_feedforward_layernorm.weight"], eps)
            for x, a in zip(xs, acts)
        ]
    return observed_head(params, xs, cfg, observe)


FAMILY = Family(
    name="gemma3",
    architectures=("Gemma3ForCausalLM",),
    config=Gemma3Config,
    model=Gemma3ForCausalLM,
    to_lantern=to_lantern,
    gguf=GGUF,
    calibration_forward=calibration_forward,
)


# --------------------------------------------------------------------------- EmbeddingGemma

Gemma3EmbeddingConfig = embedding_config(Gemma3Config)


def _embedding_unsupported(cfg) -> str | None:
    """What llama.cpp's gemma-embedding fixes that a config could set otherwise."""
    if cfg.query_pre_attn_scalar != cfg.head_dim:
        return (
            f"llama.cpp's gemma-embedding scales scores by head_dim ** -0.5, the model by {cfg.query_pre_attn_scalar:g} ** -0.5"
        )
    if list(cfg.sliding_layers) != [i % PATTERN < PATTERN - 1 for i in range(cfg.num_hidden_layers)]:
        return f"llama.cpp's gemma-embedding has a global layer every {PATTERN}th, the config's layer_types differ"
    if cfg.rope_local_theta != 10000.0:
        return f"llama.cpp's gemma-embedding rotates local layers with base 10000, the config with {cfg.rope_local_theta:g}"
    if not cfg.bidirectional:
        return "llama.cpp's gemma-embedding attends both ways; the config is causal"
    return gguf_dense_unsupported(cfg)


def _embedding_metadata(cfg) -> dict:
    a = "gemma-embedding"
    meta = {**gguf_metadata_of(cfg, a), f"{a}.pooling_type": GGUF_POOLING[cfg.pooling]}
    for i, (features_in, features_out, _) in enumerate(cfg.dense):
        meta[f"{a}.dense_{i + 2}_feat_in"], meta[f"{a}.dense_{i + 2}_feat_out"] = features_in, features_out
    return meta


# EmbeddingGemma (Gemma3TextModel with use_bidirectional_attention): the decoder attending both ways
# (the local layers within |query - key| <= sliding_window / 2), mean-pooled, then two Dense layers.
EMBEDDING = Family(
    name="gemma-embedding",
    architectures=("Gemma3TextModel",),
    config=Gemma3EmbeddingConfig,
    model=embedder_of(Gemma3ForCausalLM, embedding_scale=True),
    to_lantern=embedder_to_lantern(to_lantern),
    gguf=embedding_gguf(
        "gemma-embedding", embedder_gguf_tensors(gguf_tensors), _embedding_metadata, _embedding_unsupported, windows=True
    ),
    kind="embedding",
)
