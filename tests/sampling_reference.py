"""numpy statements of what each sampling function must compute (MLC's semantics)."""

import numpy as np

V = 49152  # SmolLM2's vocabulary: the size the kernels must be right at


def nucleus_logits(size: int, seed: int) -> np.ndarray:
    """Logits whose top-`size` tokens hold ~all the mass, shuffled across the vocabulary."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(-30, 1, V).astype(np.float32)
    top = rng.choice(V, size, replace=False)
    logits[top] = rng.normal(5, 1, size).astype(np.float32)
    return logits


def softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    if temperature <= 1e-5:  # greedy: one-hot over the maxima
        hot = (logits == logits.max()).astype(np.float64)
        return hot / hot.sum()
    z = logits.astype(np.float64) / temperature
    e = np.exp(z - z.max())
    return e / e.sum()


def argsort_desc(probs: np.ndarray) -> np.ndarray:
    """Descending by probability, ties by ascending token id."""
    return np.lexsort((np.arange(probs.size), -probs))


def top_p_token(sorted_probs: np.ndarray, sorted_ids: np.ndarray, u: float, top_p: float) -> int:
    c = np.cumsum(sorted_probs.astype(np.float64))
    end = int(np.searchsorted(c, top_p, side="left"))  # first index with c >= top_p
    end = min(end, c.size - 1)
    j = int(np.searchsorted(c, u * c[end], side="right"))  # first index with c > u * mass
    return int(sorted_ids[min(j, end)])


def penalized(logits, token_ids, counts, presence, frequency, repetition):
    out = logits.copy()
    for t, n in zip(token_ids, counts):
        v = out[t] - presence - n * frequency
        out[t] = v * repetition if v < 0 else v / repetition
    return out
