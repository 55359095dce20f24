"""Reading a built artifact back: manifest checks, weights, tokenizer, CPU model."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import LanternError
from ..importer import special_around
from ..package import MANIFEST, choose_library, sha256_file


class PromptTokens:
    """Prompt text to token ids, the one way every path that reads an artifact makes them: a rendered
    chat as written (its template writes the special tokens it wants, given ``bos`` and ``eos``), a
    raw prompt with the tokens transformers' and llama.cpp's tokenizers put first, unless the text
    already starts with them: those tokenizer.json's post-processor adds, else the BOS token where
    the tokenizer config asks for it (``add_bos_token``)."""

    def __init__(self, tokenizer, config: dict):
        self.tokenizer = tokenizer
        # the artifact's tokenizer_config.json holds them as plain strings (pipeline.py writes it)
        self.bos, self.eos = config.get("bos_token") or "", config.get("eos_token") or ""
        before, _ = special_around(tokenizer)
        bos_id = tokenizer.token_to_id(self.bos) if self.bos else None
        self.raw_prefix: list[int] = before or ([bos_id] if config.get("add_bos_token") and bos_id is not None else [])

    def encode(self, text: str, raw: bool = False) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return self.raw_prefix + ids if raw and ids[: len(self.raw_prefix)] != self.raw_prefix else ids


@dataclass
class Artifact:
    path: Path
    manifest: dict

    @classmethod
    def open(cls, path: str | Path, *, verify: bool = True) -> "Artifact":
        path = Path(path)
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except FileNotFoundError:
            raise LanternError(f"{path} is not a Lantern artifact (no {MANIFEST})") from None
        except json.JSONDecodeError as err:
            raise LanternError(f"{path / MANIFEST} is not valid JSON: {err}") from None
        artifact = cls(path, manifest)
        if verify:
            artifact.verify()
        return artifact

    def verify(self) -> None:
        """Check every file's size and sha256 against the manifest."""
        for name, info in self.manifest["files"].items():
            p = self.path / name
            if not p.exists():
                raise LanternError(f"artifact file missing: {name}")
            if p.stat().st_size != info["size"]:
                raise LanternError(f"integrity error: {name} has {p.stat().st_size} bytes, the manifest says {info['size']}")
            if sha256_file(p) != info["sha256"]:
                raise LanternError(f"integrity error: {name} does not match its sha256 in {MANIFEST}")

    def library_record(self, target: str, features: frozenset[str] = frozenset(), emulated: bool = False) -> dict:
        try:
            return choose_library(self.manifest["libraries"], target, features, emulated)
        except ValueError as err:
            raise LanternError(f"artifact {self.path.name}: {err}") from None

    def library(self, target: str, features: frozenset[str] = frozenset(), emulated: bool = False) -> Path:
        """The library for ``target`` that a device with ``features`` runs best (``emulated``: a
        software WebGPU adapter), chosen as the browser runtime chooses (package.choose_library)."""
        return self.path / self.library_record(target, features, emulated)["file"]

    def context_window(self, target: str) -> int:
        """Tokens of context the library for ``target`` runs: the artifact's, or less where the
        library says so (a windowed model's float16 libraries stop at the window: pipeline.library_config)."""
        return self.library_record(target).get("context_window") or self.manifest["model"]["context_window"]

    def params(self) -> dict[str, np.ndarray]:
        index = json.loads((self.path / "tensor-cache.json").read_text())
        out = {}
        for shard in index["records"]:
            data = (self.path / shard["dataPath"]).read_bytes()
            for rec in shard["records"]:
                raw = data[rec["byteOffset"] : rec["byteOffset"] + rec["nbytes"]]
                out[rec["name"]] = np.frombuffer(raw, dtype=rec["dtype"]).reshape(rec["shape"])
        return out

    def param_order(self) -> list[str]:
        """Parameter names in the order the model library takes them (from its metadata)."""
        index = json.loads((self.path / "tensor-cache.json").read_text())
        return [rec["name"] for shard in index["records"] for rec in shard["records"]]

    def cpu_model(self, conversations: int = 1):
        """The CPU library, loaded; its KV cache keeps ``conversations`` sequences (runner.CpuModel)."""
        from .runner import CpuModel

        params = self.params()
        context = self.context_window("cpu")
        return CpuModel(
            self.library("cpu"),
            [params[n] for n in self.param_order()],
            context_window=context,
            prefill_chunk=min(self.manifest["model"]["prefill_chunk_size"], context),
            conversations=conversations,
        )

    def tokenizer(self):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.path / "tokenizer.json"))

    def tokenizer_config(self) -> dict:
        return json.loads((self.path / "tokenizer_config.json").read_text())

    def prompt_tokens(self) -> PromptTokens:
        return PromptTokens(self.tokenizer(), self.tokenizer_config())
