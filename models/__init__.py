"""Model families. Each family is one folder exposing the same names:
``ARCHITECTURES`` (HF ``architectures`` values), ``GGUF_ARCHITECTURE``, ``Config``
(``from_hf``, ``quantized_weights``), ``Model`` (relax nn module), ``to_lantern``
(HF state dict -> parameters), ``hf_names_from_gguf``, ``hf_config_from_gguf``,
``calibration_forward`` (a numpy forward that shows GPTQ each quantized matrix's inputs), and for
the ``gguf`` target ``gguf_tensors``, ``gguf_metadata``, ``permute_for_gguf`` and ``gguf_unsupported``.
Adding a family means adding a folder and one line in ``FAMILIES``.
"""

from types import ModuleType

from lantern.errors import LanternError

from . import llama

FAMILIES: tuple[ModuleType, ...] = (llama,)


def family_for_architecture(arch: str) -> ModuleType:
    for fam in FAMILIES:
        if arch in fam.ARCHITECTURES:
            return fam
    known = ", ".join(a for f in FAMILIES for a in f.ARCHITECTURES)
    raise LanternError(f"unsupported architecture '{arch}' (supported: {known})")


def family_for_gguf(arch: str) -> ModuleType:
    for fam in FAMILIES:
        if fam.GGUF_ARCHITECTURE == arch:
            return fam
    known = ", ".join(f.GGUF_ARCHITECTURE for f in FAMILIES)
    raise LanternError(f"unsupported GGUF architecture '{arch}' (supported: {known})")
