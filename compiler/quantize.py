"""Stage 2: quantization. Owns the weight layouts and the layers that read them.

Layouts follow MLC LLM so artifacts load in WebLLM too:

* ``q0f32`` / ``q0f16``: plain weights in float32 / float16.
* ``q4f32_1`` / ``q4f16_1``: symmetric group quantization along the input axis.
  Each group of 32 consecutive input elements shares one scale; every element
  is stored as a code q in 0..15 that dequantizes to ``(q - 7) * scale``, eight
  4-bit codes packed into one uint32 (element ``j`` of the eight in bits
  ``4j..4j+3``). Two encoders choose scales and codes: rounding to nearest
  (``quantize_weight``) and GPTQ on calibration text (``gptq.py``). A weight ``[out, in]`` becomes
  ``q_weight: uint32[out, in / 8]`` and ``q_scale: dtype[out, in / 32]``.

The numpy packer and the TVM layers below are the two halves of the same
layout; tests check one against the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from .errors import LanternError
from .tensors import Tensors


@dataclass(frozen=True)
class QuantSpec:
    """A quantization scheme: its name, the model's compute dtype and its group size."""

    name: str
    model_dtype: str  # activations, norms and (for q4) scales
    bits: int  # 0 means unquantized
    group_size: int = 32

    @property
    def quantized(self) -> bool:
        return self.bits > 0

    @property
    def needs_shader_f16(self) -> bool:
        return self.model_dtype == "float16"

    @property
    def per_uint32(self) -> int:
        return 32 // self.bits

    @property
    def max_int(self) -> int:
        return (1 << (self.bits - 1)) - 1


QUANTIZATIONS: dict[str, QuantSpec] = {
    "q0f32": QuantSpec("q0f32", "float32", 0),
    "q0f16": QuantSpec("q0f16", "float16", 0),
    "q4f32_1": QuantSpec("q4f32_1", "float32", 4),
    "q4f16_1": QuantSpec("q4f16_1", "float16", 4),
}


def get_quantization(name: str) -> QuantSpec:
    if name not in QUANTIZATIONS:
        raise LanternError(f"unknown quantization '{name}' (choose one of: {', '.join(QUANTIZATIONS)})")
    return QUANTIZATIONS[name]


# --------------------------------------------------------------------------- numpy side


def check_quantizable(name: str, shape: tuple[int, ...], spec: QuantSpec) -> None:
    """Raise a one-line error when a weight's input dim does not split into groups."""
    if spec.quantized and shape[-1] % spec.group_size != 0:
        raise LanternError(
            f"{spec.name} cannot quantize '{name}': its input dimension {shape[-1]} is not "
            f"divisible by the group size {spec.group_size} (use q0f32 or q0f16)"
        )


def round_to_grid(w: np.ndarray, scale: np.ndarray, spec: QuantSpec) -> np.ndarray:
    """Nearest codes 0..15 of ``w`` on the grid ``(q - 7) * scale`` (``scale`` broadcasts over ``w``)."""
    safe = np.where(scale == 0, 1.0, scale)
    return np.clip(np.round(w / safe) + spec.max_int, 0, 2 * spec.max_int + 1)


def stored_scale(scale: np.ndarray, spec: QuantSpec) -> np.ndarray:
    """``scale`` as the model dtype will hold it (float32 values). Codes are chosen against this
    rounded scale, so dequantization reproduces exactly what the encoder measured."""
    return np.maximum(scale, 0).astype(spec.model_dtype).astype(np.float32)


def pack_codes(codes: np.ndarray, scale: np.ndarray, spec: QuantSpec) -> tuple[np.ndarray, np.ndarray]:
    """Codes ``[out, in]`` (0..15) and scales ``[out, in/32]`` -> (q_weight uint32[out, in/8], q_scale)."""
    out_dim, in_dim = codes.shape
    q = codes.astype(np.uint32).reshape(out_dim, in_dim // spec.per_uint32, spec.per_uint32)
    shifts = (np.arange(spec.per_uint32, dtype=np.uint32) * spec.bits)[None, None, :]
    packed = np.bitwise_or.reduce(q << shifts, axis=-1).astype(np.uint32)
    return packed, scale.reshape(out_dim, -1).astype(spec.model_dtype)


def no_clip_scale(groups: np.ndarray, spec: QuantSpec) -> np.ndarray:
    """Per group (last axis): the smallest scale whose grid covers the group's extremes."""
    return np.maximum(groups.max(axis=-1, keepdims=True) / (spec.max_int + 1), -groups.min(axis=-1, keepdims=True) / spec.max_int)


ROWS_AT_ONCE = 8192  # rows quantized at a time: a 152k-row embedding's temporaries stay small


def quantize_weight(w: np.ndarray, spec: QuantSpec) -> tuple[np.ndarray, np.ndarray]:
    """Pack a float ``[out, in]`` matrix into (q_weight uint32[out, in/8], q_scale[out, in/32]).

    The encoder without calibration data (see ``gptq.py`` for the one with).
    Dequantization is MLC's ``(q - 7) * scale`` with q in 0..15, so levels run
    from -7 to +8 steps. MLC picks ``scale = max|w| / 7`` and never uses +8; here
    the scale is the smallest that fits the group without clipping either end
    (``max(largest / 8, -smallest / 7)``), which is never coarser. No value is
    clipped: outlier weights matter more to a language model than the mean error.
    Rows are independent, so a tall matrix goes ``ROWS_AT_ONCE`` rows at a time.
    """
    out_dim, in_dim = w.shape
    q_weight = np.empty((out_dim, in_dim // spec.per_uint32), np.uint32)
    q_scale = np.empty((out_dim, in_dim // spec.group_size), spec.model_dtype)
    for r in range(0, out_dim, ROWS_AT_ONCE):
        rows = w[r : r + ROWS_AT_ONCE].astype(np.float32)
        groups = rows.reshape(len(rows), in_dim // spec.group_size, spec.group_size)
        scale = stored_scale(no_clip_scale(groups, spec), spec)
        codes = round_to_grid(groups, scale, spec).reshape(len(rows), in_dim)
        q_weight[r : r + ROWS_AT_ONCE], q_scale[r : r + ROWS_AT_ONCE] = pack_codes(codes, scale, spec)
    return q_weight, q_scale


def dequantize_weight(q_weight: np.ndarray, q_scale: np.ndarray, spec: QuantSpec) -> np.ndarray:
    """Inverse of :func:`quantize_weight` (float32 result): the reference for the kernels."""
    out_dim = q_weight.shape[0]
    shifts = (np.arange(spec.per_uint32, dtype=np.uint32) * spec.bits)[None, None, :]
    mask = np.uint32((1 << spec.bits) - 1)
    q = ((q_weight[:, :, None] >> shifts) & mask).reshape(out_dim, -1).astype(np.float32)
    scale = np.repeat(q_scale.astype(np.float32), spec.group_size, axis=1)
    return (q - spec.max_int) * scale


# --------------------------------------------------------------------------- TVM side


def _dequantized(q_weight: te.Tensor, q_scale: te.Tensor, spec: QuantSpec, dtype: str, row, i):
    """Element ``i`` of packed row ``row`` as a ``dtype`` value: (nibble - 7) * scale."""
    mask = tirx.const((1 << spec.bits) - 1, "uint32")
    word = q_weight[row, i // spec.per_uint32]
    nibble = (word >> ((i % spec.per_uint32) * spec.bits).astype("uint32")) & mask
    return (nibble.astype(dtype) - tirx.const(spec.max_int, dtype)) * q_scale[row, i // spec.group_size].astype(dtype)


def _te_dequantize(q_weight: te.Tensor, q_scale: te.Tensor, spec: QuantSpec, in_dim: int, dtype: str):
    """TE stage: packed ``[rows, in/8]`` -> ``[rows, in_dim]`` in ``dtype``."""
    return te.compute(
        (q_weight.shape[0], in_dim), lambda r, i: _dequantized(q_weight, q_scale, spec, dtype, r, i), name="dequantize"
    )


def _matmul_transposed(x: te.Tensor, w: te.Tensor) -> te.Tensor:
    """TE stage ``x @ w.T`` for ``w[out, in]``, reading rows of ``w`` (no transpose kernel)."""
    k = te.reduce_axis((0, w.shape[1]), name="k")
    return te.compute((*x.shape[:-1], w.shape[0]), lambda *idx: te.sum(x[(*idx[:-1], k)] * w[idx[-1], k], axis=k), name="matmul")


class GroupQuantLinear(nn.Module):
    """``y = x @ W.T`` with W stored group-quantized; dequantize is fused into the matmul."""

    def __init__(self, in_features: int, out_features: int, spec: QuantSpec, bias: bool = False):
        self.in_features, self.out_features, self.spec = in_features, out_features, spec
        self.q_weight = nn.Parameter((out_features, in_features // spec.per_uint32), "uint32")
        self.q_scale = nn.Parameter((out_features, in_features // spec.group_size), spec.model_dtype)
        self.bias = nn.Parameter((out_features,), spec.model_dtype) if bias else None

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        spec, in_dim, dtype = self.spec, self.in_features, x.dtype

        # Dequantize and matmul are stages of ONE TE op: as two ops the whole
        # weight matrix would be materialised in memory before the matmul.
        def fused(x_te: te.Tensor, qw: te.Tensor, qs: te.Tensor) -> te.Tensor:
            return _matmul_transposed(x_te, _te_dequantize(qw, qs, spec, in_dim, dtype))

        y = op.tensor_expr_op(fused, "dequantize_matmul", [x, self.q_weight, self.q_scale])
        return y if self.bias is None else y + self.bias  # biases stay unquantized (a float row)


class GroupQuantEmbedding(nn.Module):
    """Token embedding stored group-quantized; only the looked-up rows are dequantized.

    ``lm_head_forward`` reuses the same table for tied output projections.
    """

    def __init__(self, vocab_size: int, hidden_size: int, spec: QuantSpec):
        self.vocab_size, self.hidden_size, self.spec = vocab_size, hidden_size, spec
        self.q_weight = nn.Parameter((vocab_size, hidden_size // spec.per_uint32), "uint32")
        self.q_scale = nn.Parameter((vocab_size, hidden_size // spec.group_size), spec.model_dtype)

    def forward(self, input_ids: nn.Tensor) -> nn.Tensor:
        spec, hidden, dtype = self.spec, self.hidden_size, self.spec.model_dtype

        def lookup(ids: te.Tensor, qw: te.Tensor, qs: te.Tensor) -> te.Tensor:
            return te.compute(
                (ids.shape[0], hidden), lambda n, i: _dequantized(qw, qs, spec, dtype, ids[n], i), name="embedding_lookup"
            )

        return op.tensor_expr_op(lookup, "dequantize_embedding", [input_ids, self.q_weight, self.q_scale])

    def lm_head_forward(self, x: nn.Tensor) -> nn.Tensor:
        spec, hidden = self.spec, self.hidden_size

        def fused(x_te: te.Tensor, qw: te.Tensor, qs: te.Tensor) -> te.Tensor:
            return _matmul_transposed(x_te, _te_dequantize(qw, qs, spec, hidden, x_te.dtype))

        return op.tensor_expr_op(fused, "dequantize_lm_head", [x, self.q_weight, self.q_scale])


class PlainLinear(nn.Module):
    """``y = x @ W.T`` as one TE op reading ``W[out, in]`` directly.

    nn.Linear's ``matmul(x, permute_dims(W))`` becomes a separate transpose
    kernel that rewrites every weight matrix on every call.
    """

    def __init__(self, in_features: int, out_features: int, dtype: str, bias: bool = False):
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter((out_features, in_features), dtype)
        self.bias = nn.Parameter((out_features,), dtype) if bias else None

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        y = op.tensor_expr_op(_matmul_transposed, "linear", [x, self.weight])
        return y if self.bias is None else y + self.bias


class PlainEmbedding(nn.Embedding):
    """Unquantized embedding with the same ``lm_head_forward`` as the quantized one."""

    def lm_head_forward(self, x: nn.Tensor) -> nn.Tensor:
        return op.tensor_expr_op(_matmul_transposed, "lm_head", [x, self.weight])


def make_linear(in_features: int, out_features: int, spec: QuantSpec, bias: bool = False) -> nn.Module:
    """``y = x @ W.T (+ b)``; ``W`` in ``spec``'s layout, the bias (if any) in the model dtype."""
    if spec.quantized:
        return GroupQuantLinear(in_features, out_features, spec, bias)
    return PlainLinear(in_features, out_features, spec.model_dtype, bias)


def make_embedding(vocab_size: int, hidden_size: int, spec: QuantSpec) -> nn.Module:
    if spec.quantized:
        return GroupQuantEmbedding(vocab_size, hidden_size, spec)
    return PlainEmbedding(vocab_size, hidden_size, dtype=spec.model_dtype)


def quantize_params(
    float_params: Mapping[str, np.ndarray],
    quantized_names: set[str],
    spec: QuantSpec,
    encode_calibrated: Callable[[], dict[str, tuple[np.ndarray, np.ndarray]]] | None = None,
    on_weight: Callable[[str], None] = lambda name: None,
) -> dict[str, np.ndarray]:
    """Turn ``{name.weight: float array}`` into the stored parameters of the model.

    ``quantized_names`` are the ``*.weight`` matrices that the model declares as
    quantized layers; everything else (norms) is cast to the model dtype.
    ``encode_calibrated`` (GPTQ) returns the matrices it quantized itself; it runs
    only once every shape has been checked. The rest are rounded to the nearest level.
    ``float_params`` may be a ``tensors.Tensors``: each float array is made, encoded and dropped
    in turn, so only the stored result is held whole.
    """
    float_params = Tensors.of(float_params)
    if spec.quantized:
        for name in sorted(quantized_names & float_params.keys()):
            check_quantizable(name, float_params.shape(name), spec)
    encoded = encode_calibrated() if spec.quantized and encode_calibrated else {}
    out: dict[str, np.ndarray] = {}
    for name in float_params:
        if spec.quantized and name in quantized_names:
            stem = name[: -len(".weight")]
            if name in encoded:
                out[f"{stem}.q_weight"], out[f"{stem}.q_scale"] = encoded.pop(name)
            else:
                out[f"{stem}.q_weight"], out[f"{stem}.q_scale"] = quantize_weight(float_params[name], spec)
                on_weight(name)
        else:
            out[name] = float_params[name].astype(spec.model_dtype, copy=False)
    return out
