"""A whole Llama forward pass in numpy, read top to bottom: the reference the tests trust.

Weights use Hugging Face names and float32. No KV cache: every call runs the
full sequence, which is slow but obviously right.
"""

import numpy as np


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, positions, theta):
    # x: [seq, heads, head_dim]; HF "rotate half" convention.
    half = x.shape[-1] // 2
    inv_freq = 1.0 / theta ** (np.arange(half, dtype=np.float64) * 2 / x.shape[-1])
    angles = positions[:, None].astype(np.float64) * inv_freq[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(np.float32)


def forward(w: dict, cfg: dict, tokens: list[int]) -> np.ndarray:
    """Logits [len(tokens), vocab] for every position."""
    n_heads, n_kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_heads
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    seq = len(tokens)
    pos = np.arange(seq)
    x = w["model.embed_tokens.weight"][tokens].astype(np.float32)
    causal = np.triu(np.full((seq, seq), -np.inf, dtype=np.float32), k=1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(seq, n_heads, head_dim)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(seq, n_kv, head_dim)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(seq, n_kv, head_dim)
        q, k = rope(q, pos, theta), rope(k, pos, theta)
        k = np.repeat(k, n_heads // n_kv, axis=1)  # grouped-query attention
        v = np.repeat(v, n_heads // n_kv, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(head_dim) + causal
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(seq, n_heads * head_dim)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T


def greedy(w: dict, cfg: dict, tokens: list[int], n: int) -> list[int]:
    tokens = list(tokens)
    out = []
    for _ in range(n):
        nxt = int(np.argmax(forward(w, cfg, tokens)[-1]))
        out.append(nxt)
        tokens.append(nxt)
    return out
