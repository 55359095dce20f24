"""The cpu-emulated schedule's kernels (compiler/emulated.py) on WebGPU (SwiftShader) against the CPU
build of the same TIR and against numpy, at shapes with ragged edges: rows and tokens that do not fill
a tile, a GEMV long enough to run in chunks, float32 matmuls with each epilogue, GQA, several
sequences, causal and not, sliding windows."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from tvm import relax

from test_kernels_webgpu import call_on_webgpu

from lantern import emulated, link, lower
from lantern.quantize import dequantize_weight, get_quantization, quantize_weight

pytestmark = [pytest.mark.browser, pytest.mark.webgpu_build]

H_KV, H_Q, D, SM = 2, 6, 16, 0.3
LOG2E = np.log2(np.e)
RNG = np.random.default_rng(7)


def normal(*shape) -> np.ndarray:
    return RNG.normal(size=shape).astype(np.float32)


def attention_ref(q: np.ndarray, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, float]:
    """Softmax attention of one query row; lse in log2 units, as the KV cache merges it."""
    s = keys @ q * SM * LOG2E
    m = s.max()
    p = np.exp2(s - m)
    return (p @ values) / p.sum(), m + np.log2(p.sum())


# ---- the cases: (name, prim_func builder(gpu), inputs, indices of outputs, numpy reference)


def linear_case(kind: str, n: int, k: int, tokens: int, residual: bool):
    w = normal(n, k)
    qw, qs = quantize_weight(w, get_quantization("q4f32_1"))
    x = normal(1, tokens, k)
    res = normal(1, tokens, n)
    expected = x @ dequantize_weight(qw, qs, get_quantization("q4f32_1")).T + (res if residual else 0)
    build = emulated.q4_gemv if kind == "gemv" else emulated.q4_matmul
    args = [x, qw, qs] + ([res] if residual else []) + [np.zeros((1, tokens, n), np.float32)]
    return (
        f"{kind}_{n}x{k}_t{tokens}{'_res' if residual else ''}",
        lambda gpu: build(k, residual, gpu),
        args,
        [len(args) - 1],
        [expected],
    )


def f32_linear_case(n: int, k: int, tokens: int, residual: bool, bias: bool = False, gelu: bool = False):
    """q0f32's matmul: plain or + residual (a decoder's), + bias then GELU or + residual (an encoder's)."""
    x, w, b, res = normal(1, tokens, k), normal(n, k), normal(n), normal(1, tokens, n)
    expected = x @ w.T + (b if bias else 0)
    if gelu:
        expected = 0.5 * expected * (1 + np.vectorize(math.erf)(expected / np.sqrt(2)))
    expected = expected + (res if residual else 0)
    args = [x, w] + ([b] if bias else []) + ([res] if residual else []) + [np.zeros((1, tokens, n), np.float32)]
    tail = ("_bias" if bias else "") + ("_gelu" if gelu else "") + ("_res" if residual else "")
    return (
        f"f32_matmul_{n}x{k}_t{tokens}{tail}",
        lambda gpu: emulated.f32_matmul(k, residual, bias, gelu, gpu),
        args,
        [len(args) - 1],
        [expected.astype(np.float32)],
    )


def rms_norm_case(rows: int):
    x, w = normal(1, rows, 48), normal(48)
    expected = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * w
    return (f"rms_norm_{rows}", lambda gpu: emulated.rms_norm(48, 1e-5, gpu), [x, w, np.zeros_like(x)], [2], [expected])


# A paged cache of 5 pages: sequence 0 holds pages [3, 0] (16 + 4 tokens), sequence 1 page [1] (5).
PAGES = normal(5, 2, H_KV, emulated.PAGE, D)
PAGE_INDPTR, PAGE_VALUES, LAST_LEN = (np.array(a, np.int32) for a in ([0, 2, 3], [3, 0, 1], [4, 5]))


def cached_kv(seq: int, head: int) -> tuple[np.ndarray, np.ndarray]:
    pages, last = ([3, 0], 4) if seq == 0 else ([1], 5)
    slots = [(p, s) for i, p in enumerate(pages) for s in range(emulated.PAGE if i < len(pages) - 1 else last)]
    kvh = head // (H_Q // H_KV)
    return (np.array([PAGES[p, 0, kvh, s] for p, s in slots]), np.array([PAGES[p, 1, kvh, s] for p, s in slots]))


# Windowed cases (``window`` > 0, negative sm_scale): a query at position p sees the keys at positions
# p - window + 1 .. p; a cached key's position is its sequence's k_rope_pos_offset plus its column.
K_OFFSET = np.array([2, 0], np.int32)  # sequence 0's cache starts at position 2 (a forked prefix, say)


def visible(keys: np.ndarray, values: np.ndarray, q_pos: int, first_pos: int, window: int):
    """The keys and values (at positions first_pos, first_pos + 1, ...) a query at q_pos attends to."""
    cols = np.arange(len(keys)) + first_pos
    keep = (q_pos - cols < window) if window else np.ones(len(keys), bool)
    return keys[keep], values[keep]


def decode_case(window: int = 0):
    q = normal(2, H_Q, D)
    q_pos = np.array([21, 4], np.int32) if window else np.zeros(2, np.int32)  # each sequence's newest token
    k_off = K_OFFSET if window else np.zeros(2, np.int32)
    expected = [
        attention_ref(q[b, h], *visible(*cached_kv(b, h), q_pos[b], k_off[b], window)) for b in range(2) for h in range(H_Q)
    ]
    scalars = {"rotary_mode": 0, "rope_scale": 1.0, "rope_theta": 1e4, "sm_scale": -SM if window else SM}
    return (
        f"decode_attention{f'_window{window}' if window else ''}",
        lambda gpu: _bind(emulated.decode_attention(H_KV, H_Q, D, gpu, window=window), scalars),
        [q, PAGES, PAGE_INDPTR, PAGE_VALUES, LAST_LEN, k_off, q_pos, np.zeros_like(q), np.zeros((2, H_Q), np.float32)],
        [7, 8],
        [np.array([o for o, _ in expected]).reshape(2, H_Q, D), np.array([m for _, m in expected]).reshape(2, H_Q)],
    )


Q_INDPTR = np.array([0, 3, 5], np.int32)  # 3 new tokens of sequence 0, 2 of sequence 1


def prefill_case(causal: int, window: int = 0):
    """New tokens against the cache: with a window, causal 0 as the KV cache calls it (the chunk
    follows the cache: sequence 0's 3 tokens at positions 22-24, sequence 1's 2 at 5-6)."""
    q = normal(5, H_Q, D)
    q_pos = np.array([22, 23, 24, 5, 6], np.int32) if window else np.zeros(5, np.int32)
    k_off = K_OFFSET if window else np.zeros(2, np.int32)
    out, lse = [], []
    for t in range(5):
        seq, row, qo = (0, t, 3) if t < 3 else (1, t - 3, 2)
        for h in range(H_Q):
            keys, values = cached_kv(seq, h)
            seen = len(keys) - qo + row + 1 if causal else len(keys)
            o, m = attention_ref(q[t, h], *visible(keys[:seen], values[:seen], q_pos[t], k_off[seq], window))
            out.append(o)
            lse.append(m)
    scalars = {"causal": causal, "rotary_mode": 0, "rope_scale": 1.0, "rope_theta": 1e4, "sm_scale": -SM if window else SM}
    return (
        f"prefill_attention_causal{causal}{f'_window{window}' if window else ''}",
        lambda gpu: _bind(emulated.prefill_attention(H_KV, H_Q, D, gpu, window=window), scalars),
        [q, Q_INDPTR, PAGES, PAGE_INDPTR, PAGE_VALUES, LAST_LEN, k_off, q_pos, np.zeros_like(q), np.zeros((5, H_Q), np.float32)],
        [8, 9],
        [np.array(out).reshape(5, H_Q, D), np.array(lse).reshape(5, H_Q)],
    )


def ragged_case(window: int = 0):
    """The chunk's own tokens, causal; with a window of 2 each sees itself and the one before."""
    q, k, v = normal(5, H_Q, D), normal(5, H_KV, D), normal(5, H_KV, D)
    q_pos = np.array([22, 23, 24, 5, 6], np.int32) if window else np.zeros(5, np.int32)
    k_off = np.array([22, 5], np.int32) if window else np.zeros(2, np.int32)  # the chunk's first positions
    out, lse = [], []
    for t in range(5):
        seq, start, row = (0, 0, t) if t < 3 else (1, 3, t - 3)
        for h in range(H_Q):
            kvh = h // (H_Q // H_KV)
            o, m = attention_ref(
                q[t, h], *visible(k[start : start + row + 1, kvh], v[start : start + row + 1, kvh], q_pos[t], k_off[seq], window)
            )
            out.append(o)
            lse.append(m)
    scalars = {"causal": 1, "rotary_mode": 0, "rope_scale": 1.0, "rope_theta": 1e4, "sm_scale": -SM if window else SM}
    return (
        f"ragged_attention{f'_window{window}' if window else ''}",
        lambda gpu: _bind(emulated.ragged_attention(H_KV, H_Q, D, gpu, window=window), scalars),
        [q, Q_INDPTR, k, v, Q_INDPTR, q_pos, k_off, np.zeros_like(q), np.zeros((5, H_Q), np.float32)],
        [7, 8],
        [np.array(out).reshape(5, H_Q, D), np.array(lse).reshape(5, H_Q)],
    )


def _bind(func, scalars: dict):
    """The kernel with its scalar parameters fixed (relax passes only tensors here)."""
    return func.specialize({p: tvm.tirx.const(scalars[p.name], str(p.ty.dtype)) for p in func.params if p.name in scalars})


CASES = [
    linear_case("gemv", 37, 96, 1, False),
    linear_case("gemv", 24, 1600, 1, True),
    linear_case("matmul", 37, 64, 5, False),
    linear_case("matmul", 130, 96, 9, True),
    linear_case("matmul", 20, 32, 1, True),
    f32_linear_case(37, 64, 5, False),
    f32_linear_case(130, 96, 9, True),
    f32_linear_case(50, 48, 7, False, bias=True, gelu=True),
    f32_linear_case(9, 16, 3, True, bias=True),
    f32_linear_case(20, 32, 1, False, bias=True),
    rms_norm_case(1),
    rms_norm_case(7),
    decode_case(),
    prefill_case(0),
    prefill_case(1),
    ragged_case(),
    decode_case(window=6),
    prefill_case(0, window=6),
    ragged_case(window=2),
]


def module(gpu: bool) -> tvm.IRModule:
    """One relax function per case, calling its kernel on its inputs."""
    bb = relax.BlockBuilder()
    for name, build, args, outs, _ in CASES:
        params = [relax.Var(f"a{i}", relax.TensorType(a.shape, str(a.dtype))) for i, a in enumerate(args)]
        with bb.function(name, params):
            gv = bb.add_func(build(gpu).with_attr("global_symbol", f"{name}_kernel"), f"{name}_kernel")
            result = bb.emit(relax.call_tir_inplace(gv, params, inplace_indices=outs, out_ty=[params[i].ty for i in outs]))
            bb.emit_func_output(result)
    return bb.finalize()


@pytest.fixture(scope="module")
def results(tmp_path_factory, cache_dir):
    folder = tmp_path_factory.mktemp("emulated")
    webgpu = lower.TARGETS["webgpu"]()
    with webgpu:
        ex = relax.build(module(gpu=True), target=webgpu, relax_pipeline=relax.get_default_pipeline(webgpu))
    link.link_wasm(ex, folder / "kernels.wasm", cache_dir)
    calls = [(name, args) for name, _, args, _, _ in CASES]
    got = call_on_webgpu(folder, "kernels.wasm", calls)
    cpu_target = lower.TARGETS["cpu"]()
    with cpu_target:
        vm = relax.VirtualMachine(relax.build(module(gpu=False), target=cpu_target), tvm.cpu())
    cpu = []
    for name, args in calls:
        ret = vm[name](*[tvm.runtime.tensor(a) for a in args])
        cpu.append([t.numpy() for t in (ret if isinstance(ret, (list, tuple, tvm.ir.Array)) else [ret])])
    return dict(zip([c[0] for c in CASES], zip(got, cpu)))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kernel_on_webgpu_matches_cpu_and_numpy(case, results):
    name, _, _, _, expected = case
    got, cpu = results[name]
    for g, c, e in zip(got, cpu, expected):
        g = np.asarray(g, np.float32).reshape(e.shape)
        np.testing.assert_allclose(c, e, rtol=2e-5, atol=2e-5, err_msg=f"{name}: CPU build vs numpy")
        np.testing.assert_allclose(g, c, rtol=2e-5, atol=2e-5, err_msg=f"{name}: WebGPU vs CPU build")
