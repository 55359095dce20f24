"""GPU kernels Lantern ships in place of TVM 0.27's where those are wrong on WebGPU, and the
signatures its hand-written linear kernels share (at the end).

``tir_attention_merge_state``: TVM's kernel lets every lane of a head read the
running log-sum-exp ``S[n, h]`` and write it back in place with no barrier, so
on SwiftShader (and, rarely, real GPUs) a lane can read a value another lane
already updated: every prefill on top of existing history came out wrong. Here
one thread owns one (token, head) pair: it reads S once, merges all ``D``
values and writes S once. No sharing, so no race and no barrier.
"""

from __future__ import annotations

import tvm
from tvm.script import tirx as T

THREADS = 64


def loops(gpu: bool):
    """(block loop, thread loop) for hand-written kernels: GPU thread bindings, or serial loops
    for a CPU build of the same TIR (the server samples with it; tests compare the two)."""
    if gpu:
        return (lambda n: T.thread_binding(n, thread="blockIdx.x"), lambda n: T.thread_binding(n, thread="threadIdx.x"))
    return (lambda n: T.serial(n)), (lambda n: T.serial(n))


def merge_state_inplace(v_dtype: str):
    @T.prim_func(s_tir=True)
    def merge_state(v: T.handle, s: T.handle, v_other: T.handle, s_other: T.handle):
        T.func_attr({"tirx.is_scheduled": True})
        N = T.int32()
        H = T.int32()
        D = T.int32()
        V = T.match_buffer(v, (N, H, D), v_dtype)
        S = T.match_buffer(s, (N, H), "float32")
        V_other = T.match_buffer(v_other, (N, H, D), v_dtype)
        S_other = T.match_buffer(s_other, (N, H), "float32")
        for bx in T.thread_binding((N * H + THREADS - 1) // THREADS, thread="blockIdx.x"):
            for tx in T.thread_binding(THREADS, thread="threadIdx.x"):
                with T.sblock("merge"):
                    scale = T.sblock_alloc_buffer((2,), "float32", scope="local")
                    s_max = T.sblock_alloc_buffer((1,), "float32", scope="local")
                    if bx * THREADS + tx < N * H:
                        s_max[0] = T.max(
                            S[(bx * THREADS + tx) // H, (bx * THREADS + tx) % H],
                            S_other[(bx * THREADS + tx) // H, (bx * THREADS + tx) % H],
                        )
                        scale[0] = T.exp2(S[(bx * THREADS + tx) // H, (bx * THREADS + tx) % H] - s_max[0])
                        scale[1] = T.exp2(S_other[(bx * THREADS + tx) // H, (bx * THREADS + tx) % H] - s_max[0])
                        for d in T.serial(D):
                            V[(bx * THREADS + tx) // H, (bx * THREADS + tx) % H, d] = T.Cast(
                                v_dtype,
                                (
                                    T.Cast("float32", V[(bx * THREADS + tx) // H, (bx * THREADS + tx) % H, d]) * scale[0]
                                    + T.Cast("float32", V_other[(bx * THREADS + tx) // H, (bx * THREADS + tx) % H, d]) * scale[1]
                                )
                                / (scale[0] + scale[1]),
                            )
                        S[(bx * THREADS + tx) // H, (bx * THREADS + tx) % H] = T.log2(scale[0] + scale[1]) + s_max[0]

    return merge_state


def replace_racy_kernels(mod: tvm.IRModule, dtype: str) -> tvm.IRModule:
    """Swap TVM's racy GPU kernels in ``mod`` for the ones above (GPU targets only)."""
    for gv, _ in list(mod.functions.items()):
        if gv.name_hint == "tir_attention_merge_state":
            mod[gv] = merge_state_inplace(dtype).with_attr("global_symbol", gv.name_hint)
    return mod


# --------------------------------------------------------------------------- linear-layer signatures
#
# The hand-written linear kernels (emulated.py for software WebGPU adapters, cpu_schedule.py for the
# CPU library) share their signatures: the model's fused ``dequantize -> matmul [-> add]`` (q4) and
# ``linear [-> add]`` (float32) functions, which they replace. Each kernel supplies a ``body`` macro;
# these wrap it. ``body(x, <weights>, res, out, n)`` for one token (``res`` None without a
# residual), ``body(xf, <weights>, resf, outf, tokens, n)`` over flat buffers for any number.

SCHEDULED = {"tirx.is_scheduled": True, "tirx.noalias": True}
GROUP = 32  # q4 group size (MLC layout, see quantize.py)


def nibble(word, j: int):
    """Code ``j`` (0..7) of a packed uint32 word as a float, minus MLC's offset of 7."""
    return T.Cast("float32", T.Cast("int32", (word >> T.uint32(4 * j)) & T.uint32(15)) - 7)


# erf(x) = x * P(x^2) / Q(x^2) on [-4, 4] (erf(4) is 1 in float32): a rational fit of our own (linear least
# squares on 20,000 points of [0, 4], reweighted by 1 / Q), largest error 4e-7 in float32 (tests/test_cpu_kernels.py).
# libm's erff is a call per value: in wasm it took 38 ns each, longer than an encoder's GELU linear's sums.
ERF_P = (
    1.1283790461421923,
    0.1923081936202691,
    0.0529817630300726,
    0.00384470628341364,
    2.861879973576708e-4,
    2.027286571001685e-6,
)
ERF_Q = (1.0, 0.5037605984768159, 0.11487953586810018, 0.015124428901047617, 1.1810574152860227e-3, 3.792855604673964e-5)


def _horner(coefficients, t):
    acc = T.float32(coefficients[-1])
    for c in reversed(coefficients[:-1]):
        acc = acc * t + T.float32(c)
    return acc


def erf(x):
    """erf in float32 through ERF_P / ERF_Q: multiplies, adds and one division (no libm call)."""
    clamped = T.max(T.min(x, T.float32(4)), T.float32(-4))
    t = clamped * clamped
    return clamped * _horner(ERF_P, t) / _horner(ERF_Q, t)


def exact_gelu(v):
    """GELU as transformers' "gelu" (erf, not the tanh approximation), with ``erf`` above."""
    return T.float32(0.5) * v * (T.float32(1) + erf(v * T.float32(0.7071067811865476)))


@T.macro
def linear_out(total, resf, outf, at, row, bias, gelu):
    """One output of a float32 linear (the CPU library's and the emulated WebGPU one's): its sum
    ``total``, plus the row's ``bias`` then GELU if ``gelu`` (an encoder's), plus the residual ``resf``."""
    if bias is None:
        if resf is None:
            outf[at] = total
        else:
            outf[at] = resf[at] + total
    elif gelu:
        outf[at] = exact_gelu(bias[row] + total)
    elif resf is None:
        outf[at] = bias[row] + total
    else:
        outf[at] = resf[at] + (bias[row] + total)


def q4_gemv_func(k: int, residual: bool, body) -> tvm.tirx.PrimFunc:
    groups = k // GROUP
    if residual:

        @T.prim_func(s_tir=True)
        def gemv_res(
            x: T.Buffer((1, 1, k), "float32"),  # type: ignore[valid-type]  # TVMScript's T.Buffer(...)
            var_qw: T.handle,
            var_qs: T.handle,
            var_res: T.handle,
            var_out: T.handle,
        ):
            T.func_attr(SCHEDULED)
            n = T.int32()
            qw = T.match_buffer(var_qw, (n, k // 8), "uint32")
            qs = T.match_buffer(var_qs, (n, groups), "float32")
            res = T.match_buffer(var_res, (1, 1, n), "float32")
            out = T.match_buffer(var_out, (1, 1, n), "float32")
            body(x, qw, qs, res, out, n)

        return gemv_res

    @T.prim_func(s_tir=True)
    def gemv(
        x: T.Buffer((1, 1, k), "float32"),  # type: ignore[valid-type]  # TVMScript's T.Buffer(...)
        var_qw: T.handle,
        var_qs: T.handle,
        var_out: T.handle,
    ):
        T.func_attr(SCHEDULED)
        n = T.int32()
        qw = T.match_buffer(var_qw, (n, k // 8), "uint32")
        qs = T.match_buffer(var_qs, (n, groups), "float32")
        out = T.match_buffer(var_out, (1, 1, n), "float32")
        body(x, qw, qs, None, out, n)

    return gemv


def q4_matmul_func(k: int, residual: bool, body) -> tvm.tirx.PrimFunc:
    groups = k // GROUP
    if residual:

        @T.prim_func(s_tir=True)
        def matmul_res(var_x: T.handle, var_qw: T.handle, var_qs: T.handle, var_res: T.handle, var_out: T.handle):
            T.func_attr(SCHEDULED)
            b = T.int32()
            s = T.int32()
            n = T.int32()
            x = T.match_buffer(var_x, (b, s, k), "float32")
            qw = T.match_buffer(var_qw, (n, k // 8), "uint32")
            qs = T.match_buffer(var_qs, (n, groups), "float32")
            res = T.match_buffer(var_res, (b, s, n), "float32")
            out = T.match_buffer(var_out, (b, s, n), "float32")
            xf = T.decl_buffer((b * s * k,), "float32", data=x.data)
            resf = T.decl_buffer((b * s * n,), "float32", data=res.data)
            outf = T.decl_buffer((b * s * n,), "float32", data=out.data)
            body(xf, qw, qs, resf, outf, b * s, n)

        return matmul_res

    @T.prim_func(s_tir=True)
    def matmul(var_x: T.handle, var_qw: T.handle, var_qs: T.handle, var_out: T.handle):
        T.func_attr(SCHEDULED)
        b = T.int32()
        s = T.int32()
        n = T.int32()
        x = T.match_buffer(var_x, (b, s, k), "float32")
        qw = T.match_buffer(var_qw, (n, k // 8), "uint32")
        qs = T.match_buffer(var_qs, (n, groups), "float32")
        out = T.match_buffer(var_out, (b, s, n), "float32")
        xf = T.decl_buffer((b * s * k,), "float32", data=x.data)
        outf = T.decl_buffer((b * s * n,), "float32", data=out.data)
        body(xf, qw, qs, None, outf, b * s, n)

    return matmul


def f32_gemv_func(k: int, residual: bool, body) -> tvm.tirx.PrimFunc:
    if residual:

        @T.prim_func(s_tir=True)
        def gemv_res(
            x: T.Buffer((1, 1, k), "float32"),  # type: ignore[valid-type]  # TVMScript's T.Buffer(...)
            var_w: T.handle,
            var_res: T.handle,
            var_out: T.handle,
        ):
            T.func_attr(SCHEDULED)
            n = T.int32()
            w = T.match_buffer(var_w, (n, k), "float32")
            res = T.match_buffer(var_res, (1, 1, n), "float32")
            out = T.match_buffer(var_out, (1, 1, n), "float32")
            body(x, w, res, out, n)

        return gemv_res

    @T.prim_func(s_tir=True)
    def gemv(
        x: T.Buffer((1, 1, k), "float32"),  # type: ignore[valid-type]  # TVMScript's T.Buffer(...)
        var_w: T.handle,
        var_out: T.handle,
    ):
        T.func_attr(SCHEDULED)
        n = T.int32()
        w = T.match_buffer(var_w, (n, k), "float32")
        out = T.match_buffer(var_out, (1, 1, n), "float32")
        body(x, w, None, out, n)

    return gemv


def f32_matmul_func(k: int, residual: bool, body, bias: bool = False) -> tvm.tirx.PrimFunc:
    if bias and residual:

        @T.prim_func(s_tir=True)
        def matmul_bias_res(var_x: T.handle, var_w: T.handle, var_bias: T.handle, var_res: T.handle, var_out: T.handle):
            T.func_attr(SCHEDULED)
            b = T.int32()
            s = T.int32()
            n = T.int32()
            x = T.match_buffer(var_x, (b, s, k), "float32")
            w = T.match_buffer(var_w, (n, k), "float32")
            bias_row = T.match_buffer(var_bias, (n,), "float32")
            res = T.match_buffer(var_res, (b, s, n), "float32")
            out = T.match_buffer(var_out, (b, s, n), "float32")
            xf = T.decl_buffer((b * s * k,), "float32", data=x.data)
            resf = T.decl_buffer((b * s * n,), "float32", data=res.data)
            outf = T.decl_buffer((b * s * n,), "float32", data=out.data)
            body(xf, w, resf, outf, b * s, n, bias_row)

        return matmul_bias_res
    if bias:

        @T.prim_func(s_tir=True)
        def matmul_bias(var_x: T.handle, var_w: T.handle, var_bias: T.handle, var_out: T.handle):
            T.func_attr(SCHEDULED)
            b = T.int32()
            s = T.int32()
            n = T.int32()
            x = T.match_buffer(var_x, (b, s, k), "float32")
            w = T.match_buffer(var_w, (n, k), "float32")
            bias_row = T.match_buffer(var_bias, (n,), "float32")
            out = T.match_buffer(var_out, (b, s, n), "float32")
            xf = T.decl_buffer((b * s * k,), "float32", data=x.data)
            outf = T.decl_buffer((b * s * n,), "float32", data=out.data)
            body(xf, w, None, outf, b * s, n, bias_row)

        return matmul_bias
    if residual:

        @T.prim_func(s_tir=True)
        def matmul_res(var_x: T.handle, var_w: T.handle, var_res: T.handle, var_out: T.handle):
            T.func_attr(SCHEDULED)
            b = T.int32()
            s = T.int32()
            n = T.int32()
            x = T.match_buffer(var_x, (b, s, k), "float32")
            w = T.match_buffer(var_w, (n, k), "float32")
            res = T.match_buffer(var_res, (b, s, n), "float32")
            out = T.match_buffer(var_out, (b, s, n), "float32")
            xf = T.decl_buffer((b * s * k,), "float32", data=x.data)
            resf = T.decl_buffer((b * s * n,), "float32", data=res.data)
            outf = T.decl_buffer((b * s * n,), "float32", data=out.data)
            body(xf, w, resf, outf, b * s, n)

        return matmul_res

    @T.prim_func(s_tir=True)
    def matmul(var_x: T.handle, var_w: T.handle, var_out: T.handle):
        T.func_attr(SCHEDULED)
        b = T.int32()
        s = T.int32()
        n = T.int32()
        x = T.match_buffer(var_x, (b, s, k), "float32")
        w = T.match_buffer(var_w, (n, k), "float32")
        out = T.match_buffer(var_out, (b, s, n), "float32")
        xf = T.decl_buffer((b * s * k,), "float32", data=x.data)
        outf = T.decl_buffer((b * s * n,), "float32", data=out.data)
        body(xf, w, None, outf, b * s, n)

    return matmul
