"""Turn an artifact's stored parameters back into Hugging Face float weights (for numpy_llama)."""

import numpy as np

from lantern.quantize import QUANTIZATIONS, dequantize_weight


def hf_weights_from_artifact(params: dict[str, np.ndarray], cfg: dict, quant: str) -> dict[str, np.ndarray]:
    spec = QUANTIZATIONS[quant]
    dense = {}
    for name, arr in params.items():
        if name.endswith(".q_weight"):
            stem = name[: -len(".q_weight")]
            dense[stem + ".weight"] = dequantize_weight(arr, params[stem + ".q_scale"], spec)
        elif not name.endswith(".q_scale"):
            dense[name] = arr.astype(np.float32)
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    d = cfg.get("head_dim") or cfg["hidden_size"] // heads
    out = {}
    for name, w in dense.items():
        if name.endswith("self_attn.qkv_proj.weight"):
            p = name[: -len("qkv_proj.weight")]
            out[p + "q_proj.weight"], out[p + "k_proj.weight"], out[p + "v_proj.weight"] = np.split(
                w, [heads * d, (heads + kv) * d]
            )
        elif name.endswith("mlp.gate_up_proj.weight"):
            p = name[: -len("gate_up_proj.weight")]
            out[p + "gate_proj.weight"], out[p + "up_proj.weight"] = np.split(w, 2)
        else:
            out[name] = w
    return out
