"""SmolLM2-135M-Instruct, built from the bundled GGUF, against transformers and numpy."""

import json

import numpy as np
import pytest

import numpy_llama
from reference_weights import hf_weights_from_artifact

from lantern.runtime.artifact import Artifact
from lantern.chat_template import render

pytestmark = pytest.mark.slow

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "Explain what a CPU does in one sentence.",
    "Translate 'good morning' into Spanish.",
]
MAX_TOKENS = 32


def prompt_ids(art: Artifact, text: str) -> list[int]:
    cfg = art.tokenizer_config()
    prompt = render(cfg["chat_template"], [{"role": "user", "content": text}])
    return art.tokenizer().encode(prompt, add_special_tokens=False).ids


def eos_id(art: Artifact) -> int:
    return art.tokenizer().token_to_id(art.tokenizer_config()["eos_token"])


@pytest.fixture(scope="module")
def q0(build_artifact):
    return Artifact.open(build_artifact("smollm2", "q0f32"))


@pytest.fixture(scope="module")
def q4(smollm2_q4):
    return smollm2_q4


@pytest.fixture(scope="module")
def transformers_model(smollm2_gguf):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32).eval()


def test_q0f32_matches_transformers(q0, transformers_model, report):
    import torch

    model, eos = q0.cpu_model(), eos_id(q0)
    for text in PROMPTS:
        ids = prompt_ids(q0, text)
        model.reset()
        ours_logits = model.prefill(ids)
        with torch.no_grad():
            ref_logits = transformers_model(torch.tensor([ids])).logits[0, -1].numpy()
            ref = transformers_model.generate(
                torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=eos
            )[0, len(ids) :].tolist()
        rel = np.abs(ours_logits - ref_logits).max() / np.abs(ref_logits).max()
        report(f"SmolLM2 q0f32 vs transformers, {text!r}: last-position logit error {rel:.1e} (relative)")
        assert rel < 1e-3, f"{text!r}: last-position logits differ by {rel:.2e} (relative)"
        ref = ref[: ref.index(eos)] if eos in ref else ref
        assert model.greedy(ids, MAX_TOKENS, stop_ids=[eos]) == ref, text


def test_q4f32_greedy_matches_numpy_reference(q4):
    cfg = {
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "hidden_size": 576,
        "head_dim": 64,
        "num_hidden_layers": 30,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
    }
    weights = hf_weights_from_artifact(q4.params(), cfg, "q4f32_1")
    model = q4.cpu_model()
    for text in PROMPTS[:3]:
        ids = prompt_ids(q4, text)
        out = model.greedy(ids, 16)
        # One numpy forward over the prompt and the answer: where its argmax at every answer position is
        # the token chosen there, numpy's own greedy decoding gives the same 16 tokens (by induction), in
        # one pass instead of 16 (numpy has no KV cache: greedy recomputed the sequence for each token).
        logits = numpy_llama.forward(weights, cfg, ids + out[:-1])
        assert logits[len(ids) - 1 :].argmax(axis=1).tolist() == out, text


def test_capital_of_france_mentions_paris(q4):
    art = q4
    ids = prompt_ids(art, PROMPTS[0])
    out = art.cpu_model().greedy(ids, MAX_TOKENS, stop_ids=[eos_id(art)])
    assert "Paris" in art.tokenizer().decode(out)


def perplexity(art: Artifact, tokens: list[int]) -> float:
    """Perplexity of the artifact's weights on ``tokens``, computed by the numpy reference forward: the
    same figure as the CPU library's to ~1e-6 (test_q4f32_greedy_matches_numpy_reference ties the two)
    in a tenth of the time on 2 cores."""
    cfg = json.loads((art.path / "mlc-chat-config.json").read_text())["model_config"]
    return weights_perplexity(hf_weights_from_artifact(art.params(), cfg, art.manifest["quantization"]), cfg, tokens)


def weights_perplexity(weights: dict[str, np.ndarray], cfg: dict, tokens: list[int]) -> float:
    """Perplexity on ``tokens`` of HF-named float weights, by the numpy reference forward."""
    logits = numpy_llama.forward(weights, cfg, tokens[:-1]).astype(np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(tokens) - 1), tokens[1:]].mean()))


# The bundled checkpoint is itself llama.cpp Q4_1 (q0f32 here is its exact dequantization), so
# q4f32_1 quantizes a second time, onto a symmetric grid. Measured on these 384 tokens (q0f32 41.2):
# rounding to nearest 51.1 (+24%), GPTQ on the built-in mixed text 49.9 (+21%). GPTQ on text like the
# held-out one (44.7, +8.5%) is a second calibration pass: ci/bench/bench_calibration.py measures it.
DEFAULT_BOUND = 1.25


def test_q4_perplexity_close_to_q0(q0, q4, shakespeare_text, report):
    assert q4.manifest["calibration"]["text"] == "mixed_english.txt"
    tokens = q0.tokenizer().encode(shakespeare_text, add_special_tokens=False).ids[:384]
    ppl_q0, ppl_default = perplexity(q0, tokens), perplexity(q4, tokens)
    report(
        f"SmolLM2 perplexity on {len(tokens)} held-out tokens of Tiny Shakespeare: q0f32 {ppl_q0:.3f}; "
        f"q4f32_1 GPTQ on the built-in text {ppl_default:.3f} (+{100 * (ppl_default / ppl_q0 - 1):.1f}%)"
    )
    assert ppl_default <= DEFAULT_BOUND * ppl_q0
