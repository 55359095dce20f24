"""Llama family: SmolLM2, Llama 2/3, Mistral (no sliding window)."""

from .calibration import calibration_forward
from .loader import (GGUF_ARCHITECTURE, gguf_metadata, gguf_tensors, gguf_unsupported, hf_config_from_gguf, hf_names_from_gguf,
                     permute_for_gguf, to_lantern)
from .model import LlamaConfig, LlamaForCausalLM

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
Config = LlamaConfig
Model = LlamaForCausalLM

__all__ = ["ARCHITECTURES", "GGUF_ARCHITECTURE", "Config", "Model", "calibration_forward", "gguf_metadata",
           "gguf_tensors", "gguf_unsupported", "hf_config_from_gguf", "hf_names_from_gguf", "permute_for_gguf", "to_lantern"]
