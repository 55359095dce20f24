"""Decoder embedders end to end, on random-weight models of the real families with their real
tokenizers: Qwen3-Embedding (causal attention, last-token pooling on the <|endoftext|> its tokenizer
appends) and EmbeddingGemma (bidirectional attention within a window on the local layers, mean
pooling, two Dense layers, <bos> ... <eos>). Each is built unquantized and compared with transformers'
own model and the folder's sentence-transformers modules: on the server's two engines (the CPU library
and the GGUF in llama.cpp), and in Chromium on both devices (the WebGPU library on SwiftShader, and the
GGUF in llama.cpp's wasm). The real shapes' builds are ci/bench/bench_embeddings.py's ``decoders``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from browser import lantern_server
from conftest import cut_words
from test_runtime import open_page
from tiny_models import TINY_EMBEDDERS, embedder_reference, write_embedder_folder

from lantern.errors import LanternError
from lantern.pipeline import BuildOptions, build
from lantern.server.embeddings import Embedder

KINDS = ("qwen3-embedding", "gemma-embedding")
DENSE = {"qwen3-embedding": (), "gemma-embedding": (96, 64)}  # EmbeddingGemma's are 768 -> 3072 -> 768


@pytest.fixture(scope="module")
def texts(shakespeare_text) -> list[str]:
    """12 texts of 1 to 40 words (up to about 60 tokens: longer than the gemma model's window of 8
    keys either side), cut from real prose, and two with accents and CJK."""
    return [*cut_words(shakespeare_text.split(), 10, 1, 39, 1), "Café déjà vu, naïve résumé!", "中文字符 and 日本語"]


@pytest.fixture(scope="module", params=KINDS)
def embedder(request, tmp_path_factory, qwen3_tokenizer_dir, gemma3_tokenizer_dir, build_artifact, texts):
    """(kind, source folder, artifact: the q0f32 build with every target, transformers' vectors of ``texts``)."""
    kind = request.param
    tokenizer = qwen3_tokenizer_dir if kind.startswith("qwen3") else gemma3_tokenizer_dir
    folder = tmp_path_factory.mktemp(kind) / f"tiny-{kind}"
    write_embedder_folder(kind, folder, tokenizer, TINY_EMBEDDERS[kind], dense=DENSE[kind])
    reference = embedder_reference(folder, texts)
    art = build_artifact(folder, "q0f32", targets=("webgpu", "cpu", "gguf"), webgpu_schedule="cpu-emulated")
    return kind, folder, art, reference


@pytest.mark.parametrize("engine", ["tvm", "llamacpp"])
def test_vectors_match_transformers(engine, embedder, texts, report):
    kind, folder, art, reference = embedder
    server = Embedder(art, engine)
    try:
        manifest = server.art.manifest
        tokens = server.tokens(texts)
        vectors = server.embed(tokens)
    finally:
        server.close()
    facts = manifest["embedding"]
    assert manifest["model"]["kind"] == "embedding"
    assert facts["pooling"] == ("last" if kind.startswith("qwen3") else "mean") and facts["dimensions"] == 64
    assert facts["prompts"]["query"] == "task: search result | query: "  # config_sentence_transformers.json's
    # the tokens the model was trained with, as its tokenizer puts them around a text
    ends = {"qwen3-embedding": ([], [151643]), "gemma-embedding": ([2], [1])}[kind]
    assert (facts["special_tokens"]["before"], facts["special_tokens"]["after"]) == ends
    assert all(t[: len(ends[0])] == ends[0] and t[len(t) - len(ends[1]) :] == ends[1] for t in tokens)
    cos = (vectors * reference).sum(1)
    assert cos.min() >= 0.9999, (kind, engine, cos)
    report(f"{kind} (random weights) q0f32 on {engine}: cosine to transformers min {cos.min():.6f} over {len(texts)} texts")


def test_gguf_tokenizes_as_transformers(embedder, texts):
    """llama.cpp, tokenizing a text as the page's wasm device has it do, adds the special tokens the
    model's tokenizer.json adds (the GGUF's add_bos / add_eos)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from tokenizers import Tokenizer

    _, folder, art, _ = embedder
    manifest = json.loads((art / "lantern.json").read_text())
    llm = llama_cpp.Llama(str(art / manifest["gguf"]["files"][0]), vocab_only=True, verbose=False)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in texts:
        assert llm.tokenize(text.encode(), add_bos=True, special=False) == tok.encode(text).ids, text


@pytest.mark.browser
def test_both_devices_embed_as_transformers(embedder, texts, browser, report):
    """In Chromium: the WebGPU library (SwiftShader) and llama.cpp in wasm, each through
    `engine.embeddings.create` in a dedicated worker."""
    kind, _, art, reference = embedder
    with lantern_server([art], engine="tvm") as (base, _):
        context = browser.new_context()
        try:
            page = open_page(context, base)
            found = {}
            for device in ("webgpu", "wasm"):
                stats = page.evaluate("([m, d]) => load(m, { device: d })", [f"/models/{art.name}/", device])
                out = page.evaluate("(req) => engine.embeddings.create(req)", {"input": texts})
                assert stats["device"] == device and out["lantern_device"] == device
                found[device] = np.array([d["embedding"] for d in out["data"]])
        finally:
            context.close()
    for device, vectors in found.items():
        cos = (vectors * reference).sum(1)
        assert cos.min() >= 0.9999, (kind, device, cos)
        report(f"{kind} (random weights) q0f32 on the {device} device: cosine to transformers min {cos.min():.6f}")


def _folder_edit(tmp_path: Path, source: Path, edit) -> Path:
    folder = tmp_path / source.name
    shutil.copytree(source, folder)
    edit(folder)
    return folder


def _write_json(path: Path, change) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda f: (f / "modules.json").unlink(), "Qwen3ForCausalLM"),  # no modules.json: built as the chat model
        (
            lambda f: _write_json(f / "modules.json", lambda m: [x for x in m if not x["type"].endswith("Pooling")]),
            "needs its sentence-transformers files: modules.json with a Pooling module",
        ),
        (
            lambda f: _write_json(f / "1_Pooling" / "config.json", lambda c: {"pooling_mode_max_tokens": True}),
            "pooling max_tokens is not implemented",
        ),
    ],
    ids=["no-modules", "no-pooling", "max-pooling"],
)
def test_what_a_decoder_embedder_folder_must_say(edit, message, embedder, tmp_path, cache_dir):
    kind, folder, _, _ = embedder
    if kind != "qwen3-embedding":
        pytest.skip("one family is enough for the folder's rules")
    bad = _folder_edit(tmp_path, folder, edit)
    if message == "Qwen3ForCausalLM":  # a Qwen3 folder without modules.json is a chat model, not refused
        from lantern.importer import import_hf_folder

        assert import_hf_folder(bad).family.name == "qwen3"
        return
    out = tmp_path / "out"
    with pytest.raises(LanternError, match=message):
        build(BuildOptions(source=str(bad), out=out, quant="q0f32", targets=("cpu",), cache_dir=cache_dir))
    assert not out.exists()


def test_dense_layers_that_llama_cpp_cannot_run(embedder, tmp_path, cache_dir):
    """A Dense activation other than Identity is refused at import; a Dense layer with a bias is built for
    the libraries, and the GGUF is skipped with the reason (llama.cpp's gemma-embedding has no bias slot)."""
    kind, folder, _, _ = embedder
    if kind != "gemma-embedding":
        pytest.skip("the Dense layers are EmbeddingGemma's")
    tanh = _folder_edit(
        tmp_path / "tanh",
        folder,
        lambda f: _write_json(
            f / "2_Dense" / "config.json", lambda c: {**c, "activation_function": "torch.nn.modules.activation.Tanh"}
        ),
    )
    with pytest.raises(LanternError, match="2_Dense/config.json: activation_function .*Tanh.* is not implemented"):
        build(BuildOptions(source=str(tanh), out=tmp_path / "a", quant="q0f32", targets=("cpu",), cache_dir=cache_dir))
    from safetensors.numpy import load_file, save_file

    def add_bias(f: Path) -> None:
        _write_json(f / "2_Dense" / "config.json", lambda c: {**c, "bias": True})
        weights = load_file(str(f / "2_Dense" / "model.safetensors"))
        save_file({**weights, "linear.bias": np.ones(96, np.float32)}, str(f / "2_Dense" / "model.safetensors"))

    biased = _folder_edit(tmp_path / "bias", folder, add_bias)
    manifest = build(
        BuildOptions(source=str(biased), out=tmp_path / "b", quant="q0f32", targets=("cpu", "gguf"), cache_dir=cache_dir)
    ).manifest
    assert manifest["gguf"] is None and "at most two Dense layers after the pooling, without biases" in manifest["gguf_skipped"]
