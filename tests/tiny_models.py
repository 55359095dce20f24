"""Random-initialised tiny models with a real tokenizer: fast inputs for the build pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from lantern.models.llama.loader import layer_shapes

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}


def random_llama_weights(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * d
    w = {"model.embed_tokens.weight": rng.normal(0, 1.0, (v, h)), "model.norm.weight": 1 + 0.1 * rng.normal(size=h)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = rng.normal(0, 0.2, (v, h))
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        for name, shape in layer_shapes(h, kv, h, i).items():  # queries as wide as the hidden size
            w[p + name] = rng.normal(0, 0.6 / np.sqrt(shape[1]), shape)
        w[p + "input_layernorm.weight"] = 1 + 0.1 * rng.normal(size=h)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.normal(size=h)
    return {k: v.astype(np.float32) for k, v in w.items()}


def write_hf_folder(folder: Path, tokenizer_dir: Path, *, seed: int = 0, **overrides) -> dict[str, np.ndarray]:
    """Write config.json, model.safetensors and the tokenizer files; return the weights."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = len(tok["model"]["vocab"])
    cfg = {**TINY_CONFIG, "vocab_size": vocab, **overrides}
    weights = random_llama_weights(cfg, seed)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(weights, str(folder / "model.safetensors"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tokenizer_dir / name).read_bytes())
    return weights


# Odd shapes on purpose: head_dim != hidden / heads (Qwen3), a GQA ratio of 4, an intermediate size
# that is not a power of two; every input dimension still splits into q4 groups of 32; sliding windows
# of 16, shorter than the tests' prompts (40 tokens; 21 then 13 on top in the browser). No head_dim
# of 16: with a GQA ratio of 4, TVM 0.27's WebGPU sliding-window prefill and tree-attention kernels
# fail to build at that size (no real model of these families has it; theirs are 64-256).
FAMILY_CONFIGS = {
    "llama": (
        "MistralConfig",
        "MistralForCausalLM",
        {  # Mistral: the llama family with a window on every layer
            "hidden_size": 128,
            "intermediate_size": 160,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "sliding_window": 16,
            "rope_theta": 10000.0,
            "rms_norm_eps": 1e-5,
            "max_position_embeddings": 256,
            "tie_word_embeddings": False,
        },
    ),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {  # Phi-3.5's longrope: 256 positions trained, 4096 claimed
            "hidden_size": 128,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rope_theta": 10000.0,
            "rms_norm_eps": 1e-5,
            "max_position_embeddings": 4096,
            "original_max_position_embeddings": 256,
            "tie_word_embeddings": False,
            "pad_token_id": 0,
            "rope_scaling": {
                "type": "longrope",
                "short_factor": [1.0 + 0.15 * i for i in range(16)],
                "long_factor": [4.0 + i for i in range(16)],
            },
        },
    ),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 256,
            "tie_word_embeddings": False,
        },
    ),
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        {
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 256,
            "tie_word_embeddings": True,
        },
    ),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {  # caps small enough that tanh bends the tiny model's values
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "layer_types": ["sliding_attention", "full_attention"],
            "attn_logit_softcapping": 0.5,
            "final_logit_softcapping": 1.5,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "query_pre_attn_scalar": 48,
            "sliding_window": 16,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 256,
            "tie_word_embeddings": True,
        },
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {  # a local layer (its own RoPE base), then a global one
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "layer_types": ["sliding_attention", "full_attention"],
            "num_key_value_heads": 1,
            "head_dim": 32,
            "query_pre_attn_scalar": 48,
            "sliding_window": 16,
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 256,
            "tie_word_embeddings": True,
        },
    ),
}


# Models of a family's classes with other shapes, made with the fields a test passes (test_families runs
# every FAMILY_CONFIGS entry; these are for the tests that name them)
VARIANT_CLASSES = {"llama3": ("LlamaConfig", "LlamaForCausalLM", {})}


def vocab_size_of(tokenizer_json: dict) -> int:
    """Rows a model needs for this tokenizer.json: its vocabulary and added tokens."""
    return 1 + max([*tokenizer_json["model"]["vocab"].values(), *(t["id"] for t in tokenizer_json.get("added_tokens", []))])


def write_family_folder(family: str, folder: Path, tokenizer_dir: Path, seed: int = 0, **overrides):
    """A random tiny model of ``family`` made by transformers' own config and model classes, saved as
    an HF folder with the real tokenizer; returns the torch model. Biases and norm weights are drawn
    at random too (transformers starts them at 0 and 1, which would hide a missing bias or norm)."""
    import torch
    import transformers

    config_class, model_class, fields = {**FAMILY_CONFIGS, **VARIANT_CLASSES}[family]
    vocab = vocab_size_of(json.loads((tokenizer_dir / "tokenizer.json").read_text()))
    config = getattr(transformers, config_class)(vocab_size=vocab, initializer_range=0.06, **{**fields, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.3)
            elif "norm" in name:  # Gemma's RMSNorm scales by (1 + w): its neutral weight is 0
                p.copy_((0 if family.startswith("gemma") else 1) + 0.1 * torch.randn_like(p))
    model.save_pretrained(str(folder))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tokenizer_dir / name).read_bytes())
    return model


# Decoder embedders with random weights: transformers' base-model class, the config fields of a shape,
# and the special tokens the real model's tokenizer puts around a text (Qwen3-Embedding appends
# <|endoftext|>, on which it pools; EmbeddingGemma wraps a text in <bos> ... <eos>).
EMBEDDER_CLASSES = {
    "qwen3-embedding": ("Qwen3Config", "Qwen3Model", {"architectures": ["Qwen3ForCausalLM"]}, [], ["<|endoftext|>"]),
    "gemma-embedding": (
        "Gemma3TextConfig",
        "Gemma3TextModel",
        {"architectures": ["Gemma3TextModel"], "use_bidirectional_attention": True},
        ["<bos>"],
        ["<eos>"],
    ),
}
SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim")


def embedder_shape(*dims: int, **more) -> dict:
    """config.json fields of a decoder embedder's shape: SHAPE_FIELDS in order, then ``more``."""
    return {**dict(zip(SHAPE_FIELDS, dims, strict=True)), "rms_norm_eps": 1e-6, **more}


TINY_EMBEDDERS = {  # shapes for tests: the GQA, q/k norms, windows and Dense layers of the real ones
    "qwen3-embedding": embedder_shape(64, 96, 2, 4, 1, 32, rope_theta=1e6, max_position_embeddings=256, tie_word_embeddings=True),
    # five local layers and a global one, as llama.cpp's gemma-embedding fixes; keys within 8 tokens either side
    "gemma-embedding": embedder_shape(
        64, 96, 6, 2, 1, 32, query_pre_attn_scalar=32, sliding_window=16, max_position_embeddings=256
    ),
}


def _template_around(tokenizer: dict, before: list[str], after: list[str]) -> dict:
    """tokenizer.json with a post-processor that puts ``before`` and ``after`` around a text."""
    ids = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}

    def special(name: str) -> dict:
        return {"SpecialToken": {"id": name, "type_id": 0}}

    single = [*map(special, before), {"Sequence": {"id": "A", "type_id": 0}}, *map(special, after)]
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": single,
        "pair": single + [{"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {n: {"id": n, "ids": [ids[n]], "tokens": [n]} for n in {*before, *after}},
    }
    return tokenizer


def write_embedder_folder(
    kind: str,
    folder: Path,
    tokenizer_dir: Path,
    fields: dict,
    dense: tuple[int, ...] = (),
    max_seq_length: int = 256,
    seed: int = 0,
    dtype: str = "float32",
) -> None:
    """A sentence-transformers folder of a decoder embedder with random weights: transformers' base model
    (``fields`` its config), mean (gemma) or last-token (qwen3) pooling, Dense layers of the ``dense``
    widths (no bias, as EmbeddingGemma's), Normalize, and the real tokenizer with the model's special
    tokens. ``dtype``: the weights' type on disk (a real-size model is made in bfloat16, as checkpoints ship)."""
    import torch
    import transformers
    from safetensors.torch import save_file as save_torch

    config_class, model_class, extra, before, after = EMBEDDER_CLASSES[kind]
    torch_dtype = getattr(torch, dtype)
    tokenizer = _template_around(json.loads((tokenizer_dir / "tokenizer.json").read_text()), before, after)
    own = {k: v for k, v in extra.items() if k != "architectures"}  # config.json names the causal LM class
    config = getattr(transformers, config_class)(vocab_size=vocab_size_of(tokenizer), initializer_range=0.06, **own, **fields)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # Gemma's RMSNorm scales by (1 + w): its neutral weight is 0
                p.copy_((0 if kind.startswith("gemma") else 1) + 0.1 * torch.randn_like(p))
    model.to(torch_dtype).save_pretrained(str(folder), max_shard_size="2GB")
    del model
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": extra["architectures"]}, indent=2))
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    (folder / "tokenizer_config.json").write_bytes((tokenizer_dir / "tokenizer_config.json").read_bytes())
    pooling = "mean_tokens" if kind.startswith("gemma") else "lasttoken"
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    modules.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({f"pooling_mode_{pooling}": True, "word_embedding_dimension": config.hidden_size})
    )
    width = config.hidden_size
    for out in dense:
        i = len(modules)
        layer = torch.nn.Linear(width, out, bias=False, dtype=torch_dtype)
        torch.nn.init.normal_(layer.weight, 0, width**-0.5)
        (folder / f"{i}_Dense").mkdir()
        save_torch({"linear.weight": layer.weight.detach().contiguous()}, str(folder / f"{i}_Dense" / "model.safetensors"))
        (folder / f"{i}_Dense" / "config.json").write_text(
            json.dumps(
                {
                    "in_features": width,
                    "out_features": out,
                    "bias": False,
                    "activation_function": "torch.nn.modules.linear.Identity",
                }
            )
        )
        modules.append({"idx": i, "name": str(i), "path": f"{i}_Dense", "type": "sentence_transformers.models.Dense"})
        width = out
    modules.append(
        {
            "idx": len(modules),
            "name": str(len(modules)),
            "path": f"{len(modules)}_Normalize",
            "type": "sentence_transformers.models.Normalize",
        }
    )
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    prompts = {"query": "task: search result | query: ", "document": "title: none | text: "}
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts}))


def embedder_reference(folder: Path, texts: list[str]) -> np.ndarray:
    """What sentence-transformers computes for ``texts`` with the folder's modules, in float32:
    transformers' model of the folder over the tokenizer's tokens (one text at a time), pooled as
    1_Pooling says, through the Dense layers, normalized."""
    import torch
    import transformers
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    model = transformers.AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    modules = json.loads((folder / "modules.json").read_text())
    dense = [
        load_file(str(folder / m["path"] / "model.safetensors"))["linear.weight"].float()
        for m in modules
        if m["type"].endswith("Dense")
    ]
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    last = json.loads((folder / "1_Pooling" / "config.json").read_text()).get("pooling_mode_lasttoken")
    out = []
    with torch.no_grad():
        for text in texts:
            hidden = model(input_ids=torch.tensor([tok.encode(text).ids])).last_hidden_state[0]
            v = hidden[-1] if last else hidden.mean(0)
            for w in dense:
                v = w @ v
            v = v.numpy()
            out.append(v / np.linalg.norm(v))
    return np.array(out)
