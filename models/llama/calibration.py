"""The Llama family's calibration pass: a plain numpy forward over Lantern's float parameters.

GPTQ (``lantern.gptq``) needs the inputs every quantized matrix sees on real
text. The compiled model cannot report them, so this pass recomputes the
network in numpy without a KV cache, one layer at a time over all calibration
sequences, and hands each matrix's inputs to ``observe`` as soon as they are
known: the caller can quantize that matrix and drop its statistics before the
next layer, so memory stays at one layer's worth. It only gathers statistics:
RoPE scaling variants are left out (plain RoPE), which shifts what is observed
slightly but never what the artifact computes.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .model import LlamaConfig
from .rope import model_rotation

Observe = Callable[[str, list[np.ndarray]], None]


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _rope(x: np.ndarray, theta: float, scale: float = 1.0, rope_scaling: dict | None = None, context: int = 0) -> np.ndarray:
    """x[seq, heads, head_dim] at positions 0..seq-1 (divided by a linear ``scale``), rotate-half convention.
    Phi-3.5's longrope and YaRN (``rope_scaling``) divide each frequency by its factor for a
    ``context``-token model (rope.model_rotation) and scale cos/sin."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / theta ** (np.arange(half, dtype=np.float64) * 2 / x.shape[-1])
    magnitude = 1.0
    rotation = model_rotation(rope_scaling or {}, context, x.shape[-1])
    if rotation:
        factors, magnitude = rotation
        inv_freq = inv_freq / np.asarray(factors, dtype=np.float64)
    angles = (np.arange(x.shape[0], dtype=np.float64) / scale)[:, None] * inv_freq[None, :]
    cos, sin = magnitude * np.cos(angles)[:, None, :], magnitude * np.sin(angles)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(np.float32)


def _attention(h: np.ndarray, params: dict[str, np.ndarray], i: int, cfg: LlamaConfig) -> np.ndarray:
    """Causal grouped-query self-attention of one sequence in layer ``i``; returns the o_proj input
    [seq, heads * dim]. Applies the q/k/v bias, the per-head q/k norms and the sliding window where
    the config has them."""
    p = f"model.layers.{i}"
    seq, heads, kv, dim = h.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    qkv = h @ params[f"{p}.self_attn.qkv_proj.weight"].T
    if cfg.attention_bias:
        qkv = qkv + params[f"{p}.self_attn.qkv_proj.bias"]
    q, k, v = np.split(qkv, [heads * dim, (heads + kv) * dim], axis=1)
    q, k = q.reshape(seq, heads, dim), k.reshape(seq, kv, dim)
    if cfg.qk_norm:
        q = _rms_norm(q, params[f"{p}.self_attn.q_norm.weight"], cfg.rms_norm_eps)
        k = _rms_norm(k, params[f"{p}.self_attn.k_norm.weight"], cfg.rms_norm_eps)
    q, k = (_rope(x, cfg.rope_theta, rope_scaling=cfg.rope_scaling, context=cfg.context_window_size) for x in (q, k))
    return grouped_attention(q, k, v.reshape(seq, kv, dim), 1 / np.sqrt(dim), cfg.layer_window(i))


def grouped_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, window: int = 0, softcap: float = 0.0
) -> np.ndarray:
    """Causal softmax attention of q[seq, heads, dim] over k, v[seq, kv_heads, dim] (each kv head
    shared by heads / kv_heads query heads), scores times ``scale`` (then ``softcap * tanh(s /
    softcap)`` when it is set); a ``window`` > 0 lets each position see only the last ``window``
    ones. Returns [seq, heads * dim]."""
    seq, heads, dim = q.shape
    kv = k.shape[1]
    # Batched matmuls (BLAS), one per kv head over its group's query heads: ~6x einsum's time.
    grouped_q = q.transpose(1, 0, 2).reshape(kv, heads // kv * seq, dim)
    scores = (grouped_q @ k.transpose(1, 2, 0)).reshape(heads, seq, seq) * scale
    if softcap:
        scores = softcap * np.tanh(scores / softcap)
    distance = np.arange(seq)[:, None] - np.arange(seq)[None, :]
    masked = (distance < 0) | (distance >= window) if window else distance < 0
    scores = np.where(masked, -np.inf, scores)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = probs.reshape(kv, heads // kv * seq, seq) @ v.transpose(1, 0, 2)
    return out.reshape(heads, seq, dim).transpose(1, 0, 2).reshape(seq, heads * dim)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def embedded(params: dict[str, np.ndarray], sequences: list[list[int]], scale: float | None = None) -> list[np.ndarray]:
    """Each sequence's rows of the embedding table as float32 (times ``scale`` in models that scale them)."""
    embed = params["model.embed_tokens.weight"]  # read once: a large table is not kept between reads
    if scale is None:
        return [embed[s].astype(np.float32) for s in sequences]
    return [embed[s].astype(np.float32) * np.float32(scale) for s in sequences]


def observed_attention(
    params: dict[str, np.ndarray], xs: list[np.ndarray], i: int, cfg: LlamaConfig, attention: Callable, observe: Observe
) -> list[np.ndarray]:
    """Layer ``i``'s self-attention of each hidden state in ``xs``: the input norm, then ``attention(h,
    params, i, cfg)``; returns the o_proj inputs. Observes the qkv and o_proj inputs on the way."""
    p = f"model.layers.{i}"
    hs = [_rms_norm(x, params[f"{p}.input_layernorm.weight"], cfg.rms_norm_eps) for x in xs]
    observe(f"{p}.self_attn.qkv_proj.weight", hs)
    attn = [attention(h, params, i, cfg) for h in hs]
    observe(f"{p}.self_attn.o_proj.weight", attn)
    return attn


def observed_mlp(
    params: dict[str, np.ndarray], xs: list[np.ndarray], i: int, norm: str, eps: float, activation: Callable, observe: Observe
) -> list[np.ndarray]:
    """Layer ``i``'s gated MLP of each hidden state in ``xs`` after the norm ``norm``: ``activation(gate)
    * up``, the down_proj inputs. Observes the gate_up and down_proj inputs on the way."""
    p = f"model.layers.{i}"
    hs = [_rms_norm(x, params[f"{p}.{norm}.weight"], eps) for x in xs]
    observe(f"{p}.mlp.gate_up_proj.weight", hs)
    acts = []
    for h in hs:
        gate, up = np.split(h @ params[f"{p}.mlp.gate_up_proj.weight"].T, 2, axis=1)
        acts.append(activation(gate) * up)
    observe(f"{p}.mlp.down_proj.weight", acts)
    return acts


def observed_head(params: dict[str, np.ndarray], xs: list[np.ndarray], cfg: LlamaConfig, observe: Observe) -> list[np.ndarray]:
    """The final norm of each hidden state in ``xs``, observed as the output head's input (a tied
    embedding table being the head); returns them."""
    hs = [_rms_norm(x, params["model.norm.weight"], cfg.rms_norm_eps) for x in xs]
    observe("model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight", hs)
    return hs


def calibration_forward(
    params: dict[str, np.ndarray], cfg: LlamaConfig, sequences: list[list[int]], observe: Observe
) -> list[np.ndarray]:
    """Run every sequence through the float model; returns the final normed hidden states.

    ``observe(name, inputs)`` is called once for every matrix in
    ``cfg.quantized_weights()`` that multiplies activations, in network order,
    with its input ``[seq, in]`` for each sequence; the output head comes last
    (a tied embedding table is observed as the head).
    """
    eps = cfg.rms_norm_eps
    xs = embedded(params, sequences)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        attn = observed_attention(params, xs, i, cfg, _attention, observe)
        xs = [x + a @ params[f"{p}.self_attn.o_proj.weight"].T for x, a in zip(xs, attn)]
        acts = observed_mlp(params, xs, i, "post_attention_layernorm", eps, _silu, observe)
        xs = [x + a @ params[f"{p}.mlp.down_proj.weight"].T for x, a in zip(xs, acts)]
    return observed_head(params, xs, cfg, observe)
