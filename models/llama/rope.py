"""RoPE computed in the model, for what TVM's KV cache cannot rotate itself: Gemma 3's two bases
(one per layer kind) and Phi-3.5's longrope (TVM 0.27's longrope kernel does not parse). A model
that rotates q and k here creates its KV cache with ``RopeMode.NONE``."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from lantern.errors import LanternError


def rope(
    x: nn.Tensor,
    positions: nn.Tensor,
    theta: float,
    scale: float = 1.0,
    factors: Sequence[float] | None = None,
    magnitude: float = 1.0,
) -> nn.Tensor:
    """Rotate-half RoPE of ``x[b, s, heads, d]`` at ``positions[b * s]`` (the KV cache's query
    positions), in float32 as transformers computes it: angle = (pos / scale) * inv_freq[i] with
    inv_freq[i] = 1 / (factors[i] * theta^(2i/d)) (``factors``: longrope's, else 1), and cos/sin
    times ``magnitude`` (longrope's attention factor)."""

    def compute(xt: te.Tensor, pos: te.Tensor) -> te.Tensor:
        s, d = xt.shape[1], int(xt.shape[3])
        half = d // 2
        # longrope's per-frequency divisors, unrolled into a select chain (``half`` constants)
        divisor: Callable[[Any], Any] | None = None
        if factors is not None:

            def divisor(j):
                out = tirx.const(float(factors[half - 1]), "float32")
                for i in range(half - 2, -1, -1):
                    out = tirx.Select(j == i, tirx.const(float(factors[i]), "float32"), out)
                return out

        def element(b, t, h, i):
            j = tirx.floormod(i, half)
            base = tirx.power(tirx.const(theta, "float32"), tirx.Cast("float32", 2 * j) / tirx.const(float(d), "float32"))
            inv_freq = tirx.const(1.0, "float32") / (base * divisor(j) if divisor else base)
            angle = tirx.Cast("float32", pos[b * s + t]) / tirx.const(scale, "float32") * inv_freq
            value = tirx.Cast("float32", xt[b, t, h, i])
            partner = tirx.if_then_else(
                i < half, -tirx.Cast("float32", xt[b, t, h, i + half]), tirx.Cast("float32", xt[b, t, h, i - half])
            )
            m = tirx.const(magnitude, "float32")
            return tirx.Cast(xt.dtype, value * (tirx.cos(angle) * m) + partner * (tirx.sin(angle) * m))

        return te.compute(xt.shape, element, name="rope")

    return op.tensor_expr_op(compute, "rope", [x, positions])


def resolve_longrope(cfg: dict[str, Any], rope: dict[str, Any], head_dim: int, key: str) -> dict[str, Any]:
    """A config's longrope, resolved as transformers resolves it: the scale is ``factor``, else
    max_position_embeddings / original_max_position_embeddings (kept as ``factor``); the attention
    factor is sqrt(1 + ln(scale) / ln(original)), kept in the result for ``longrope_factors``."""
    original = rope.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
    if not original:
        raise LanternError(f"config.json field '{key}': longrope needs original_max_position_embeddings")
    for name in ("short_factor", "long_factor"):
        factors = rope.get(name)
        if not isinstance(factors, list) or len(factors) != head_dim // 2:
            raise LanternError(
                f"config.json field '{key}.{name}': expected {head_dim // 2} factors (head_dim / 2), "
                f"got {len(factors) if isinstance(factors, list) else factors!r}"
            )
    scale = float(rope.get("factor") or cfg.get("max_position_embeddings", original) / original)
    default = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
    given = rope.get("attention_factor")
    if given is not None and not math.isclose(float(given), default, rel_tol=1e-6):
        raise LanternError(
            f"config.json field '{key}.attention_factor': {given} differs from longrope's "
            f"{default:.6g} for this scale, which is the only one supported"
        )
    return {
        "rope_type": "longrope",
        "short_factor": [float(f) for f in rope["short_factor"]],
        "long_factor": [float(f) for f in rope["long_factor"]],
        "original_max_position_embeddings": int(original),
        "factor": scale,
        "attention_factor": default,
    }


def longrope_factors(rope_scaling: dict[str, Any], context: int) -> tuple[list[float], float]:
    """(factors, attention factor) of a longrope config from ``resolve_longrope`` for a model run with
    ``context`` tokens: the short factors when the context is within original_max_position_embeddings,
    else the long ones at every position. This is llama.cpp's rule (it picks by the context it is given).
    transformers picks per forward pass by the sequence's length, which a KV cache cannot follow (the
    keys already cached were rotated with the other factors), so the two agree on every sequence when
    the context is within the original length, and on sequences longer than it otherwise."""
    if context > rope_scaling["original_max_position_embeddings"]:
        return list(rope_scaling["long_factor"]), rope_scaling["attention_factor"]
    return list(rope_scaling["short_factor"]), rope_scaling["attention_factor"]


def resolve_yarn(cfg: dict[str, Any], rope: dict[str, Any], head_dim: int, theta: float, key: str) -> dict[str, Any]:
    """A config's YaRN, resolved as transformers resolves it (``_compute_yarn_parameters``): each
    frequency's divisor (``factors``: 1 where the ramp extrapolates, ``factor`` where it interpolates,
    blended between ``beta_fast`` and ``beta_slow`` rotations over the original length) and the
    attention factor on cos and sin (0.1 ln(factor) + 1 unless given). Rotated in the model as
    longrope is: TVM 0.27's YaRN kernel leaves the attention factor out."""
    original = rope.get("original_max_position_embeddings") or cfg.get("max_position_embeddings")
    factor = rope.get("factor") or (cfg.get("max_position_embeddings", 0) / original if original else None)
    if not original or not factor or factor < 1:
        raise LanternError(f"config.json field '{key}': YaRN needs a factor of at least 1 and original_max_position_embeddings")
    factor = float(factor)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = rope.get("attention_factor")
    if attention is None:
        ms, ms_all = rope.get("mscale"), rope.get("mscale_all_dim")
        attention = mscale(factor, ms) / mscale(factor, ms_all) if ms and ms_all else mscale(factor)
    beta_fast, beta_slow = float(rope.get("beta_fast") or 32), float(rope.get("beta_slow") or 1)
    truncate = bool(rope.get("truncate", True))

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    factors = []
    for i in range(head_dim // 2):
        extrapolate = 1.0 - min(max((i - low) / (high - low), 0.0), 1.0)  # 1: the frequency as trained
        factors.append(1.0 / ((1.0 - extrapolate) / factor + extrapolate))
    return {
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": int(original),
        "beta_fast": beta_fast,
        "beta_slow": beta_slow,
        "truncate": truncate,
        "attention_factor": float(attention),
        "factors": factors,
    }


def model_rotation(rope_scaling: dict[str, Any], context: int, head_dim: int) -> tuple[list[float], float] | None:
    """(per-frequency divisors, attention factor) of a RoPE the model rotates itself (longrope, YaRN,
    linear, llama3 given as factors, as read from a GGUF's rope_freqs; its KV cache then rotates
    nothing), or None for one the KV cache rotates (plain, llama3 from a config.json). Linear is
    rotated here because TVM 0.27's KV cache multiplies positions by its integer ``rope_scale``
    where linear scaling divides them by the factor."""
    kind = rope_scaling.get("rope_type")
    if kind == "linear":
        return [float(rope_scaling["factor"])] * (head_dim // 2), 1.0
    if kind == "llama3" and "factors" in rope_scaling:
        return list(rope_scaling["factors"]), 1.0
    if kind == "longrope":
        return longrope_factors(rope_scaling, context)
    if kind == "yarn":
        return list(rope_scaling["factors"]), rope_scaling["attention_factor"]
    return None
