"""Model families: one folder each, behind one typed record (``family.Family``).

Adding a family means adding a folder that defines ``FAMILY`` and one line in ``FAMILIES``; the
compiler reads nothing family-specific from anywhere else. A chat family's folder may also define
``EMBEDDING``, its sentence-embedding twin (the same decoder, pooled: ``llama/embedder.py``).
"""

from lantern.errors import LanternError

from .bert import FAMILY as BERT
from .family import Family
from .gemma2 import FAMILY as GEMMA2
from .gemma3 import EMBEDDING as GEMMA_EMBEDDING
from .gemma3 import FAMILY as GEMMA3
from .llama import FAMILY as LLAMA
from .phi3 import FAMILY as PHI3
from .qwen2 import FAMILY as QWEN2
from .qwen3 import EMBEDDING as QWEN3_EMBEDDING
from .qwen3 import FAMILY as QWEN3

FAMILIES: tuple[Family, ...] = (LLAMA, QWEN2, QWEN3, PHI3, GEMMA2, GEMMA3, BERT, QWEN3_EMBEDDING, GEMMA_EMBEDDING)


def family_for_architecture(arch: str, embedding: bool = False) -> Family:
    """The family of a config.json architecture. A chat family's embedding twin takes the same
    architecture (Qwen3-Embedding is a ``Qwen3ForCausalLM``): ``embedding`` (the folder is a
    sentence-transformers one, with modules.json) picks the twin."""
    found = [fam for fam in FAMILIES if arch in fam.architectures]
    if found:
        kind = "embedding" if embedding else "chat"
        return next((fam for fam in found if fam.kind == kind), found[0])
    known = ", ".join(dict.fromkeys(a for f in FAMILIES for a in f.architectures))
    raise LanternError(f"unsupported architecture '{arch}' (supported: {known})")


def family_for_gguf(arch: str) -> Family:
    for fam in FAMILIES:
        if fam.gguf.architecture == arch:
            return fam
    known = ", ".join(dict.fromkeys(f.gguf.architecture for f in FAMILIES))
    raise LanternError(f"unsupported GGUF architecture '{arch}' (supported: {known})")
