"""Llama family: Llama 1/2/3.x, SmolLM2 and Mistral (its sliding window: ``LlamaConfig.windowed``)."""

from lantern.models.family import Family

from .calibration import calibration_forward
from .loader import gguf_layout, permute_for_gguf, to_lantern
from .model import LlamaConfig, LlamaForCausalLM


def decoder_family(
    name: str, architectures: tuple[str, ...], config: type, gguf_architecture: str, rope_permuted: bool
) -> Family:
    """A family that is this folder's decoder with its own config reading (``config.from_hf`` sets the
    switches): the network, loader and calibration pass are shared."""
    return Family(
        name=name,
        architectures=architectures,
        config=config,
        model=LlamaForCausalLM,
        to_lantern=to_lantern,
        gguf=gguf_layout(gguf_architecture, architectures[0], rope_permuted),
        calibration_forward=calibration_forward,
    )


FAMILY = decoder_family("llama", ("LlamaForCausalLM", "MistralForCausalLM"), LlamaConfig, "llama", rope_permuted=True)

__all__ = ["FAMILY", "LlamaConfig", "LlamaForCausalLM", "calibration_forward", "decoder_family", "permute_for_gguf", "to_lantern"]
