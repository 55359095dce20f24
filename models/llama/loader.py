"""Checkpoint names -> Lantern parameter names for the Llama family.

Hugging Face keeps q/k/v and gate/up as separate matrices; the model fuses
them (one matmul instead of three), so the loader concatenates them here.
GGUF files use llama.cpp's names and store q/k rows permuted for its RoPE
layout; ``hf_names_from_gguf`` undoes both.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from lantern.errors import LanternError
from lantern.models.family import GGUFLayout, GGUFTensor
from lantern.tensors import Loader, Tensors, join_rows

from .model import LlamaConfig

GGUF_ARCHITECTURE = "llama"


def to_lantern(hf: Mapping[str, np.ndarray], cfg: LlamaConfig) -> Tensors:
    """Map a Hugging Face Llama-shaped checkpoint (``tensors.Tensors``, or a dict of arrays) to the
    model's float parameters, each made when asked for. Names and shapes are checked here, before
    anything is read; NaN and infinite values when a tensor is made."""
    hf = Tensors.of(hf)
    loaders, shapes = {}, {}

    def take(name: str) -> None:
        join(name, [name])

    def join(out: str, names: list[str]) -> None:
        for name in names:
            if name not in hf:
                files = sorted(o for o in {hf.origin(n) for n in hf} if o is not None)
                raise LanternError(f"checkpoint is missing tensor '{name}'" + (f" (read {', '.join(files)})" if files else ""))
        loaders[out] = finite(out, hf.loader(names[0]) if len(names) == 1 else join_rows([hf.loader(n) for n in names]))
        parts = [hf.shape(n) for n in names]
        shapes[out] = (sum(p[0] for p in parts), *parts[0][1:])

    take("model.embed_tokens.weight")
    take("model.norm.weight")
    if not cfg.tie_word_embeddings:
        take("lm_head.weight")
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        join(f"{p}.self_attn.qkv_proj.weight", [f"{p}.self_attn.{x}_proj.weight" for x in ("q", "k", "v")])
        if cfg.attention_bias:
            join(f"{p}.self_attn.qkv_proj.bias", [f"{p}.self_attn.{x}_proj.bias" for x in ("q", "k", "v")])
        if cfg.qk_norm:
            take(f"{p}.self_attn.q_norm.weight")
            take(f"{p}.self_attn.k_norm.weight")
        take(f"{p}.self_attn.o_proj.weight")
        join(f"{p}.mlp.gate_up_proj.weight", [f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"])
        take(f"{p}.mlp.down_proj.weight")
        take(f"{p}.input_layernorm.weight")
        take(f"{p}.post_attention_layernorm.weight")
    _check_shapes(hf, cfg)
    return Tensors(loaders, shapes)


def finite(name: str, load: Loader) -> Loader:
    """``load`` that refuses an array holding NaN or infinite values, naming the tensor."""

    def checked() -> np.ndarray:
        w = load()
        if not np.isfinite(w).all():
            raise LanternError(f"tensor '{name}' holds NaN or infinite values")
        return w

    return checked


def layer_shapes(q: int, kv: int, h: int, i: int) -> dict[str, tuple[int, int]]:
    """A layer's matrices in a Llama checkpoint (names within the layer) and their shapes: ``q`` and
    ``kv`` the widths of the query and of each of key and value, ``h`` the hidden size, ``i`` the MLP's."""
    return {
        "self_attn.q_proj.weight": (q, h),
        "self_attn.k_proj.weight": (kv, h),
        "self_attn.v_proj.weight": (kv, h),
        "self_attn.o_proj.weight": (h, q),
        "mlp.gate_proj.weight": (i, h),
        "mlp.up_proj.weight": (i, h),
        "mlp.down_proj.weight": (h, i),
    }


def _check_shapes(hf: Tensors, cfg: LlamaConfig) -> None:
    """Every layer's matrices have the shapes the config implies (a GGUF's metadata or a config.json
    that contradicts its tensors fails here, naming the tensor)."""
    q, kv, h, i = (
        cfg.num_attention_heads * cfg.head_dim,
        cfg.num_key_value_heads * cfg.head_dim,
        cfg.hidden_size,
        cfg.intermediate_size,
    )
    shapes = layer_shapes(q, kv, h, i)
    checks = [("model.embed_tokens.weight", (cfg.vocab_size, h))]
    if not cfg.tie_word_embeddings:
        checks.append(("lm_head.weight", (cfg.vocab_size, h)))
    checks += [(f"model.layers.{n}.{name}", shape) for n in range(cfg.num_hidden_layers) for name, shape in shapes.items()]
    for name, shape in checks:
        if tuple(hf.shape(name)) != shape:
            where = f" in {hf.origin(name)}" if hf.origin(name) else ""
            raise LanternError(f"tensor '{name}'{where} has shape {list(hf.shape(name))}, but the config implies {list(shape)}")


_GGUF_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
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
    out = [
        GGUFTensor("token_embd.weight", "model.embed_tokens.weight", 0, cfg.vocab_size),
        GGUFTensor("output_norm.weight", "model.norm.weight", 0, cfg.hidden_size),
    ]
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
        out += [GGUFTensor(f"{t}.weight", f"{p}.self_attn.qkv_proj.weight", first, rows, heads) for t, first, rows, heads in qkv]
        if cfg.attention_bias:
            out += [GGUFTensor(f"{t}.bias", f"{p}.self_attn.qkv_proj.bias", first, rows, heads) for t, first, rows, heads in qkv]
        if cfg.qk_norm:
            out += [
                GGUFTensor(f"{b}.attn_q_norm.weight", f"{p}.self_attn.q_norm.weight", 0, d),
                GGUFTensor(f"{b}.attn_k_norm.weight", f"{p}.self_attn.k_norm.weight", 0, d),
            ]
        out += [
            GGUFTensor(f"{b}.attn_output.weight", f"{p}.self_attn.o_proj.weight", 0, h),
            GGUFTensor(f"{b}.ffn_norm.weight", f"{p}.post_attention_layernorm.weight", 0, h),
            GGUFTensor(f"{b}.ffn_gate.weight", f"{p}.mlp.gate_up_proj.weight", 0, i),
            GGUFTensor(f"{b}.ffn_up.weight", f"{p}.mlp.gate_up_proj.weight", i, i),
            GGUFTensor(f"{b}.ffn_down.weight", f"{p}.mlp.down_proj.weight", 0, h),
        ]
    return out


def gguf_unsupported(cfg: LlamaConfig, arch: str = GGUF_ARCHITECTURE) -> str | None:
    """Why llama.cpp could not run this config from the tensors and keys written here, or None."""
    kind = cfg.rope_scaling.get("rope_type", "default") if cfg.rope_scaling else "default"
    if kind == "llama3" and arch != GGUF_ARCHITECTURE:
        return f"llama.cpp's {arch} architecture reads no llama3 RoPE factors (rope_freqs)"
    if kind == "yarn" and not cfg.rope_scaling["truncate"]:
        return "its YaRN ramp is not truncated (truncate: false), which llama.cpp always does"
    if kind not in ("default", "linear", "llama3", "yarn"):
        return f"its RoPE scaling '{kind}' is not written to GGUF for llama.cpp's {arch} architecture"
    return None


def gguf_metadata(cfg: LlamaConfig, arch: str = GGUF_ARCHITECTURE) -> dict[str, int | float | str]:
    """llama.cpp's ``<arch>.*`` keys for this config; the inverse of ``hf_config_from_gguf``. RoPE
    scaling as llama.cpp's converter writes it: linear and YaRN as ``rope.scaling.*`` keys, llama3 as
    factors in the ``rope_freqs`` tensor (``gguf_constants``)."""
    a = arch
    meta: dict[str, int | float | str]  # rope.scaling.type is a string
    meta = {
        f"{a}.context_length": cfg.context_window_size,
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.block_count": cfg.num_hidden_layers,
        f"{a}.feed_forward_length": cfg.intermediate_size,
        f"{a}.attention.head_count": cfg.num_attention_heads,
        f"{a}.attention.head_count_kv": cfg.num_key_value_heads,
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        f"{a}.attention.key_length": cfg.head_dim,
        f"{a}.attention.value_length": cfg.head_dim,
        f"{a}.rope.freq_base": float(cfg.rope_theta),
        f"{a}.rope.dimension_count": cfg.head_dim,
        f"{a}.vocab_size": cfg.vocab_size,
    }
    rope = cfg.rope_scaling
    if rope.get("rope_type") in ("linear", "yarn"):
        meta.update({f"{a}.rope.scaling.type": rope["rope_type"], f"{a}.rope.scaling.factor": float(rope["factor"])})
    if rope.get("rope_type") == "yarn":
        meta.update(
            {
                f"{a}.rope.scaling.original_context_length": rope["original_max_position_embeddings"],
                f"{a}.rope.scaling.yarn_beta_fast": rope["beta_fast"],
                f"{a}.rope.scaling.yarn_beta_slow": rope["beta_slow"],
            }
        )
    return meta


def llama3_rope_factors(cfg: LlamaConfig) -> list[float]:
    """llama3 RoPE's divisor of each frequency (transformers' ``_compute_llama3_parameters``): 1 for
    wavelengths under original / high_freq_factor, ``factor`` over original / low_freq_factor, and a
    smooth blend between; llama.cpp reads them from its ``rope_freqs`` tensor."""
    rope, d = cfg.rope_scaling, cfg.head_dim
    if "factors" in rope:  # read from a GGUF's rope_freqs
        return list(rope["factors"])
    factor, low, high = float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
    original = float(rope["original_max_position_embeddings"])
    out = []
    for i in range(d // 2):
        wavelength = 2 * math.pi * cfg.rope_theta ** (2 * i / d)
        if wavelength < original / high:
            out.append(1.0)
        elif wavelength > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


def gguf_constants(cfg: LlamaConfig) -> dict[str, np.ndarray]:
    """llama3 RoPE's factors as llama.cpp's ``rope_freqs`` tensor (F32 [head_dim / 2])."""
    if cfg.rope_scaling.get("rope_type") != "llama3":
        return {}
    return {"rope_freqs.weight": np.array(llama3_rope_factors(cfg), dtype=np.float32)}


def hf_names_from_gguf(
    tensors: Tensors,
    hf_config: dict,
    rope_permuted: bool = True,
    arch: str = GGUF_ARCHITECTURE,
    layer_names: dict[str, str] = _GGUF_LAYER,
) -> Tensors:
    """Rename llama.cpp tensors to Hugging Face names (and undo the q/k permutation where the
    architecture has one), each still made when asked for."""
    loaders, shapes = {}, {}
    for name in tensors:
        parts = name.split(".")
        load = tensors.loader(name)
        if name in _GGUF_OUTER:
            hf_name = _GGUF_OUTER[name]
        elif len(parts) == 4 and parts[0] == "blk" and parts[2] in layer_names and parts[3] in ("weight", "bias"):
            hf_name = f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{parts[3]}"
            heads = {"attn_q": "num_attention_heads", "attn_k": "num_key_value_heads"}.get(parts[2])
            if rope_permuted and heads:
                # mypy#15459: mypy cannot type a lambda whose default binds a loop variable
                load = lambda load=load, n=hf_config[heads]: _unpermute(load(), n)  # type: ignore[misc]  # noqa: E731
        elif name in ("rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight"):
            continue  # RoPE factors (llama3's, longrope's): the family's config_from_metadata reads them
        else:
            raise LanternError(f"GGUF tensor '{name}' is not part of a {arch} model")
        loaders[hf_name], shapes[hf_name] = load, tensors.shape(name)
    return Tensors(loaders, shapes)


_GGUF_OUTER = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_config_from_gguf(
    meta: dict, tensor_names, arch: str = GGUF_ARCHITECTURE, hf_architecture: str = "LlamaForCausalLM"
) -> dict:
    """Build a config.json-like dict from GGUF ``<arch>.*`` metadata (and which tensors exist:
    ``tensor_names`` is anything ``in`` asks, the tensors by name or a set of names)."""
    a = arch
    try:
        heads = int(meta[f"{a}.attention.head_count"])
        hidden = int(meta[f"{a}.embedding_length"])
        cfg: dict[str, Any] = {
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
    kind = meta.get(f"{a}.rope.scaling.type", "none")
    if kind in ("linear", "yarn"):
        cfg["rope_scaling"] = {"rope_type": kind, "factor": float(meta[f"{a}.rope.scaling.factor"])}
    if kind == "yarn":
        if float(meta.get(f"{a}.rope.scaling.attn_factor", 1.0)) != 1.0:
            raise LanternError(
                f"GGUF key '{a}.rope.scaling.attn_factor' (a YaRN attention factor other than "
                "0.1 ln(factor) + 1) is not supported"
            )
        cfg["rope_scaling"].update(
            original_max_position_embeddings=int(meta[f"{a}.rope.scaling.original_context_length"]),
            beta_fast=float(meta.get(f"{a}.rope.scaling.yarn_beta_fast", 32.0)),
            beta_slow=float(meta.get(f"{a}.rope.scaling.yarn_beta_slow", 1.0)),
        )
    elif kind not in ("none", "linear"):
        raise LanternError(f"GGUF key '{a}.rope.scaling.type': '{kind}' is not supported (none, linear, yarn)")
    if "rope_freqs.weight" in tensor_names:  # llama3's factors, as llama.cpp's converter writes them
        freqs = tensor_names["rope_freqs.weight"]
        if freqs.tensor_type.name != "F32" or list(freqs.shape) != [cfg["head_dim"] // 2]:
            raise LanternError(
                f"GGUF tensor 'rope_freqs.weight' is {freqs.tensor_type.name} {list(freqs.shape)}; "
                f"llama3 RoPE needs F32 [{cfg['head_dim'] // 2}]"
            )
        cfg["rope_scaling"] = {"rope_type": "llama3", "factors": [float(f) for f in np.asarray(freqs.data, np.float32)]}
    return cfg


def gguf_layout(
    arch: str,
    hf_architecture: str,
    rope_permuted: bool,
    tensors=None,
    layer_names: dict[str, str] = _GGUF_LAYER,
    unsupported=None,
) -> GGUFLayout:
    """The GGUF side of a Llama-shaped family: llama.cpp's architecture name, whether it permutes
    q/k rows, and the HF architecture a GGUF of it reads back as. A family whose llama.cpp tensors
    are cut differently (Phi-3's fused ones) passes its own ``tensors`` and ``layer_names``, one that
    llama.cpp cannot run from Lantern's GGUF its own ``unsupported``."""
    return GGUFLayout(
        architecture=arch,
        tensors=tensors or (lambda cfg: gguf_tensors(cfg, rope_permuted)),
        metadata=lambda cfg: gguf_metadata(cfg, arch),
        unsupported=unsupported or (lambda cfg: gguf_unsupported(cfg, arch)),
        config_from_metadata=lambda meta, names: hf_config_from_gguf(meta, names, arch, hf_architecture),
        names_from_gguf=lambda tensors, cfg: hf_names_from_gguf(tensors, cfg, rope_permuted, arch, layer_names),
        permute=permute_for_gguf,
        constants=gguf_constants,
    )
