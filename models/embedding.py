"""What every embedding model's library shares after its network: pooling a right-padded batch's
hidden states into one vector per text, and the library's one entry point.

``embed(input_ids[b, n], attention_mask[b, n]) -> [b, dimensions]`` returns the pooled vectors (after
the folder's Dense layers, where it has them) before normalization: the runtimes normalize, and
truncate for ``dimensions``. The encoders (``models/bert``) and the decoder embedders
(``models/llama/embedder.py``) both export it.
"""

from __future__ import annotations

from typing import Any

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from lantern.errors import LanternError
from lantern.models.family import GGUFLayout

POOLINGS = ("mean", "cls", "last")  # the sentence-transformers pooling modes implemented
GGUF_POOLING = {"mean": 1, "cls": 2, "last": 3}  # llama.cpp's pooling_type values (llama.h: LLAMA_POOLING_TYPE_*)


def no_gguf_import(*_args) -> Any:
    """An embedding family's GGUF reader: embedding GGUFs are written, not read back."""
    raise LanternError("reading an embedding model's GGUF back is not supported: build from its sentence-transformers folder")


def embedding_gguf(architecture: str, tensors, metadata, unsupported=lambda cfg: None, windows: bool = False) -> GGUFLayout:
    """How an embedding family is written as llama.cpp's ``architecture`` (GGUFLayout's fields in order; such a
    GGUF is not read back)."""
    return GGUFLayout(architecture, tensors, metadata, unsupported, no_gguf_import, no_gguf_import, windows=windows)


def pool(x: nn.Tensor, mask: nn.Tensor, pooling: str) -> nn.Tensor:
    """``x[b, n, h]`` pooled over each row's real tokens (``mask[b, n]``: 1 on tokens, 0 on padding,
    in ``x``'s dtype): their mean, the first token, or the last real one."""
    b, n, h = x.shape
    if pooling == "cls":
        return op.squeeze(op.split(x, [1], axis=1)[0], 1)
    if pooling == "mean":
        summed = op.sum(x * op.reshape(mask, (b, n, 1)), axis=1)
        return summed / op.maximum(op.sum(mask, axis=1, keepdims=True), op.ones((1, 1), x.dtype))
    # last: the last real token of each right-padded row
    last = op.astype(op.sum(mask, axis=1), "int32") - op.ones((1,), "int32")
    onehot = op.astype(op.equal(op.reshape(op.arange(0, n, dtype="int32"), (1, n)), op.reshape(last, (b, 1))), x.dtype)
    return op.sum(x * op.reshape(onehot, (b, n, 1)), axis=1)


def embed_spec() -> dict:
    """``get_default_spec`` of an embedding model: the one ``embed`` function, its parameters packed."""
    return {
        "embed": {
            "input_ids": nn.spec.Tensor(["batch", "seq_len"], "int32"),
            "attention_mask": nn.spec.Tensor(["batch", "seq_len"], "int32"),
            "$": {"param_mode": "packed", "effect_mode": "none"},
        }
    }
