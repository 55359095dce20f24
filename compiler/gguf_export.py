"""The ``gguf`` target: the artifact's own weights as a GGUF that llama.cpp runs (wllama in the
browser, llama-cpp-python on a server), split into parts that the browser fetches and verifies like
any other artifact file.

The weights are the ones the WebGPU and CPU libraries run, not a second quantization:

* q4 (MLC's group-32 grid, ``(q - 7) * s``) is llama.cpp's Q4_0 (``(q' - 8) * d``) mirrored:
  ``q' = 15 - q`` and ``d = -s``, exact but for ``d`` rounding to f16. GPTQ's choices carry over.
* q0f32 and q0f16 become F32 and F16 tensors. Norms are F32 in every case, as llama.cpp keeps them.

The family's ``GGUFLayout`` says which parameter rows make which llama.cpp tensor, its
``<arch>.*`` keys and what it cannot write yet. The
tokenizer becomes ``tokenizer.ggml.*`` from the artifact's own tokenizer.json, so both devices
split text into the same tokens.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .errors import LanternError
from .models.family import Family

# A part at most this big: small enough to cache and verify in a browser, as the weight shards are.
PART_BYTES = 64 * 2**20

# tokenizer.json pre-tokenizers -> the llama.cpp pre-tokenizer that splits text the same way.
# Only what has been checked against llama.cpp is listed; anything else skips the target.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZERS = {
    json.dumps(
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}, sort_keys=True
    ): "gpt-2",
    json.dumps(
        {
            "type": "Sequence",
            "pretokenizers": [  # Qwen2, Qwen2.5, Qwen3
                {"type": "Split", "pattern": {"Regex": _QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        sort_keys=True,
    ): "qwen2",
    json.dumps(
        {
            "type": "Sequence",
            "pretokenizers": [  # Llama 3, 3.1, 3.2 (llama.cpp applies its ignore_merges)
                {"type": "Split", "pattern": {"Regex": _LLAMA3_SPLIT}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ],
        },
        sort_keys=True,
    ): "llama-bpe",
}

_TOKEN_NORMAL, _TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_USER, _TOKEN_UNUSED, _TOKEN_BYTE = 1, 2, 3, 4, 5, 6


class GGUFUnsupported(LanternError):
    """This model cannot be written as a GGUF that llama.cpp runs; the build skips the target."""


def tensor_type(quant: str) -> str:
    """The GGUF type of the weight matrices of a ``quant`` build."""
    return "Q4_0" if quant.startswith("q4") else "F16" if quant == "q0f16" else "F32"


def q4_to_q4_0(q_weight: np.ndarray, q_scale: np.ndarray) -> np.ndarray:
    """MLC q4 (``uint32[rows, in / 8]`` codes, ``[rows, in / 32]`` scales) as Q4_0 blocks:
    ``uint8[rows, in / 32 * 18]``, each block an f16 ``d`` then 16 bytes of two codes each."""
    rows, words = q_weight.shape
    codes = np.empty((rows, words, 8), dtype=np.uint8)
    for j in range(8):
        codes[:, :, j] = (q_weight >> np.uint32(4 * j)) & np.uint32(0xF)
    mirrored = (15 - codes).reshape(rows, -1, 32)  # q' = 15 - q
    packed = mirrored[:, :, :16] | (mirrored[:, :, 16:] << 4)
    d = (-q_scale.astype(np.float32)).astype("<f2").view(np.uint8).reshape(rows, -1, 2)
    return np.concatenate([d, packed], axis=2).reshape(rows, -1)


Q4_0_BLOCK_BYTES = 18  # an f16 scale and 32 four-bit codes


class _Deferred:
    """A tensor that gguf's writer takes by shape, dtype and size, and makes only when it writes it
    (``tofile``): the converted copy of one weight at a time, never of them all."""

    def __init__(self, shape: tuple[int, ...], dtype, make):
        self.shape, self.dtype, self._make = tuple(int(d) for d in shape), np.dtype(dtype), make

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def tofile(self, f) -> None:
        array = self._make()
        assert array.shape == self.shape and array.dtype == self.dtype, (array.shape, array.dtype, self.shape)
        array.tofile(f)


def _tokenizer_fields(tokenizer_json: dict, vocab_size: int) -> dict:
    """``tokenizer.ggml.*`` of a tokenizer.json: byte-level BPE (llama.cpp's ``gpt2``) or
    SentencePiece-style BPE (``llama``); GGUFUnsupported for anything else."""
    model = tokenizer_json.get("model") or {}
    if model.get("type") == "WordPiece" and isinstance(model.get("vocab"), dict):
        return _wordpiece_fields(tokenizer_json, vocab_size)
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise GGUFUnsupported(
            f"its {model.get('type', 'unknown')} tokenizer is not written to GGUF yet "
            "(byte-level and SentencePiece-style BPE, and BERT's WordPiece are)"
        )
    space_prefix = _sentencepiece_space_prefix(tokenizer_json) if model.get("byte_fallback") else None
    pre_json = json.dumps(tokenizer_json.get("pre_tokenizer"), sort_keys=True)
    if space_prefix is None and pre_json not in _PRE_TOKENIZERS:
        raise GGUFUnsupported(f"llama.cpp has no pre-tokenizer known to match {pre_json[:120]}")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [_TOKEN_UNUSED] * vocab_size
    for text, i in model["vocab"].items():
        if i < vocab_size:
            byte = space_prefix is not None and _BYTE_TOKEN.fullmatch(text)
            tokens[i], types[i] = text, _TOKEN_BYTE if byte else _TOKEN_NORMAL
    for added in tokenizer_json.get("added_tokens", []):
        if added["id"] < vocab_size:
            tokens[added["id"]] = added["content"]
            types[added["id"]] = _TOKEN_CONTROL if added.get("special") else _TOKEN_USER
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    if space_prefix is None:
        return {"model": "gpt2", "pre": _PRE_TOKENIZERS[pre_json], "tokens": tokens, "types": types, "merges": merges}
    unk = model["vocab"].get(model.get("unk_token"))
    if unk is not None and unk < vocab_size:
        types[unk] = _TOKEN_UNKNOWN
    return {
        "model": "llama",
        "pre": "default",
        "tokens": tokens,
        "types": types,
        "unk": unk,
        "scores": _merge_scores(tokens, merges),
        "add_space_prefix": space_prefix,
    }


# BERT's WordPiece tokenizer.json, as llama.cpp's WPM tokenizer reads text: lower-cased, accents
# stripped (NFD), split on spaces, punctuation and CJK characters, [CLS] first and [SEP] last
_BERT_NORMALIZER = {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "lowercase": True}
_BERT_SPECIAL = {"cls": "[CLS]", "sep": "[SEP]", "unk": "[UNK]", "pad": "[PAD]", "mask": "[MASK]"}


def _wordpiece_fields(tokenizer_json: dict, vocab_size: int) -> dict:
    """``tokenizer.ggml.*`` of BERT's WordPiece (llama.cpp's ``bert``): its vocabulary in "phantom space"
    form (a word's first piece gets "▁" in front, a "##" continuation loses the "##", special tokens stay),
    the special tokens' ids. Only the uncased BERT normalizer is what llama.cpp does."""
    model = tokenizer_json["model"]
    norm = tokenizer_json.get("normalizer") or {}
    if {k: norm.get(k) for k in _BERT_NORMALIZER} != _BERT_NORMALIZER or norm.get("strip_accents") is False:
        raise GGUFUnsupported(
            f"llama.cpp's WordPiece lower-cases and strips accents; this normalizer is {json.dumps(norm)[:120]}"
        )
    if (tokenizer_json.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer":
        raise GGUFUnsupported("llama.cpp's WordPiece splits as BertPreTokenizer does; this tokenizer.json has another")
    prefix = model.get("continuing_subword_prefix", "##")
    special = {a["content"] for a in tokenizer_json.get("added_tokens", []) if a.get("special")}
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [_TOKEN_UNUSED] * vocab_size
    for text, i in model["vocab"].items():
        if i >= vocab_size:
            continue
        if text in special:
            tokens[i], types[i] = text, _TOKEN_CONTROL
        else:
            tokens[i], types[i] = (text[len(prefix) :] if text.startswith(prefix) else _SPACE + text), _TOKEN_NORMAL
    ids = {role: model["vocab"].get(text) for role, text in _BERT_SPECIAL.items()}
    if ids["cls"] is None or ids["sep"] is None:
        raise GGUFUnsupported("a WordPiece vocabulary without [CLS] and [SEP]: llama.cpp adds both to every text")
    return {"model": "bert", "pre": "default", "tokens": tokens, "types": types, "special": ids}


_BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")
_SPACE = "\u2581"  # SentencePiece's visible space


def _sentencepiece_space_prefix(tokenizer_json: dict) -> bool | None:
    """For a byte-fallback BPE that reads text as SentencePiece does (spaces become "▁", no other
    splitting), whether it puts a "▁" before every text fragment (llama.cpp's ``add_space_prefix``);
    None for any other normalizer and pre-tokenizer pair. Fragments are the text between added
    tokens: tokenizers normalizes each on its own, llama.cpp prefixes each one after a special token,
    so the two agree."""
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": _SPACE}
    prepend = {"type": "Prepend", "prepend": _SPACE}
    norm, pre = tokenizer_json.get("normalizer"), tokenizer_json.get("pre_tokenizer")
    # Gemma's own files split on " " after the normalizer has replaced every space: a no-op
    space_split = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
    if pre is None or pre == space_split:
        if norm == replace:
            return False
        if norm == {"type": "Sequence", "normalizers": [prepend, replace]}:
            return True
    if (
        norm is None
        and isinstance(pre, dict)
        and pre.get("type") == "Metaspace"
        and pre.get("replacement") == _SPACE
        and pre.get("prepend_scheme") == "always"
        and pre.get("split") is False
    ):
        return True
    return None


def _merge_scores(tokens: list[str], merges: list[str]) -> list[float]:
    """llama.cpp's SentencePiece tokenizer merges the adjacent pair whose joined token scores highest,
    the leftmost first; the BPE merges the pair of lowest rank. A token scored minus the rank of the
    first merge that makes it orders the merges as the BPE does (a vocabulary converted from
    SentencePiece lists every split of a token together, ranked by the token's own score).
    Tokens no merge makes (characters, bytes, added tokens) score below every merge."""
    rank_of: dict[str, int] = {}
    for rank, merge in enumerate(merges):
        rank_of.setdefault(merge.replace(" ", ""), rank)  # SentencePiece pieces hold no plain space
    floor = -float(len(merges) + 1)
    return [-float(rank_of[t]) if t in rank_of else floor for t in tokens]


# llama.cpp looks these up when a model's name says Phi-3 (to mark how they strip spaces), and fails
# to load a vocabulary without them
_PHI3_NAMED_TOKENS = ("</s>", "<unk>", "<s>", "<|endoftext|>")


def _name_is_safe(name: str, tokens: list[str]) -> bool:
    """Whether llama.cpp loads a model of this ``general.name`` with this vocabulary. Otherwise the
    optional key is left out (a fine-tune of Phi-3 named "phi3-..." with another tokenizer)."""
    if "phi-3" not in name.lower() and "phi3" not in name.lower():
        return True
    return set(_PHI3_NAMED_TOKENS) <= set(tokens)


def context_window(family: Family, config) -> int:
    """Tokens llama.cpp runs this model's GGUF for exactly: the artifact's context, or the sliding
    window where llama.cpp's architecture ignores the config's windows (its ``llama`` and ``phi3``:
    Mistral, Phi-3 mini), since within the window windowed attention is full attention."""
    if config.windowed and not family.gguf.windows:
        return config.sliding_window
    return config.context_window_size


def check(family: Family, config, tokenizer_json: str) -> None:
    """Raise GGUFUnsupported (one line, why) when this model cannot become a GGUF llama.cpp runs."""
    reason = family.gguf.unsupported(config)
    if reason:
        raise GGUFUnsupported(reason)
    _tokenizer_fields(json.loads(tokenizer_json), config.vocab_size)


def write(
    out: Path,
    stem: str,
    params: dict[str, np.ndarray],
    family: Family,
    config,
    quant: str,
    tokenizer_json: str,
    chat_template: str | None,
    bos_id: int | None,
    eos_id: int | None,
    add_bos: bool,
    part_bytes: int = PART_BYTES,
) -> list[str]:
    """Write ``<stem>.gguf`` (or ``<stem>-0000i-of-0000n.gguf`` parts) into ``out`` from the stored
    parameters; returns the file names in part order."""
    import gguf

    tok = _tokenizer_fields(json.loads(tokenizer_json), config.vocab_size)
    logging.getLogger("gguf").setLevel(logging.ERROR)  # it logs "not splitting" for a one-part model
    layout = family.gguf
    writer = gguf.GGUFWriter(out / f"{stem}.gguf", layout.architecture, split_max_size=part_bytes)
    writer.add_type(gguf.GGUFType.MODEL)
    if _name_is_safe(stem, tok["tokens"]):
        writer.add_name(stem)
    writer.add_file_type(
        {"Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "F16": gguf.LlamaFileType.MOSTLY_F16, "F32": gguf.LlamaFileType.ALL_F32}[
            tensor_type(quant)
        ]
    )
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add: dict[type, Callable[[str, Any], None]] = {
        bool: writer.add_bool,
        float: writer.add_float32,
        int: writer.add_uint32,
        str: writer.add_string,
        list: writer.add_array,
    }
    for key, value in layout.metadata(config).items():
        add[type(value)](key, value)
    writer.add_tokenizer_model(tok["model"])
    writer.add_tokenizer_pre(tok["pre"])
    writer.add_token_list(tok["tokens"])
    writer.add_token_types(tok["types"])
    if tok["model"] == "gpt2":
        writer.add_token_merges(tok["merges"])
    elif tok["model"] == "bert":  # llama.cpp puts [CLS] (its BOS) first and [SEP] last in every text
        special = tok["special"]
        bos_id, eos_id, add_bos = special["cls"], special["sep"], True
        writer.add_sep_token_id(special["sep"])
        for role, add_id in (
            ("unk", writer.add_unk_token_id),
            ("pad", writer.add_pad_token_id),
            ("mask", writer.add_mask_token_id),
        ):
            if special[role] is not None:
                add_id(special[role])
    else:
        writer.add_token_scores(tok["scores"])
        writer.add_add_space_prefix(tok["add_space_prefix"])
        if tok["unk"] is not None:
            writer.add_unk_token_id(tok["unk"])
    add_eos = False
    if family.kind == "embedding" and tok["model"] != "bert":
        # llama.cpp tokenizing a text (the page's wasm device) adds what the model's tokenizer.json puts
        # around it: EmbeddingGemma's <bos> ... <eos>, Qwen3-Embedding's final <|endoftext|> it pools on
        from tokenizers import Tokenizer

        from .importer import special_around

        before, after = special_around(Tokenizer.from_str(tokenizer_json))
        if len(before) > 1 or len(after) > 1:
            raise LanternError(f"tokenizer.json puts {before} before and {after} after a text: llama.cpp adds one token each")
        add_bos, add_eos = bool(before), bool(after)
        if before:
            bos_id = before[0]
        if after:
            eos_id = after[0]
    if bos_id is not None:
        writer.add_bos_token_id(bos_id)
    if eos_id is not None:
        writer.add_eos_token_id(eos_id)
    writer.add_add_bos_token(add_bos)
    if add_eos:
        writer.add_add_eos_token(True)
    if chat_template:
        writer.add_chat_template(chat_template)

    for t in layout.tensors(config):
        stem_name = t.param[: -len(".weight")] if t.param.endswith(".weight") else None
        if stem_name and f"{stem_name}.q_weight" in params:
            qw, qs = params[f"{stem_name}.q_weight"], params[f"{stem_name}.q_scale"]

            def q4_0(t=t, qw=qw, qs=qs) -> np.ndarray:
                qw, qs = qw[t.first : t.first + t.rows], qs[t.first : t.first + t.rows]
                if t.rope_heads:
                    qw, qs = layout.permute(qw, t.rope_heads), layout.permute(qs, t.rope_heads)
                return q4_to_q4_0(qw, qs)

            shape = (t.rows, qw.shape[1] * 8 // 32 * Q4_0_BLOCK_BYTES)
            # a _Deferred stands in for the array: the writer reads its shape, dtype and nbytes, then tofile
            writer.add_tensor(
                t.name,
                _Deferred(shape, np.uint8, q4_0),  # type: ignore[arg-type]
                raw_dtype=gguf.GGMLQuantizationType.Q4_0,
            )
            continue
        w = params.get(t.param)
        if w is None:
            raise LanternError(f"gguf: the artifact has no parameter '{t.param}' for tensor '{t.name}'")
        dtype = np.float16 if quant == "q0f16" and w.ndim == 2 and not t.float32 else np.float32

        def plain(t=t, w=w, dtype=dtype) -> np.ndarray:
            w = w[t.first : t.first + t.rows]
            if t.rope_heads:
                w = layout.permute(w, t.rope_heads)
            return np.ascontiguousarray(w.astype(dtype))

        writer.add_tensor(t.name, _Deferred((t.rows, *w.shape[1:]), dtype, plain))  # type: ignore[arg-type]  # as above

    for name, values in layout.constants(config).items():
        writer.add_tensor(name, np.asarray(values, dtype=np.float32))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(p.name for p in out.glob(f"{stem}*.gguf"))
