"""A PEFT LoRA adapter merged at build time changes outputs exactly as peft's merge does in torch."""

import json

import numpy as np
import pytest

from tiny_models import write_hf_folder

from lantern.runtime.artifact import Artifact
from lantern.errors import LanternError
from lantern.pipeline import BuildOptions, build


@pytest.fixture(scope="module")
def adapter(tiny_hf, tmp_path_factory):
    """A random (non-zero) LoRA on q/v/down projections, saved by peft; returns (folder, merged model)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_hf[0]), dtype=torch.float32)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    peft_model = get_peft_model(base, cfg)
    folder = tmp_path_factory.mktemp("adapter")
    peft_model.save_pretrained(str(folder))
    return folder, peft_model.merge_and_unload().eval()


def test_merged_build_matches_peft_merge(tiny_hf, adapter, build_artifact):
    import torch

    folder, merged = adapter
    tokens = [int(t) for t in np.random.default_rng(3).integers(0, 49152, 24)]
    art = Artifact.open(build_artifact(tiny_hf[0], "q0f32", lora=folder))
    assert art.manifest["source"]["lora_sha256"]
    got = art.cpu_model().all_logits(tokens)
    with torch.no_grad():
        ref = merged(torch.tensor([tokens])).logits[0].numpy()
    np.testing.assert_allclose(got, ref, atol=2e-4 * np.abs(ref).max())
    base = Artifact.open(build_artifact(tiny_hf[0], "q0f32")).cpu_model().all_logits(tokens)
    assert np.abs(base - ref).max() > 1e-2 * np.abs(ref).max(), "the adapter did not change the outputs"


def test_adapter_for_another_base_is_refused(tiny_hf, adapter, real_tokenizer_dir, tmp_path):
    other = tmp_path / "other-base"
    write_hf_folder(other, real_tokenizer_dir, hidden_size=96, intermediate_size=64)
    out = tmp_path / "out"
    with pytest.raises(LanternError, match="LoRA does not match its base"):
        build(BuildOptions(source=str(other), out=out, quant="q0f32", targets=("cpu",), lora=adapter[0], use_cache=False))
    assert not out.exists()


def test_adapter_with_unknown_module_is_refused(tiny_hf, adapter, tmp_path):
    bad = tmp_path / "bad-adapter"
    bad.mkdir()
    (bad / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8}))
    from safetensors.numpy import save_file

    save_file(
        {
            "base_model.model.model.layers.0.mlp.nonexistent.lora_A.weight": np.zeros((4, 64), np.float32),
            "base_model.model.model.layers.0.mlp.nonexistent.lora_B.weight": np.zeros((64, 4), np.float32),
        },
        str(bad / "adapter_model.safetensors"),
    )
    with pytest.raises(LanternError, match="base has no weight 'model.layers.0.mlp.nonexistent.weight'"):
        build(
            BuildOptions(source=str(tiny_hf[0]), out=tmp_path / "out", quant="q0f32", targets=("cpu",), lora=bad, use_cache=False)
        )
