"""GGUF vocabularies as people download them, against llama.cpp's own reference tokenizations: the
vocabulary-only GGUFs in the llama-cpp-python sdist (qwen2, phi-3, llama-bpe, llama-spm), each with
the texts llama.cpp's tokenizer test runs (``.inp``) and the ids it expects (``.out``). Lantern
converts a GGUF's vocabulary into the tokenizer.json both runtimes load; its ids must be those."""

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

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
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        SDIST, "-d", str(tmp)], check=True, capture_output=True)
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
    ids = [[int(t) for t in line.split()] for line in
           (folder / f"ggml-vocab-{vocab}.gguf.out").read_text().split("\n")[:len(texts)]]
    assert len(texts) == len(ids) > 20
    return list(zip(texts, ids))


@pytest.mark.parametrize("vocab", VOCABS)
def test_the_converted_vocabulary_tokenizes_as_llama_cpp_expects(vocab, vocab_dir, report):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(read_gguf_tokenizer(vocab_dir / f"ggml-vocab-{vocab}.gguf").tokenizer_json)
    pairs = reference_pairs(vocab_dir, vocab)
    wrong = [(text, want, got) for text, want in pairs
             if (got := tok.encode(text, add_special_tokens=False).ids) != want]
    report(f"GGUF vocabulary {vocab}: {len(pairs) - len(wrong)} of {len(pairs)} llama.cpp reference texts "
           "tokenize to its ids")
    assert not wrong, wrong[:3]
