"""The typed contract every model family folder fills in (one ``Family`` record each).

The compiler asks the record, never a module attribute: how to read a config (from Hugging Face's
config.json or from GGUF metadata), which relax model to build, how checkpoint names map to the
model's parameters, the numpy forward GPTQ calibrates on, and how the parameters become llama.cpp's
tensors for the ``gguf`` target. What the runtimes need to know about a model (context window,
vocabulary, RoPE) is on the config object the record's ``config.from_hf`` returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from lantern.tensors import Tensors

Observe = Callable[[str, list[np.ndarray]], None]


class FamilyConfig(Protocol):
    """What the compiler and the runtimes read from every family's config."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_key_value_heads: int
    head_dim: int
    context_window_size: int
    prefill_chunk_size: int
    tie_word_embeddings: bool
    attention_softcap: float  # 0, or the cap of the attention scores (the compiler swaps the kernels)
    sliding_window: int  # 0, or the keys a windowed layer sees behind each query
    sliding_layers: tuple[bool, ...]  # per layer: whether it is windowed

    @property
    def windowed(self) -> bool: ...  # some layer's window is shorter than the context (the compiler swaps the kernels)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "FamilyConfig": ...

    def quantized_weights(self) -> set[str]: ...


@dataclass(frozen=True)
class GGUFTensor:
    """One llama.cpp tensor cut from a model parameter: rows ``first .. first + rows`` of ``param``
    (a float parameter name: ``...weight`` may be stored quantized), with each head's rows permuted
    for llama.cpp's RoPE layout when ``rope_heads`` is set."""

    name: str
    param: str
    first: int
    rows: int
    rope_heads: int | None = None
    float32: bool = False  # kept float32 in a float16 GGUF (llama.cpp's converter keeps BERT's positions so)


@dataclass(frozen=True)
class GGUFLayout:
    """How a family is written as a GGUF for llama.cpp (the ``gguf`` target) and read back."""

    architecture: str  # general.architecture, the prefix of every metadata key
    tensors: Callable[[Any], list[GGUFTensor]]
    metadata: Callable[[Any], Mapping[str, int | float | str | list[bool]]]  # ints are written as uint32
    unsupported: Callable[[Any], str | None]  # why llama.cpp could not run this config, or None
    # (metadata, tensors by name: gguf_file.Tensor, data memory-mapped) -> a config.json-like dict
    config_from_metadata: Callable[[dict, dict[str, Any]], dict]
    names_from_gguf: Callable[[Tensors, dict], Tensors]  # llama.cpp's tensors -> HF names, still unread
    permute: Callable[[np.ndarray, int], np.ndarray] = lambda w, heads: w
    # float32 tensors that come from the config, not from a parameter (Phi-3's longrope factors)
    constants: Callable[[Any], dict[str, np.ndarray]] = lambda cfg: {}
    # GGUF keys llama.cpp is told at load (llama_model_kv_override), so that it runs what the artifact's
    # libraries run whatever context it is given (Phi-3.5: which longrope factors); in the manifest
    load_overrides: Callable[[Any], dict[str, int]] = lambda cfg: {}
    # whether llama.cpp applies the config's sliding windows for this architecture (gemma2, gemma3);
    # where it does not (llama, phi3), the GGUF is exact only up to the window (gguf_export.context_window)
    windows: bool = False


@dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]  # config.json "architectures" values
    config: type[FamilyConfig]
    model: type  # relax nn.Module: model(config, QuantSpec, Target), MLC's model-library contract
    # HF checkpoint (tensors.Tensors or a dict) -> the model's float parameters, each made when asked for
    to_lantern: Callable[[Mapping[str, np.ndarray], Any], Tensors]
    gguf: GGUFLayout
    calibration_forward: Callable[[dict[str, np.ndarray], Any, list[list[int]], Observe], list[np.ndarray]] | None = None
    # "chat": a decoder with a KV cache and logits (MLC's contract); "embedding": an encoder whose library
    # has one function, embed(input_ids[b, n], attention_mask[b, n]) -> pooled [b, hidden]
    kind: str = "chat"
    # what `lantern build` makes without --targets (pipeline.TARGETS): an encoder small enough for the
    # browser's wasm memory adds "wasm", the CPU library in wasm, which its wasm device runs instead of llama.cpp
    default_targets: tuple[str, ...] = ("webgpu", "cpu", "gguf")
