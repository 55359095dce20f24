"""The CPU library's schedule: q4 kernels of its own, and a fallback for everything else.

The q4 linears (float32 activations and scales) get hand-written kernels here, swapped in by
``emulated.rewrite(gpu=False)``: a decode GEMV and a prefill matmul, both vectorized for SSE2
(the baseline every x86-64 CPU has: the library is built once and served anywhere). Measured
on SmolLM2-135M q4f32_1, one thread: decode 192 -> 45 ms per token, a 128-token prefill
16.4 -> 3.0 s, against dlight's CPU GEMV rule and the fallback below.

TVM leaves unscheduled TIR serial on the CPU; dlight's CPU rules cover GEMV
(decode) only. The rest (float matmuls, norms, elementwise) get their leading spatial
loops fused and parallelised by ``ParallelSpatial``, which is always legal for them (every
spatial iteration writes its own outputs).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.script import tirx as T
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.target import Target

from .kernels import GROUP, SCHEDULED, f32_gemv_func, f32_matmul_func, linear_out, nibble, q4_gemv_func, q4_matmul_func


class ParallelSpatial(CPUScheduleRule):
    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        if func.attrs is not None and func.attrs.get("tirx.is_scheduled", False):
            return None
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if not infos:
            return None
        changed = False
        for info in infos:
            loops = sch.get_loops(info.block_rv)
            leading = []
            for loop, it in zip(loops, info.iters):
                if it.kind != "S":
                    break
                leading.append(loop)
            if leading:
                sch.parallel(sch.fuse(*leading) if len(leading) > 1 else leading[0])
                changed = True
        return sch if changed else None


# --------------------------------------------------------------------------- q4 linears

LANES = 4  # the packed words of a group: one SIMD lane each (4 x float32: SSE2, NEON)
TOKENS = 4  # tokens per tile of the prefill matmuls: each weight vector feeds 4 tokens


def _tree_sum(terms: list):
    """Sum of a power-of-two count of terms, pairwise (no chain of dependent adds)."""
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] for i in range(0, len(terms), 2)]
    return terms[0]


def _group_dot(xp, qw, row, g, lane):
    """Lane ``lane``'s share of group ``g``'s dot product: its word's 8 codes times their inputs."""
    return _tree_sum([xp[g * GROUP + j * LANES + lane] * nibble(qw[row, g * LANES + lane], j) for j in range(8)])


def q4_gemv(k: int, residual: bool) -> tirx.PrimFunc:
    """``out[0, 0, :] = W @ x[0, 0, :] (+ residual)`` for one token, on the CPU.

    A group of 32 codes is 4 packed words; word ``w`` holds inputs ``8w .. 8w+7``. The kernel
    vectorizes across the 4 words: code ``j`` of all four is one shift by a constant (SSE2 has
    no per-lane shifts), and the inputs it multiplies are made contiguous by permuting ``x``
    once per call (``xp[32g + 4j + w] = x[32g + 8w + j]``). Rows run in parallel."""
    groups = k // GROUP

    @T.macro
    def body(x, qw, qs, res, out, n):
        xp = T.alloc_buffer((k,), "float32")
        for i in T.serial(k):
            with T.sblock("permute"):
                xp[(i // GROUP) * GROUP + (i % 8) * LANES + (i % GROUP) // 8] = x[0, 0, i]
        for row in T.parallel(n):
            with T.sblock("gemv"):
                total = T.sblock_alloc_buffer((LANES,), "float32", scope="local")
                for lane in T.vectorized(LANES):
                    total[lane] = T.float32(0)
                for g in T.serial(groups):
                    for lane in T.vectorized(LANES):
                        total[lane] = total[lane] + _group_dot(xp, qw, row, g, lane) * qs[row, g]
                if res is None:
                    out[0, 0, row] = _tree_sum([total[lane] for lane in range(LANES)])
                else:
                    out[0, 0, row] = res[0, 0, row] + _tree_sum([total[lane] for lane in range(LANES)])

    return q4_gemv_func(k, residual, body)


@T.macro
def _row_tiles(acc, w, xf, resf, outf, m, n, k, row):
    """Row ``row`` (dequantized into the local buffer ``w``) of a q4 prefill matmul for all ``m`` tokens,
    TOKENS at a time, vectorized along ``k``: every weight vector loaded feeds TOKENS accumulators."""
    for tile in T.serial((m + TOKENS - 1) // TOKENS):
        for i in T.vectorized(TOKENS * LANES):
            acc[i] = T.float32(0)
        for c in T.serial(k // LANES):
            for t in T.unroll(TOKENS):
                for lane in T.vectorized(LANES):
                    acc[t * LANES + lane] = (
                        acc[t * LANES + lane] + w[c * LANES + lane] * xf[T.min(tile * TOKENS + t, m - 1) * k + c * LANES + lane]
                    )
        for t in T.unroll(TOKENS):
            if tile * TOKENS + t < m:
                linear_out(
                    _tree_sum([acc[t * LANES + lane] for lane in range(LANES)]),
                    resf,
                    outf,
                    (tile * TOKENS + t) * n + row,
                    row,
                    None,
                    False,
                )


def q4_matmul(k: int, residual: bool) -> tirx.PrimFunc:
    """``out[b, s, :] = W @ x[b, s, :] (+ residual)`` for any number of tokens, on the CPU.

    Rows run in parallel. Each row is dequantized once into a local buffer (scalar work, paid
    once per row, not per token), then multiplied with the tokens TOKENS at a time, vectorized
    along ``k``: every weight vector loaded feeds TOKENS independent accumulators."""
    groups = k // GROUP

    @T.macro
    def body(xf, qw, qs, resf, outf, m, n):
        for row in T.parallel(n):
            with T.sblock("matmul"):
                w = T.sblock_alloc_buffer((k,), "float32", scope="local")
                acc = T.sblock_alloc_buffer((TOKENS * LANES,), "float32", scope="local")
                for g in T.serial(groups):
                    for word in T.serial(LANES):
                        for j in T.unroll(8):
                            w[g * GROUP + word * 8 + j] = nibble(qw[row, g * LANES + word], j) * qs[row, g]
                _row_tiles(acc, w, xf, resf, outf, m, n, k, row)

    return q4_matmul_func(k, residual, body)


# --------------------------------------------------------------------------- float32 linears (q0f32)

WIDE = 16  # GEMV accumulator lanes: 4 SIMD registers, so the adds do not wait on each other


def f32_gemv(k: int, residual: bool) -> tirx.PrimFunc:
    """``out[0, 0, :] = W @ x[0, 0, :] (+ residual)`` for a float32 ``W[n, k]``; rows in parallel."""

    @T.macro
    def body(x, w, res, out, n):
        for row in T.parallel(n):
            with T.sblock("gemv"):
                acc = T.sblock_alloc_buffer((WIDE,), "float32", scope="local")
                for lane in T.vectorized(WIDE):
                    acc[lane] = T.float32(0)
                for c in T.serial(k // WIDE):
                    for lane in T.vectorized(WIDE):
                        acc[lane] = acc[lane] + w[row, c * WIDE + lane] * x[0, 0, c * WIDE + lane]
                if res is None:
                    out[0, 0, row] = _tree_sum([acc[lane] for lane in range(WIDE)])
                else:
                    out[0, 0, row] = res[0, 0, row] + _tree_sum([acc[lane] for lane in range(WIDE)])

    return f32_gemv_func(k, residual, body)


F32_ROWS = 4  # rows x tokens per tile of the float32 matmul: 8 accumulators and the 4 + 2 vectors they take
F32_TOKENS = 2  # fit SSE2's and wasm's 16 registers (measured in wasm: 4 x 2 1.5x the 1 x 4 tile, 3 x 4 1.3x)
F32_BLOCK = 64  # tokens whose inputs stay in cache while every tile of rows passes over them (wasm: 1.2x)


def f32_matmul(k: int, residual: bool, bias: bool = False, gelu: bool = False) -> tirx.PrimFunc:
    """``out[b, s, :] = W @ x[b, s, :] (+ residual)`` for a float32 ``W[n, k]``, tiles of F32_ROWS rows x
    F32_TOKENS tokens vectorized along ``k`` (each weight vector loaded feeds F32_TOKENS sums, each input
    vector F32_ROWS), tiles of rows in parallel, over blocks of F32_BLOCK tokens. An encoder's linears
    (BERT's) add their ``bias`` and then apply ``gelu`` or add the residual, in the same kernel."""
    rows, toks, block = F32_ROWS, F32_TOKENS, F32_BLOCK

    @T.macro
    def body(xf, w, resf, outf, m, n, b=None):
        for tb in T.serial((m + block - 1) // block):
            for rt in T.parallel((n + rows - 1) // rows):
                with T.sblock("matmul"):
                    acc = T.sblock_alloc_buffer((rows * toks * LANES,), "float32", scope="local")
                    for tile in T.serial((T.min(block, m - tb * block) + toks - 1) // toks):
                        for i in T.vectorized(rows * toks * LANES):
                            acc[i] = T.float32(0)
                        for c in T.serial(k // LANES):
                            for r in T.unroll(rows):
                                for t in T.unroll(toks):
                                    for lane in T.vectorized(LANES):
                                        # past the last row or token: a copy of it, computed and not written
                                        acc[(r * toks + t) * LANES + lane] = (
                                            acc[(r * toks + t) * LANES + lane]
                                            + w[T.min(rt * rows + r, n - 1), c * LANES + lane]
                                            * xf[T.min(tb * block + tile * toks + t, m - 1) * k + c * LANES + lane]
                                        )
                        for r in T.unroll(rows):
                            for t in T.unroll(toks):
                                if tb * block + tile * toks + t < m and rt * rows + r < n:
                                    linear_out(
                                        _tree_sum([acc[(r * toks + t) * LANES + lane] for lane in range(LANES)]),
                                        resf,
                                        outf,
                                        (tb * block + tile * toks + t) * n + rt * rows + r,
                                        rt * rows + r,
                                        b,
                                        gelu,
                                    )

    return f32_matmul_func(k, residual, body, bias)


# --------------------------------------------------------------------------- an encoder's attention


def encoder_attention(heads: int, head_dim: int, max_tokens: int) -> tirx.PrimFunc:
    """``out[b, i, :]``: bidirectional attention of a padded batch straight from the QKV linear's output
    ``qkv[b, n, 3 * heads * head_dim]`` (queries, keys, values side by side, each head's ``head_dim``
    together, as BERT's) with ``bias[b, 1, 1, n]`` added to every query's scores (0 on tokens, far below
    on padding). One (text, head, query) per iteration, in parallel: scores vectorized along
    ``head_dim``, softmax, then the values' weighted sum, in place of relax's transposes, batched matmuls
    and softmax (which the CPU schedule leaves as scalar loops: 60% of an encoder's time in wasm)."""
    h = heads * head_dim
    chunks = head_dim // LANES
    scale = head_dim**-0.5
    assert head_dim % LANES == 0, "head_dim must be a multiple of 4"

    # iteration ``row`` of ``n`` tokens a text: its text, query, and its head's first dimension
    def text(row, n):
        return row // (heads * n)

    def query(row, n):
        return row % n

    def head(row, n):
        return (row // n) % heads * head_dim

    @T.prim_func(s_tir=True)
    def attention(var_qkv: T.handle, var_bias: T.handle, var_out: T.handle):
        T.func_attr(SCHEDULED)
        b = T.int32()
        n = T.int32()
        qkv = T.match_buffer(var_qkv, (b, n, 3 * h), "float32")
        bias = T.match_buffer(var_bias, (b, 1, 1, n), "float32")
        out = T.match_buffer(var_out, (b, n, h), "float32")
        for row in T.parallel(b * heads * n):
            with T.sblock("attention"):
                score = T.sblock_alloc_buffer((max_tokens,), "float32", scope="local")
                acc = T.sblock_alloc_buffer((LANES,), "float32", scope="local")
                ctx = T.sblock_alloc_buffer((head_dim,), "float32", scope="local")
                top = T.sblock_alloc_buffer((2,), "float32", scope="local")  # the largest score, then the sum
                top[0] = T.float32(-3.0e38)
                for j in T.serial(n):
                    for lane in T.vectorized(LANES):
                        acc[lane] = T.float32(0)
                    for c in T.serial(chunks):
                        for lane in T.vectorized(LANES):
                            acc[lane] = (
                                acc[lane]
                                + qkv[text(row, n), query(row, n), head(row, n) + c * LANES + lane]
                                * qkv[text(row, n), j, h + head(row, n) + c * LANES + lane]
                            )
                    score[j] = _tree_sum([acc[lane] for lane in range(LANES)]) * T.float32(scale) + bias[text(row, n), 0, 0, j]
                    top[0] = T.max(top[0], score[j])
                top[1] = T.float32(0)
                for j in T.serial(n):
                    score[j] = T.exp(score[j] - top[0])
                    top[1] = top[1] + score[j]
                for d in T.vectorized(head_dim):
                    ctx[d] = T.float32(0)
                for j in T.serial(n):
                    for d in T.vectorized(head_dim):
                        ctx[d] = ctx[d] + score[j] * qkv[text(row, n), j, 2 * h + head(row, n) + d]
                for d in T.vectorized(head_dim):
                    out[text(row, n), query(row, n), head(row, n) + d] = ctx[d] / top[1]

    return attention
