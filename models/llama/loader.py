"""Checkpoint names -> Lantern parameter names for the Llama family.

Hugging Face keeps q/k/v and gate/up as separate matrices; the model fuses
them (one matmul instead of three), so the loader concatenates them here.
GGUF files use llama.cpp's names and store q/k rows permuted for its RoPE
layout; ``hf_names_from_gguf`` undoes both.
"""

from __future__ import annotations

import numpy as np

from lantern.errors import LanternError

from .model import LlamaConfig

GGUF_ARCHITECTURE = "llama"


def to_lantern(hf: dict[str, np.ndarray], cfg: LlamaConfig) -> dict[str, np.ndarray]:
    """Map a Hugging Face Llama state dict (float arrays) to the model's float parameters."""
    out: dict[str, np.ndarray] = {}

    def take(name: str) -> np.ndarray:
        if name not in hf:
            raise LanternError(f"checkpoint is missing tensor '{name}'")
        return hf[name]

    out["model.embed_tokens.weight"] = take("model.embed_tokens.weight")
    out["model.norm.weight"] = take("model.norm.weight")
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = take("lm_head.weight")
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        out[f"{p}.self_attn.qkv_proj.weight"] = np.concatenate(
            [take(f"{p}.self_attn.{x}_proj.weight") for x in ("q", "k", "v")], axis=0)
        out[f"{p}.self_attn.o_proj.weight"] = take(f"{p}.self_attn.o_proj.weight")
        out[f"{p}.mlp.gate_up_proj.weight"] = np.concatenate(
            [take(f"{p}.mlp.gate_proj.weight"), take(f"{p}.mlp.up_proj.weight")], axis=0)
        out[f"{p}.mlp.down_proj.weight"] = take(f"{p}.mlp.down_proj.weight")
        out[f"{p}.input_layernorm.weight"] = take(f"{p}.input_layernorm.weight")
        out[f"{p}.post_attention_layernorm.weight"] = take(f"{p}.post_attention_layernorm.weight")
    for name, w in out.items():
        if not np.all(np.isfinite(w)):
            raise LanternError(f"tensor '{name}' holds NaN or infinite values")
    return out


_GGUF_LAYER = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp interleaves the two RoPE halves of every head; restore HF's layout.
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_for_gguf(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's q/k rows in llama.cpp's RoPE layout (each head's two halves interleaved); the inverse of
    ``_unpermute``. Works on any array with one row per output feature (a packed q4 weight too)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(cfg: LlamaConfig) -> list[tuple[str, str, int, int, int | None]]:
    """How the model's parameters become llama.cpp's tensors: (GGUF name, parameter stem, first row,
    rows, heads whose rows are permuted for llama.cpp's RoPE or None). The fused q/k/v and gate/up
    matrices are split back into their parts by rows."""
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    i, h = cfg.intermediate_size, cfg.hidden_size
    out = [("token_embd", "model.embed_tokens", 0, cfg.vocab_size, None),
           ("output_norm", "model.norm", 0, h, None)]
    if not cfg.tie_word_embeddings:
        out.append(("output", "lm_head", 0, cfg.vocab_size, None))
    for n in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{n}", f"blk.{n}"
        out += [(f"{b}.attn_norm", f"{p}.input_layernorm", 0, h, None),
                (f"{b}.attn_q", f"{p}.self_attn.qkv_proj", 0, q, cfg.num_attention_heads),
                (f"{b}.attn_k", f"{p}.self_attn.qkv_proj", q, kv, cfg.num_key_value_heads),
                (f"{b}.attn_v", f"{p}.self_attn.qkv_proj", q + kv, kv, None),
                (f"{b}.attn_output", f"{p}.self_attn.o_proj", 0, h, None),
                (f"{b}.ffn_norm", f"{p}.post_attention_layernorm", 0, h, None),
                (f"{b}.ffn_gate", f"{p}.mlp.gate_up_proj", 0, i, None),
                (f"{b}.ffn_up", f"{p}.mlp.gate_up_proj", i, i, None),
                (f"{b}.ffn_down", f"{p}.mlp.down_proj", 0, h, None)]
    return out


def gguf_unsupported(cfg: LlamaConfig) -> str | None:
    """Why llama.cpp could not run this config from the tensors and keys written here, or None."""
    kind = cfg.rope_scaling.get("rope_type", "default") if cfg.rope_scaling else "default"
    if kind != "default":
        return f"its RoPE scaling '{kind}' is not written to GGUF yet"
    return None


def gguf_metadata(cfg: LlamaConfig) -> dict[str, int | float]:
    """llama.cpp's ``llama.*`` keys for this config; the inverse of ``hf_config_from_gguf``."""
    a = GGUF_ARCHITECTURE
    return {f"{a}.context_length": cfg.context_window_size, f"{a}.embedding_length": cfg.hidden_size,
            f"{a}.block_count": cfg.num_hidden_layers, f"{a}.feed_forward_length": cfg.intermediate_size,
            f"{a}.attention.head_count": cfg.num_attention_heads,
            f"{a}.attention.head_count_kv": cfg.num_key_value_heads,
            f"{a}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
            f"{a}.attention.key_length": cfg.head_dim, f"{a}.attention.value_length": cfg.head_dim,
            f"{a}.rope.freq_base": float(cfg.rope_theta), f"{a}.rope.dimension_count": cfg.head_dim,
            f"{a}.vocab_size": cfg.vocab_size}


def hf_names_from_gguf(tensors: dict[str, np.ndarray], hf_config: dict) -> dict[str, np.ndarray]:
    """Rename llama.cpp tensors to Hugging Face names (and undo the q/k permutation)."""
    out: dict[str, np.ndarray] = {}
    for name, w in tensors.items():
        parts = name.split(".")
        if name == "token_embd.weight":
            out["model.embed_tokens.weight"] = w
        elif name == "output_norm.weight":
            out["model.norm.weight"] = w
        elif name == "output.weight":
            out["lm_head.weight"] = w
        elif parts[0] == "blk" and parts[2] in _GGUF_LAYER:
            if parts[2] == "attn_q":
                w = _unpermute(w, hf_config["num_attention_heads"])
            elif parts[2] == "attn_k":
                w = _unpermute(w, hf_config["num_key_value_heads"])
            out[f"model.layers.{parts[1]}.{_GGUF_LAYER[parts[2]]}.{parts[3]}"] = w
        elif name == "rope_freqs.weight":
            continue  # llama3 RoPE factors: recomputed from rope_scaling
        else:
            raise LanternError(f"GGUF tensor '{name}' is not part of a llama model")
    return out


def hf_config_from_gguf(meta: dict) -> dict:
    """Build a config.json-like dict from GGUF ``llama.*`` metadata."""
    a = GGUF_ARCHITECTURE
    try:
        heads = int(meta[f"{a}.attention.head_count"])
        hidden = int(meta[f"{a}.embedding_length"])
        cfg = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": hidden,
            "intermediate_size": int(meta[f"{a}.feed_forward_length"]),
            "num_hidden_layers": int(meta[f"{a}.block_count"]),
            "num_attention_heads": heads,
            "num_key_value_heads": int(meta.get(f"{a}.attention.head_count_kv", heads)),
            "rms_norm_eps": float(meta[f"{a}.attention.layer_norm_rms_epsilon"]),
            "rope_theta": float(meta.get(f"{a}.rope.freq_base", 10000.0)),
            "max_position_embeddings": int(meta[f"{a}.context_length"]),
            "head_dim": int(meta.get(f"{a}.attention.key_length", hidden // heads)),
        }
    except KeyError as err:
        raise LanternError(f"GGUF metadata is missing '{err.args[0]}'") from None
    if f"{a}.vocab_size" in meta:
        cfg["vocab_size"] = int(meta[f"{a}.vocab_size"])
    return cfg
