"""Llama-family variants (untied head, llama3 RoPE scaling, GQA ratios) against transformers in torch."""

import json

import numpy as np
import pytest

from tiny_models import write_hf_folder

from lantern.runtime.artifact import Artifact

VARIANTS = {
    "untied-head": {"tie_word_embeddings": False},
    "llama3-rope": {
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    },
    "multi-query": {"num_key_value_heads": 1},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_matches_transformers(variant, real_tokenizer_dir, build_artifact, tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("variant") / variant
    write_hf_folder(folder, real_tokenizer_dir, seed=4, **VARIANTS[variant])
    reference = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tokens = [int(t) for t in np.random.default_rng(5).integers(0, 49152, 48)]
    with torch.no_grad():
        expected = reference(torch.tensor([tokens])).logits[0].numpy()
    art = Artifact.open(build_artifact(folder, "q0f32"))
    got = art.cpu_model().all_logits(tokens)
    np.testing.assert_allclose(got, expected, atol=2e-4 * np.abs(expected).max())
    if "rope_scaling" in VARIANTS[variant]:  # the reference really used the scaled RoPE
        assert reference.config.rope_parameters["rope_type"] == "llama3"
        assert json.loads((art.path / "mlc-chat-config.json").read_text())["model_config"]["rope_scaling"]
