"""The q4 layout: numpy packer vs TVM kernels, and the MLC bit layout itself."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from lantern.errors import LanternError
from lantern.quantize import (
    QUANTIZATIONS,
    GroupQuantEmbedding,
    GroupQuantLinear,
    dequantize_weight,
    quantize_params,
    quantize_weight,
)

Q4 = QUANTIZATIONS["q4f32_1"]


def test_nibble_layout_matches_mlc():
    # One group spanning -7..7 -> scale 1; value j in 0..7 is stored as j + 7 at bits 4j.
    w = np.zeros((1, 32), np.float32)
    w[0, :8] = np.arange(8) - 0.0
    w[0, 8] = -7
    q, s = quantize_weight(w, Q4)
    assert s.shape == (1, 1) and s[0, 0] == 1.0
    word = int(q[0, 0])
    assert [(word >> (4 * j)) & 0xF for j in range(8)] == [7 + j for j in range(8)]
    assert (int(q[0, 1]) & 0xF) == 0  # -7 -> 0


def test_no_clipping_and_never_coarser_than_mlc():
    rng = np.random.default_rng(0)
    w = rng.standard_t(4, size=(48, 96)).astype(np.float32)  # heavy tails, like real weights
    q, s = quantize_weight(w, Q4)
    assert q.shape == (48, 12) and q.dtype == np.uint32 and s.shape == (48, 3)
    mlc_scale = np.abs(w.reshape(48, 3, 32)).max(-1) / 7
    assert np.all(s <= mlc_scale * (1 + 1e-6))
    err = np.abs(dequantize_weight(q, s, Q4) - w)
    assert np.all(err <= np.repeat(s, 32, axis=1) / 2 + 1e-6)  # half a step: nothing was clipped


def test_f16_scales_are_exact_in_f16():
    w = np.random.default_rng(1).normal(size=(4, 64)).astype(np.float32)
    _, s = quantize_weight(w, QUANTIZATIONS["q4f16_1"])
    assert s.dtype == np.float16


def test_indivisible_input_dim_is_refused():
    with pytest.raises(LanternError, match="not divisible by the group size 32"):
        quantize_params({"x.weight": np.zeros((8, 40), np.float32)}, {"x.weight"}, Q4)


def _run(module: nn.Module, spec: dict, args: list[np.ndarray], params: dict[str, np.ndarray]):
    mod, named = module.export_tvm(spec={"forward": spec})
    target = tvm.target.Target({"kind": "llvm"})
    with target:
        ex = relax.build(mod, target=target)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    inputs = [tvm.runtime.tensor(a) for a in args] + [tvm.runtime.tensor(params[n]) for n, _ in named]
    return vm["forward"](*inputs).numpy()


def test_fused_dequantize_matmul_matches_numpy():
    rng = np.random.default_rng(2)
    w = rng.normal(size=(40, 64)).astype(np.float32)
    x = rng.normal(size=(1, 3, 64)).astype(np.float32)
    q, s = quantize_weight(w, Q4)
    layer = GroupQuantLinear(64, 40, Q4)
    got = _run(layer, {"x": nn.spec.Tensor([1, 3, 64], "float32")}, [x], {"q_weight": q, "q_scale": s})
    np.testing.assert_allclose(got, x @ dequantize_weight(q, s, Q4).T, rtol=1e-5, atol=1e-5)


def test_quantized_embedding_rows_and_tied_head():
    rng = np.random.default_rng(3)
    table = rng.normal(size=(50, 64)).astype(np.float32)
    q, s = quantize_weight(table, Q4)
    ref = dequantize_weight(q, s, Q4)
    ids = np.array([3, 49, 0, 3], np.int32)
    emb = GroupQuantEmbedding(50, 64, Q4)
    got = _run(emb, {"input_ids": nn.spec.Tensor([4], "int32")}, [ids], {"q_weight": q, "q_scale": s})
    np.testing.assert_allclose(got, ref[ids], rtol=1e-6, atol=1e-6)
