"""Phi-3 (mini 4k): the Llama-shaped decoder, whose checkpoint already stores q/k/v and gate/up
fused, as the model computes them. llama.cpp's ``phi3`` architecture keeps them fused too
(``attn_qkv``, and ``ffn_up`` holding gate then up).

Phi-3's 2047-token sliding window runs in Lantern's attention kernels (``LlamaConfig.windowed``).

LongRoPE (Phi-3.5-mini, the 128k models) divides each RoPE frequency by a factor of its own, from
``short_factor`` while the sequence is within ``original_max_position_embeddings`` and from
``long_factor`` beyond, and scales cos/sin by an attention factor. A build picks one set by its
context, as llama.cpp does (``rope.longrope_factors``): the default 4096 is Phi-3.5-mini's original
length, so the short factors, exact against transformers on every sequence; ``--context-window``
beyond it runs the long ones. The Llama decoder rotates q and k itself for longrope
(models/llama/rope.py): TVM 0.27's own longrope kernel does not parse. The ``gguf`` target carries
both sets as llama.cpp's converter writes them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from lantern.errors import LanternError
from lantern.models.family import Family, GGUFTensor
from lantern.models.llama import LlamaForCausalLM, calibration_forward
from lantern.models.llama import to_lantern as llama_to_lantern
from lantern.models.llama.loader import finite, gguf_layout, gguf_outer_tensors
from lantern.models.llama.loader import gguf_metadata as llama_gguf_metadata
from lantern.models.llama.model import LlamaConfig, decoder_fields
from lantern.models.llama.rope import resolve_longrope
from lantern.tensors import Tensors


class Phi3Config(LlamaConfig):
    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "Phi3Config":
        fields = decoder_fields(cfg)  # its rope_scaling is {} for plain RoPE, resolved for longrope
        rope = fields["rope_scaling"]
        key = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
        if rope and rope["rope_type"] != "longrope":
            raise LanternError(
                f"config.json field '{key}': Phi-3's {rope['rope_type']} RoPE is not supported (supported: default, longrope)"
            )
        return cls(**fields)


def to_lantern(hf: Mapping[str, np.ndarray], cfg: Phi3Config) -> Tensors:
    """Phi-3's fused checkpoint split into the Llama names for the Llama loader's name and shape
    checks; the fused parameters it makes (q, k, v and gate, up, the checkpoint's order) are then read
    straight from the fused tensors, with its finiteness check."""
    hf = Tensors.of(hf)
    q, kv, i = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim, cfg.intermediate_size
    loaders, shapes, fused_names = {}, {}, []
    for n in range(cfg.num_hidden_layers):
        p = f"model.layers.{n}"
        for fused, parts in (
            (f"{p}.self_attn.qkv_proj.weight", {"self_attn.q_proj": q, "self_attn.k_proj": kv, "self_attn.v_proj": kv}),
            (f"{p}.mlp.gate_up_proj.weight", {"mlp.gate_proj": i, "mlp.up_proj": i}),
        ):
            if fused not in hf:
                raise LanternError(f"checkpoint is missing tensor '{fused}'")
            rows, *rest = hf.shape(fused)
            if rows != sum(parts.values()):
                raise LanternError(f"tensor '{fused}' has {rows} rows, but the config implies {sum(parts.values())}")
            first, load = 0, hf.loader(fused)
            for part, count in parts.items():
                name = f"{p}.{part}.weight"
                loaders[name] = lambda load=load, a=first, b=first + count: load()[a:b]
                shapes[name] = (count, *rest)
                first += count
            fused_names.append(fused)
    out = llama_to_lantern(hf.replaced(loaders, shapes, drop=tuple(fused_names)), cfg)
    # the Llama loader fuses the parts back in the checkpoint's own order: read each fused tensor once,
    # not once per part
    return out.replaced({name: finite(name, hf.loader(name)) for name in fused_names})


def gguf_tensors(cfg: Phi3Config) -> list[GGUFTensor]:
    """llama.cpp's phi3 tensors: the model's fused matrices whole."""
    q, kv, i, h = (
        cfg.num_attention_heads * cfg.head_dim,
        cfg.num_key_value_heads * cfg.head_dim,
        cfg.intermediate_size,
        cfg.hidden_size,
    )
    out = gguf_outer_tensors(cfg)
    for n in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{n}", f"blk.{n}"
        out += [
            GGUFTensor(f"{b}.attn_norm.weight", f"{p}.input_layernorm.weight", 0, h),
            GGUFTensor(f"{b}.attn_qkv.weight", f"{p}.self_attn.qkv_proj.weight", 0, q + 2 * kv),
            GGUFTensor(f"{b}.attn_output.weight", f"{p}.self_attn.o_proj.weight", 0, h),
            GGUFTensor(f"{b}.ffn_norm.weight", f"{p}.post_attention_layernorm.weight", 0, h),
            GGUFTensor(f"{b}.ffn_up.weight", f"{p}.mlp.gate_up_proj.weight", 0, 2 * i),
            GGUFTensor(f"{b}.ffn_down.weight", f"{p}.mlp.down_proj.weight", 0, h),
        ]
    return out


_PHI3_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_up": "mlp.gate_up_proj",
    "ffn_down": "mlp.down_proj",
}

_FACTORS = ("rope_factors_short.weight", "rope_factors_long.weight")


def gguf_metadata(cfg: Phi3Config) -> dict:
    """llama.cpp's phi3 keys. For longrope, as llama.cpp's converter writes them: the claimed length
    as ``context_length``, the trained one and the attention factor under ``rope.scaling``, and the
    factors as tensors (``gguf_constants``). llama.cpp switches to the long factors past the trained
    length, so the GGUF keeps the model's whole context there."""
    meta = llama_gguf_metadata(cfg, "phi3")
    rope = cfg.rope_scaling
    if rope:
        original = rope["original_max_position_embeddings"]
        meta.update(
            {
                "phi3.context_length": round(original * rope["factor"]),
                "phi3.rope.scaling.original_context_length": original,
                "phi3.rope.scaling.attn_factor": float(rope["attention_factor"]),
            }
        )
    return meta


def gguf_constants(cfg: Phi3Config) -> dict[str, np.ndarray]:
    """Longrope's short and long factors, as llama.cpp's phi3 reads them (one F32 [head_dim / 2] each)."""
    rope = cfg.rope_scaling
    if not rope:
        return {}
    return dict(zip(_FACTORS, (np.array(rope["short_factor"]), np.array(rope["long_factor"]))))


def gguf_load_overrides(cfg: Phi3Config) -> dict[str, int]:
    """llama.cpp runs the long factors when its context (per sequence; the whole pool with a unified
    cache, as the llamacpp engine has it) exceeds ``original_context_length``. Told a length of 1 or
    of 2^31 - 1 at load, it runs the factors the build's context picked (rope.longrope_factors)
    whatever context it is given. (The key matters for nothing else here: llama.cpp's YaRN
    corrections are off for longrope.)"""
    rope = cfg.rope_scaling
    if not rope:
        return {}
    long = cfg.context_window_size > rope["original_max_position_embeddings"]
    return {"phi3.rope.scaling.original_context_length": 1 if long else 2**31 - 1}


_LAYOUT = gguf_layout(
    "phi3", "Phi3ForCausalLM", rope_permuted=False, tensors=gguf_tensors, layer_names=_PHI3_LAYER, unsupported=lambda cfg: None
)  # both of its RoPEs are written


def config_from_gguf(meta: dict, tensors: dict) -> dict:
    """A phi3 GGUF's config: Phi-3's window (llama.cpp's converter writes 0 for none, as for Phi-4),
    Phi-3.5's longrope factors from its two factor tensors."""
    cfg = _LAYOUT.config_from_metadata(meta, tensors)
    if meta.get("phi3.attention.sliding_window"):
        cfg["sliding_window"] = int(meta["phi3.attention.sliding_window"])
    if not set(_FACTORS) & set(tensors):
        return cfg
    factors = []
    for name in _FACTORS:
        if name not in tensors:
            raise LanternError(f"GGUF tensor '{name}' is missing: longrope needs both factor tensors")
        t = tensors[name]
        if t.tensor_type.name != "F32" or len(t.shape) != 1 or t.shape[0] != cfg["head_dim"] // 2:
            raise LanternError(
                f"GGUF tensor '{name}' is {t.tensor_type.name} {list(t.shape)}; longrope needs "
                f"F32 [{cfg['head_dim'] // 2}] (head_dim / 2)"
            )
        factors.append([float(f) for f in np.asarray(t.data, dtype=np.float32)])
    original = int(meta.get("phi3.rope.scaling.original_context_length", cfg["max_position_embeddings"]))
    cfg.update(
        original_max_position_embeddings=original,
        rope_scaling={"rope_type": "longrope", "short_factor": factors[0], "long_factor": factors[1]},
    )
    attn = meta.get("phi3.rope.scaling.attn_factor")
    expected = resolve_longrope(cfg, cfg["rope_scaling"], cfg["head_dim"], "rope_scaling")["attention_factor"]
    if attn is not None and not np.isclose(attn, expected, rtol=1e-5):
        raise LanternError(
            f"GGUF key 'phi3.rope.scaling.attn_factor' is {attn:g}, but longrope's for "
            f"{cfg['max_position_embeddings']} of {original} positions is {expected:.6g}"
        )
    return cfg


FAMILY = Family(
    name="phi3",
    architectures=("Phi3ForCausalLM",),
    config=Phi3Config,
    model=LlamaForCausalLM,
    to_lantern=to_lantern,
    calibration_forward=calibration_forward,
    gguf=dataclasses.replace(
        _LAYOUT,
        config_from_metadata=config_from_gguf,
        metadata=gguf_metadata,
        constants=gguf_constants,
        load_overrides=gguf_load_overrides,
    ),
)
