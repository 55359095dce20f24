"""Checkpoint names -> Lantern parameter names for the Llama family.

Hugging Face keeps q/k/v and gate/up as separate matrices; the model fuses
them (one matmul instead of three), so the loader concatenates them here.
GGUF files use llama.cpp's names and store q/k rows permuted for its RoPE
layout; ``hf_names_from_gguf`` undoes both.
"""

from __future__ import annotations

import numpy as np

from lantern.errors import LanternError
from lantern.models.family import GGUFLayout, GGUFTensor

from .model import LlamaConfig

GGUF_ARCHITECTURE = "llama"


def to_lantern(hf: dict[str, np.ndarray], cfg: LlamaConfig) -> dict[str, np.ndarray]:
    """Map a Hugging Face Llama-shaped state dict (float arrays) to the model's float parameters."""
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
        if cfg.attention_bias:
            out[f"{p}.self_attn.qkv_proj.bias"] = np.concatenate(
                [take(f"{p}.self_attn.{x}_proj.bias") for x in ("q", "k", "v")], axis=0)
        if cfg.qk_norm:
            out[f"{p}.self_attn.q_norm.weight"] = take(f"{p}.self_attn.q_norm.weight")
            out[f"{p}.self_attn.k_norm.weight"] = take(f"{p}.self_attn.k_norm.weight")
        out[f"{p}.self_attn.o_proj.weight"] = take(f"{p}.self_attn.o_proj.weight")
        out[f"{p}.mlp.gate_up_proj.weight"] = np.concatenate(
            [take(f"{p}.mlp.gate_proj.weight"), take(f"{p}.mlp.up_proj.weight")], axis=0)
        out[f"{p}.mlp.down_proj.weight"] = take(f"{p}.mlp.down_proj.weight")
        out[f"{p}.input_layernorm.weight"] = take(f"{p}.input_layernorm.weight")
        out[f"{p}.post_attention_layernorm.weight"] = take(f"{p}.post_attention_layernorm.weight")
    for name, w in out.items():
        if not np.all(np.isfinite(w)):
            raise LanternError(f"tensor '{name}' holds NaN or infinite values")
    _check_shapes(hf, cfg)
    return out


def _check_shapes(hf: dict[str, np.ndarray], cfg: LlamaConfig) -> None:
    """Every layer's matrices have the shapes the config implies (a GGUF's metadata or a config.json
    that contradicts its tensors fails here, naming the tensor)."""
    q, kv, h, i = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim, \
        cfg.hidden_size, cfg.intermediate_size
    shapes = {"self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h),
              "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, q),
              "mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h), "mlp.down_proj.weight": (h, i)}
    checks = [("model.embed_tokens.weight", (cfg.vocab_size, h))]
    if not cfg.tie_word_embeddings:
        checks.append(("lm_head.weight", (cfg.vocab_size, h)))
    checks += [(f"model.layers.{n}.{name}", shape) for n in range(cfg.num_hidden_layers) for name, shape in shapes.items()]
    for name, shape in checks:
        if tuple(hf[name].shape) != shape:
            raise LanternError(f"tensor '{name}' has shape {list(hf[name].shape)}, but the config implies {list(shape)}")


_GGUF_LAYER = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
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


def gguf_outer_tensors(cfg: LlamaConfig) -> list[GGUFTensor]:
    """The tensors outside the blocks, as every Llama-shaped llama.cpp architecture names them."""
    out = [GGUFTensor("token_embd.weight", "model.embed_tokens.weight", 0, cfg.vocab_size),
           GGUFTensor("output_norm.weight", "model.norm.weight", 0, cfg.hidden_size)]
    if not cfg.tie_word_embeddings:
        out.append(GGUFTensor("output.weight", "lm_head.weight", 0, cfg.vocab_size))
    return out


def gguf_tensors(cfg: LlamaConfig, rope_permuted: bool = True) -> list[GGUFTensor]:
    """How the model's parameters become llama.cpp's tensors. The fused q/k/v and gate/up matrices
    are split back into their parts by rows; llama.cpp's ``llama`` architecture keeps q and k rows
    permuted for its RoPE (``rope_permuted``), its Qwen architectures do not."""
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    i, h, d = cfg.intermediate_size, cfg.hidden_size, cfg.head_dim
    q_heads = cfg.num_attention_heads if rope_permuted else None
    kv_heads = cfg.num_key_value_heads if rope_permuted else None
    out = gguf_outer_tensors(cfg)
    for n in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{n}", f"blk.{n}"
        qkv = [(f"{b}.attn_q", 0, q, q_heads), (f"{b}.attn_k", q, kv, kv_heads), (f"{b}.attn_v", q + kv, kv, None)]
        out += [GGUFTensor(f"{b}.attn_norm.weight", f"{p}.input_layernorm.weight", 0, h)]
        out += [GGUFTensor(f"{t}.weight", f"{p}.self_attn.qkv_proj.weight", first, rows, heads)
                for t, first, rows, heads in qkv]
        if cfg.attention_bias:
            out += [GGUFTensor(f"{t}.bias", f"{p}.self_attn.qkv_proj.bias", first, rows, heads)
                    for t, first, rows, heads in qkv]
        if cfg.qk_norm:
            out += [GGUFTensor(f"{b}.attn_q_norm.weight", f"{p}.self_attn.q_norm.weight", 0, d),
                    GGUFTensor(f"{b}.attn_k_norm.weight", f"{p}.self_attn.k_norm.weight", 0, d)]
        out += [GGUFTensor(f"{b}.attn_output.weight", f"{p}.self_attn.o_proj.weight", 0, h),
                GGUFTensor(f"{b}.ffn_norm.weight", f"{p}.post_attention_layernorm.weight", 0, h),
                GGUFTensor(f"{b}.ffn_gate.weight", f"{p}.mlp.gate_up_proj.weight", 0, i),
                GGUFTensor(f"{b}.ffn_up.weight", f"{p}.mlp.gate_up_proj.weight", i, i),
                GGUFTensor(f"{b}.ffn_down.weight", f"{p}.mlp.down_proj.weight", 0, h)]
    return out


def gguf_unsupported(cfg: LlamaConfig) -> str | None:
    """Why llama.cpp could not run this config from the tensors and keys written here, or None."""
    kind = cfg.rope_scaling.get("rope_type", "default") if cfg.rope_scaling else "default"
    if kind != "default":
        return f"its RoPE scaling '{kind}' is not written to GGUF yet"
    return None


def gguf_metadata(cfg: LlamaConfig, arch: str = GGUF_ARCHITECTURE) -> dict[str, int | float]:
    """llama.cpp's ``<arch>.*`` keys for this config; the inverse of ``hf_config_from_gguf``."""
    a = arch
    return {f"{a}.context_length": cfg.context_window_size, f"{a}.embedding_length": cfg.hidden_size,
            f"{a}.block_count": cfg.num_hidden_layers, f"{a}.feed_forward_length": cfg.intermediate_size,
            f"{a}.attention.head_count": cfg.num_attention_heads,
            f"{a}.attention.head_count_kv": cfg.num_key_value_heads,
            f"{a}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
            f"{a}.attention.key_length": cfg.head_dim, f"{a}.attention.value_length": cfg.head_dim,
            f"{a}.rope.freq_base": float(cfg.rope_theta), f"{a}.rope.dimension_count": cfg.head_dim,
            f"{a}.vocab_size": cfg.vocab_size}


def hf_names_from_gguf(tensors: dict[str, np.ndarray], hf_config: dict, rope_permuted: bool = True,
                       arch: str = GGUF_ARCHITECTURE, layer_names: dict[str, str] = _GGUF_LAYER) -> dict[str, np.ndarray]:
    """Rename llama.cpp tensors to Hugging Face names (and undo the q/k permutation where the
    architecture has one)."""
    out: dict[str, np.ndarray] = {}
    for name, w in tensors.items():
        parts = name.split(".")
        if name == "token_embd.weight":
            out["model.embed_tokens.weight"] = w
        elif name == "output_norm.weight":
            out["model.norm.weight"] = w
        elif name == "output.weight":
            out["lm_head.weight"] = w
        elif len(parts) == 4 and parts[0] == "blk" and parts[2] in layer_names and parts[3] in ("weight", "bias"):
            if rope_permuted and parts[2] == "attn_q":
                w = _unpermute(w, hf_config["num_attention_heads"])
            elif rope_permuted and parts[2] == "attn_k":
                w = _unpermute(w, hf_config["num_key_value_heads"])
            out[f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{parts[3]}"] = w
        elif name in ("rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight"):
            continue  # RoPE factors (llama3's, longrope's): the family's config_from_metadata reads them
        else:
            raise LanternError(f"GGUF tensor '{name}' is not part of a {arch} model")
    return out


def hf_config_from_gguf(meta: dict, tensor_names, arch: str = GGUF_ARCHITECTURE,
                        hf_architecture: str = "LlamaForCausalLM") -> dict:
    """Build a config.json-like dict from GGUF ``<arch>.*`` metadata (and which tensors exist:
    ``tensor_names`` is anything ``in`` asks, the tensors by name or a set of names)."""
    a = arch
    try:
        heads = int(meta[f"{a}.attention.head_count"])
        hidden = int(meta[f"{a}.embedding_length"])
        cfg = {
            "architectures": [hf_architecture],
            "model_type": arch,
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
    cfg["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
    return cfg


def gguf_layout(arch: str, hf_architecture: str, rope_permuted: bool, tensors=None,
                layer_names: dict[str, str] = _GGUF_LAYER, unsupported=gguf_unsupported) -> GGUFLayout:
    """The GGUF side of a Llama-shaped family: llama.cpp's architecture name, whether it permutes
    q/k rows, and the HF architecture a GGUF of it reads back as. A family whose llama.cpp tensors
    are cut differently (Phi-3's fused ones) passes its own ``tensors`` and ``layer_names``, one that
    llama.cpp cannot run from Lantern's GGUF its own ``unsupported``."""
    return GGUFLayout(
        architecture=arch,
        tensors=tensors or (lambda cfg: gguf_tensors(cfg, rope_permuted)),
        metadata=lambda cfg: gguf_metadata(cfg, arch),
        unsupported=unsupported,
        config_from_metadata=lambda meta, names: hf_config_from_gguf(meta, names, arch, hf_architecture),
        names_from_gguf=lambda tensors, cfg: hf_names_from_gguf(tensors, cfg, rope_permuted, arch, layer_names),
        permute=permute_for_gguf,
    )

