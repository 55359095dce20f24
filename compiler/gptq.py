"""Stage 2 with calibration text: GPTQ onto MLC's 4-bit grid.

Rounding each weight to its nearest level (``quantize.quantize_weight``) treats
every input channel alike. GPTQ (Frantar et al., 2022) quantizes a matrix one
input column at a time and moves each column's rounding error onto the columns
not yet quantized, weighted by ``H = X^T X`` of the inputs the layer really
sees, so that the layer's *outputs* stay close rather than its weights. The
stored layout does not change (only which code and scale each group gets), so
the artifact still loads in WebLLM.

Choices, measured on SmolLM2-135M (perplexity on held-out text):

* every group's scale is fixed before the sweep, picked among candidates to
  minimise the group's error weighted by ``diag(H)``;
* columns go in decreasing ``diag(H)`` order ("act order"), which fixed scales
  make safe;
* ``H`` is damped by 10% of its mean diagonal: less over-fits the calibration
  text, more throws away what it says (3% and 20% measured worse);
* a tied embedding table is quantized for its use as the output head, where
  its error costs most.

``quantize_calibrated`` runs the model family's numpy calibration forward to
get ``H`` for every quantized matrix.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
from scipy.linalg import blas, lapack
from threadpoolctl import threadpool_limits

from .errors import LanternError
from .quantize import QuantSpec, no_clip_scale, pack_codes, round_to_grid, stored_scale
from .tensors import Tensors

DEFAULT_CALIBRATION = Path(__file__).parent / "calibration_data" / "mixed_english.txt"
SEQUENCE_TOKENS = 512  # one calibration forward pass
MAX_TOKENS = 4096  # measured: 2048 and 4096 tokens calibrate equally well; the pass costs time per token
MIN_TOKENS = 64
DAMPING = 0.1
SCALE_CANDIDATES = np.linspace(0.6, 1.15, 48)  # times the no-clip scale
# The calibration pass reads a layer's weights once per sequence; its float weights are kept up to
# this much (one layer of a 4B model: Phi-3.5-mini's is 450 MB), and read again past it.
LAYER_CACHE_BYTES = 512 * 2**20


def text_hash(text_file: Path) -> str:
    """sha256 of a calibration text (part of the build cache key)."""
    if not text_file.is_file():
        raise LanternError(f"calibration text not found: {text_file}")
    return hashlib.sha256(text_file.read_bytes()).hexdigest()


@dataclass
class Calibration:
    """A calibration text cut into the token sequences the calibration pass runs."""

    text: str  # file name, for the manifest
    sha256: str
    sequences: list[list[int]]

    def manifest(self) -> dict:
        return {"method": "gptq", "text": self.text, "sha256": self.sha256, "tokens": sum(len(s) for s in self.sequences)}


def load_calibration(text_file: Path, tokenizer_json: str, context_window: int) -> Calibration:
    """Tokenize the text: sequences of ``SEQUENCE_TOKENS`` (or the context window, if shorter),
    the first ``MAX_TOKENS`` tokens in all."""
    from tokenizers import Tokenizer

    digest = text_hash(text_file)
    try:
        text = text_file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LanternError(f"calibration text {text_file.name} is not UTF-8 text") from None
    text = text[: MAX_TOKENS * 32]  # far more characters than MAX_TOKENS tokens take: a huge file is not tokenized whole
    ids = Tokenizer.from_str(tokenizer_json).encode(text, add_special_tokens=False).ids[:MAX_TOKENS]
    if len(ids) < MIN_TOKENS:
        raise LanternError(f"calibration text {text_file.name} has {len(ids)} tokens; GPTQ needs at least {MIN_TOKENS}")
    length = min(SEQUENCE_TOKENS, context_window)
    sequences = [ids[i : i + length] for i in range(0, len(ids), length)]
    return Calibration(text_file.name, digest, sequences)


def quantize_calibrated(
    forward: Callable,
    float_params: Mapping[str, np.ndarray],
    config,
    spec: QuantSpec,
    calibration: Calibration,
    on_weight: Callable[[str], None] = lambda name: None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """GPTQ every matrix the family's calibration pass observes: ``{name: (q_weight, q_scale)}``.

    ``forward(params, config, sequences, observe)`` calls ``observe(name, inputs)`` once per
    matrix, and leaves ``inputs`` unchanged afterwards. The pass runs on the float weights, so no
    matrix's quantization feeds the next: each is quantized on a worker thread while the pass goes
    on (numpy drops the GIL in its array work), from its inputs' statistics up, with at most
    ``WORK_BYTES`` of them waiting or running at a time (always at least one). The pass alone is
    the critical path (measured on a 1.5B model, 2 cores: the pass's thread never waited, the
    workers waited a third of the time), so it does nothing else. The result does not depend on the
    number of threads.
    """
    workers = max(1, min(4, os.cpu_count() or 1))
    # The pass and the workers run at once, each calling BLAS: left alone, every call would start a
    # thread per core, oversubscribing them (measured on 2 cores: SmolLM2's GPTQ 83 s -> 50 s with this).
    blas_threads = max(1, (os.cpu_count() or 1) // (workers + 1))
    budget = _Budget(WORK_BYTES)
    shapes = Tensors.of(float_params)
    futures: dict[str, Future] = {}

    def quantize(name: str, inputs: list[np.ndarray], cost: int) -> tuple[np.ndarray, np.ndarray]:
        try:
            hessian = input_statistics(inputs)
            inputs.clear()
            if not np.all(np.isfinite(hessian)):
                raise LanternError(
                    f"calibration: the inputs of '{name}' overflow on the calibration text "
                    "(the float model itself is broken there)"
                )
            return gptq_weight(float_params[name], hessian, spec)
        finally:
            budget.release(cost)

    with threadpool_limits(blas_threads, user_api="blas"), ThreadPoolExecutor(workers, thread_name_prefix="gptq") as pool:

        def observe(name: str, inputs: list[np.ndarray]) -> None:
            for future in futures.values():  # a job that failed stops the pass now, not at its end
                if future.done() and future.exception() is not None:
                    future.result()
            width, tokens = inputs[0].shape[1], sum(len(x) for x in inputs)
            # what the job holds: its inputs (and their float32 copy), the statistics, gptq_weight's
            # copy of them (factored in place), the float weight
            cost = 2 * 4 * tokens * width + 2 * 4 * width * width + 4 * shapes.size(name)
            budget.acquire(cost)
            futures[name] = pool.submit(quantize, name, list(inputs), cost)
            futures[name].add_done_callback(lambda _, name=name: on_weight(name))  # type: ignore[misc]  # mypy#15459

        try:
            forward(float_params, config, calibration.sequences, observe)
        except BaseException:
            for future in futures.values():
                future.cancel()
            raise
        return {name: future.result() for name, future in futures.items()}


# GPTQ jobs (statistics, their factor, the float weight) waiting or running at once: a 1.5B model's
# down_proj job is ~0.8 GB (8960 inputs), so the next layer's small jobs run beside it.
WORK_BYTES = 3 * 2**30 // 2


class _Budget:
    """Bytes of work admitted at once; one job larger than the whole budget runs alone."""

    def __init__(self, limit: int):
        self.limit, self.used, self.changed = limit, 0, threading.Condition()

    def acquire(self, n: int) -> None:
        with self.changed:
            self.changed.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n

    def release(self, n: int) -> None:
        with self.changed:
            self.used -= n
            self.changed.notify_all()


SEARCH_CHUNK = 8192  # groups searched at a time: the arrays of a chunk stay in cache


def search_scale(groups: np.ndarray, importance: np.ndarray, spec: QuantSpec) -> np.ndarray:
    """Per group of ``groups[out, g, 32]``: the scale (as stored) with the least importance-weighted
    rounding error. Each candidate is also refitted by least squares to its own codes.

    The search works on the transposed layout ``[32, groups]``: a group's scale then broadcasts
    along the contiguous axis and its sums run across rows, which numpy does several times faster
    than 32-element reductions (measured 4x on SmolLM2's matrices; the errors are the same sums,
    rounded in another order)."""
    rows, n_groups, g = groups.shape
    values = groups.reshape(-1, g).T  # [32, rows * n_groups], a strided view
    weights = np.broadcast_to(importance.astype(np.float32).T[:, None, :], (g, rows, n_groups)).reshape(g, -1)
    best_all = np.empty(rows * n_groups, np.float32)
    lo, hi = np.float32(-spec.max_int), np.float32(spec.max_int + 1)
    for c0 in range(0, rows * n_groups, SEARCH_CHUNK):
        x = np.ascontiguousarray(values[:, c0 : c0 + SEARCH_CHUNK])
        imp = np.ascontiguousarray(weights[:, c0 : c0 + SEARCH_CHUNK])
        imp_x = imp * x
        levels, work = np.empty_like(x), np.empty_like(x)

        # (B023: error and keep run within this iteration, on this chunk's arrays)
        def error(scale: np.ndarray) -> np.ndarray:
            """Weighted error of ``scale``; leaves ``round_to_grid(x, scale) - max_int`` (levels -7..8) in
            ``levels``, computed in place: this runs 97 times per matrix."""
            np.divide(x, np.where(scale == 0, np.float32(1), scale), out=levels)  # noqa: B023
            np.clip(np.rint(levels, out=levels), lo, hi, out=levels)  # noqa: B023
            np.subtract(x, np.multiply(levels, scale, out=work), out=work)  # noqa: B023
            return np.multiply(np.square(work, out=work), imp, out=work).sum(0)  # noqa: B023

        base = no_clip_scale(x.T, spec)[:, 0]
        base = np.where(base > 0, base, np.float32(1e-12))
        best = stored_scale(base, spec)
        best_err = error(best)

        def keep(scale: np.ndarray, err: np.ndarray) -> None:
            nonlocal best, best_err
            better = err < best_err
            best, best_err = np.where(better, scale, best), np.where(better, err, best_err)

        for factor in SCALE_CANDIDATES:
            scale = stored_scale(base * factor, spec)
            keep(scale, error(scale))
            num = np.multiply(imp_x, levels, out=work).sum(0)
            den = np.multiply(np.square(levels, out=work), imp, out=work).sum(0)
            refit = stored_scale(num / np.maximum(den, 1e-30), spec)
            refit = np.where(refit > 0, refit, scale)
            keep(refit, error(refit))
        best_all[c0 : c0 + SEARCH_CHUNK] = best
    return best_all.reshape(rows, n_groups, 1)


ROW_CHUNK = 4096  # output rows swept at a time: GPTQ treats rows independently, and a chunk's arrays stay in cache


def input_statistics(inputs: list[np.ndarray]) -> np.ndarray:
    """``H = X^T X / tokens`` (float32 ``[in, in]``) of a matrix's inputs over every calibration
    sequence. BLAS's symmetric rank-k update fills one triangle (half a product's work; on a 1.5B
    model's 8960-wide down_proj inputs 1.9 s where float64's ``x.T @ x`` took 4.0 s, one thread),
    mirrored in place. float32 sums of ~2,000 tokens differ from float64's by ~2e-7 relative."""
    x = np.concatenate(inputs, dtype=np.float32)
    h = blas.ssyrk(1.0 / len(x), x, trans=1, lower=0)  # the upper triangle, Fortran order
    del x
    for r0 in range(0, len(h), MIRROR_ROWS):
        r1 = min(r0 + MIRROR_ROWS, len(h))
        h[r0:r1, :r0] = h[:r0, r0:r1].T
        tile = h[r0:r1, r0:r1]
        tile[:] = np.triu(tile) + np.triu(tile, 1).T
    return h.T  # the same symmetric matrix, C-contiguous


MIRROR_ROWS = 1024  # rows of H mirrored at a time: a block's temporaries stay small


def gptq_weight(
    w: np.ndarray, hessian: np.ndarray, spec: QuantSpec, block: int = 128, precision: type[np.floating] = np.float32
) -> tuple[np.ndarray, np.ndarray]:
    """Quantize ``w[out, in]`` against input statistics ``hessian[in, in]``; same result type as
    ``quantize.quantize_weight``. Every output row is quantized on its own (the statistics are
    shared), so a tall matrix (a 262,144-row output head) goes ``ROW_CHUNK`` rows at a time, the
    chunks spread over the cores; the result does not depend on the chunking. Besides ``hessian``,
    one copy of it is made in ``precision``: the inverse is factored in place.

    float32 factoring is 2.4x float64's time on a 1.5B model's 8960-wide down_proj (4.7 s against
    11.1 s, one thread) and its factor differs by ~5e-5 relative: the damping below bounds the
    condition number by 10x the width. Where float32 still loses definiteness, float64 factors again."""
    out_dim, in_dim = w.shape
    g = spec.group_size
    diag = np.diag(hessian).astype(np.float64)
    dead = diag <= 0  # an input that never fires: any code does, keep the plain rounding
    damped = np.where(dead, 1.0, diag)
    damped += DAMPING * np.mean(damped)
    order = np.argsort(-damped, kind="stable")
    # the statistics in sweep order, then reversed (what the in-place factoring takes): one copy
    reversed_order = order[::-1]
    h = hessian[np.ix_(reversed_order, reversed_order)].astype(precision, copy=False)
    gone = dead[reversed_order]
    h[gone, :], h[:, gone] = 0.0, 0.0
    h[np.diag_indices(in_dim)] = damped[reversed_order]
    try:
        u = _inverse_cholesky_upper_of_reversed(h)  # a view of h
    except np.linalg.LinAlgError:
        u = None
    del h
    if u is None:
        if precision != np.float64:
            return gptq_weight(w, hessian, spec, block, np.float64)
        raise LanternError(f"GPTQ: the calibration statistics of a {out_dim}x{in_dim} matrix are not positive definite")
    u = u.astype(np.float32, copy=False)
    importance = diag.reshape(in_dim // g, g)
    starts = range(0, out_dim, ROW_CHUNK)
    with ThreadPoolExecutor(max(1, min(len(starts), os.cpu_count() or 1))) as pool:  # numpy drops the GIL
        chunks = list(
            pool.map(lambda r: _sweep(w[r : r + ROW_CHUNK].astype(np.float32), importance, u, order, spec, block), starts)
        )
    return np.concatenate([q for q, _ in chunks]), np.concatenate([s for _, s in chunks])


def inverse_cholesky_upper(h: np.ndarray) -> np.ndarray:
    """The upper triangular ``U`` with ``U^T U = H^-1``: row j holds how column j's rounding error
    spreads to the later columns. Without forming ``H^-1``: with ``J`` the order reversal and
    ``J H J = L L^T``, ``H = R R^T`` for the upper ``R = J L J``, so ``U = R^-1 = J L^-1 J``
    (a third of inverting ``H`` and factoring the inverse)."""
    return _inverse_cholesky_upper_of_reversed(np.array(h[::-1, ::-1], dtype=np.float64, order="C"))


def _inverse_cholesky_upper_of_reversed(a: np.ndarray) -> np.ndarray:
    """``inverse_cholesky_upper(H)`` from ``a = J H J`` (C-contiguous float32 or float64), computed in
    ``a``'s own memory by LAPACK (potrf, then trtri); the result is a (Fortran-order) view of ``a``.
    A symmetric matrix's transpose is itself, so ``a.T`` is the same matrix in Fortran order, which
    LAPACK takes in place. Reversing both axes of ``a``'s C-contiguous buffer is reversing the buffer,
    done here in place so that the sweep reads ``U`` in order."""
    potrf, trtri = lapack.get_lapack_funcs(("potrf", "trtri"), (a,))
    lower, info = potrf(a.T, lower=1, overwrite_a=1, clean=1)  # L, zeros above the diagonal
    if info != 0:
        raise np.linalg.LinAlgError(f"potrf: not positive definite (info {info})")
    inverse, info = trtri(lower, lower=1, overwrite_c=1)  # L^-1, still lower
    if info != 0:
        raise np.linalg.LinAlgError(f"trtri: singular factor (info {info})")
    assert np.shares_memory(inverse, a), "LAPACK copied the statistics instead of working in place"
    flat = a.reshape(-1)
    n = len(flat)
    for i in range(0, n // 2, REVERSE_CHUNK):  # swap the ends a chunk at a time: no second copy
        k = min(REVERSE_CHUNK, n // 2 - i)
        head = flat[i : i + k].copy()
        flat[i : i + k] = flat[n - i - k : n - i][::-1]
        flat[n - i - k : n - i] = head[::-1]
    return inverse  # a.T: L^-1 was lower in a.T, so J L^-1 J is upper


REVERSE_CHUNK = 1 << 20


def _sweep(
    w: np.ndarray, importance: np.ndarray, u: np.ndarray, order: np.ndarray, spec: QuantSpec, block: int
) -> tuple[np.ndarray, np.ndarray]:
    """GPTQ's column sweep over some rows of a matrix: their (q_weight, q_scale), packed here so that
    a tall matrix's float codes never exist whole."""
    rows, in_dim = w.shape
    g = spec.group_size
    scale = search_scale(w.reshape(rows, in_dim // g, g), importance, spec)[..., 0]
    # Transposed ([in, rows], in sweep order): each column the sweep visits is a contiguous row.
    work = np.ascontiguousarray(w.T[order])
    col_scale = np.ascontiguousarray(scale.T[order // g])
    codes = np.empty((in_dim, rows), np.float32)
    # the in-block update's product, made in one buffer: a new one per column was allocated and
    # faulted in each time (the sweep 12% slower at 8960 wide, measured; the codes are the same)
    scratch = np.empty((block, rows), np.float32)
    for b0 in range(0, in_dim, block):
        b1 = min(b0 + block, in_dim)
        errors = np.empty((b1 - b0, rows), np.float32)
        for j in range(b0, b1):
            col, s = work[j], col_scale[j]
            codes[j] = round_to_grid(col, s, spec)
            err = np.subtract(col, (codes[j] - spec.max_int) * s, out=errors[j - b0])
            err /= u[j, j]
            spread = np.multiply(u[j, j:b1, None], err, out=scratch[: b1 - j])
            work[j:b1] -= spread
        work[b1:] -= u[b0:b1, b1:].T @ errors
    return pack_codes(codes[np.argsort(order)].T, scale, spec)
