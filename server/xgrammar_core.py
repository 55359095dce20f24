"""xgrammar's native core without its Python package: the C++ bindings (``xgrammar_bindings``, one
extension module of the xgrammar 0.1.27 wheel) loaded by path.

The package's ``xgrammar/__init__.py`` imports torch (for its GPU bitmask kernels), and its PyPI
requirements pull in torch and triton: 5 GB of a CPU install. The bindings need neither: they take a
numpy int32 bitmask through DLPack. So `lantern serve` uses them directly, from wherever they are:

1. an installed xgrammar package (the `xgrammar` extra, or `pip install --no-deps xgrammar==0.1.27`);
   found, not imported;
2. else the wheel in Lantern's cache (``<cache>/wheels/xgrammar-0.1.27/``), fetched once from the
   package index with `pip download --no-deps` (8.9 MB) the first time a model loads.

Where neither works (offline, another platform), the server runs xgrammar's wasm build instead
(``xgrammar_wasm.py``). ``Core`` holds the handful of calls the server makes; their arguments are the
package's own (xgrammar's ``compiler.py``, ``grammar.py``, ``matcher.py``), written out positionally.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from ..cache_lock import cache_lock
from ..errors import LanternError
from ..wheels import default_cache_dir, pip_download

VERSION = "0.1.27"  # the browser's @mlc-ai/web-xgrammar, the `xgrammar` extra's pin
MODULE = "xgrammar_bindings"
NAME = f"xgrammar.{MODULE}"  # as the package imports it
VOCAB_TYPES = {"raw": 0, "byte_fallback": 1, "byte_level": 2}  # xgrammar.VocabType


def _installed() -> Path | None:
    """The bindings of an installed xgrammar package, located without importing the package."""
    spec = importlib.util.find_spec("xgrammar")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(folder).glob(f"{MODULE}*.so"))
        if found:
            return found[0]
    return None


def _cached(cache: Path) -> Path:
    """The bindings from the xgrammar wheel in the cache, fetched (once) when missing."""
    folder = cache / "wheels" / f"xgrammar-{VERSION}"
    with cache_lock(folder.with_name(f"{folder.name}.lock")):  # servers sharing a cache fetch it once
        found = sorted(folder.glob(f"{MODULE}*.so"))
        if found:
            return found[0]
        folder.mkdir(parents=True, exist_ok=True)
        tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
        [wheel] = pip_download(f"xgrammar=={VERSION}", folder, f"xgrammar-{VERSION}-{tag}-*.whl", "(the grammar engine's core)")
        with zipfile.ZipFile(wheel) as zf:
            [name] = [n for n in zf.namelist() if n.startswith(f"xgrammar/{MODULE}") and n.endswith(".so")]
            tmp = folder / f".{Path(name).name}.tmp"
            tmp.write_bytes(zf.read(name))
        wheel.unlink()
        return tmp.rename(folder / Path(name).name)


@functools.cache
def bindings() -> ModuleType:
    """The bindings module, loaded once; LanternError (saying why) where it cannot be had. It is loaded
    under the package's own name for it, so that an xgrammar package imported in the same process (the
    tests compare with it) shares the one module: a C++ extension must not be initialized twice."""
    if NAME in sys.modules:
        return sys.modules[NAME]
    path = _installed()
    if path is None:
        try:
            path = _cached(default_cache_dir())
        except (LanternError, OSError, ValueError) as err:
            raise LanternError(f"xgrammar's native core is not installed and could not be fetched: {err}") from None
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_file_location(NAME, path, loader=loader)
    assert spec is not None
    try:
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except ImportError as err:
        raise LanternError(f"xgrammar's native core at {path} does not load here: {err}") from None
    sys.modules[NAME] = module
    return module


@functools.cache
def available() -> str | None:
    """None when the native core loads, else why not (asked once: an offline server does not retry the fetch)."""
    try:
        bindings()
    except LanternError as err:
        return str(err)
    return None


def schema_grammar(source: str, layout: dict[str, Any]) -> str:
    """The EBNF xgrammar writes for a JSON schema (JSON text) in ``layout`` (``any_whitespace``, ``indent``,
    ``separators``, ``strict_mode``): ``xgrammar.Grammar.from_json_schema``."""
    core = bindings()
    grammar = core.Grammar.from_json_schema(
        source, layout["any_whitespace"], layout["indent"], layout["separators"], layout["strict_mode"], None, False
    )
    return grammar.to_string()


class Compiler:
    """``xgrammar.GrammarCompiler`` over a vocabulary (its tokens' text as the tokenizer stores them)."""

    def __init__(self, vocab: list[str], token_postproc: str, vocab_size: int, stop_ids: list[int]):
        core = bindings()
        info = core.TokenizerInfo(vocab, VOCAB_TYPES.get(token_postproc, 0), vocab_size, sorted(stop_ids), False)
        self._compiler = core.GrammarCompiler(info, 8, False, -1)  # threads, no cache (the server keeps its own)

    def grammar(self, ebnf: str) -> Any:
        """A CompiledGrammar (``memory_size_bytes`` says its size) of an EBNF text whose start rule is ``root``."""
        return self._compiler.compile_grammar(ebnf, "root")

    def structural_tag(self, source: str) -> Any:
        return self._compiler.compile_structural_tag(source)


class Matcher:
    """``xgrammar.GrammarMatcher`` of one generation, with its bitmask as uint32 words."""

    def __init__(self, compiled: Any, vocab_size: int):
        self._matcher = bindings().GrammarMatcher(compiled, None, False, -1)
        self.words = np.zeros((1, (vocab_size + 31) // 32), np.int32)

    def fill(self) -> np.ndarray:
        """The next token's bitmask: bit i of word i >> 5 set where token i is allowed."""
        self._matcher.fill_next_token_bitmask(self.words, 0, False)
        return self.words[0].view(np.uint32)

    def forced_text(self) -> str:
        return self._matcher.find_jump_forward_string()

    def rollback(self, tokens: int) -> None:
        self._matcher.rollback(tokens)

    def accept(self, token: int) -> bool:
        return self._matcher.accept_token(token, False)
