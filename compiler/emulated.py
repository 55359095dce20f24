"""WebGPU kernels for software adapters: the ``cpu-emulated`` schedule.

A software adapter (SwiftShader in Chrome, WARP, lavapipe) runs a compute shader on CPU
threads. How SwiftShader does it (read from its source, measured here with plain WGSL):

* Four invocations run as one SIMD group; a workgroup is a loop over its SIMD groups and
  workgroups are spread over the CPU cores. Chrome's JIT (Subzero) does local CSE only: no
  loop-invariant code motion, no vectorization beyond the four lanes.
* A load whose index is a compile-time constant is one scalar load broadcast to the lanes.
  Any other index (a loop counter, a thread index, even a value equal in every lane) is a
  *gather*: one branchy scalar load per lane and per component, ~10x the cost of the
  arithmetic it feeds. Workgroup (shared) memory is always gathered, and a barrier turns
  the workgroup into coroutines.

The kernels here follow from that: no shared memory and no barriers; the decode GEMV's
reduction is unrolled so the activations sit at constant indices; every gathered value
(a packed weight word, a prefill activation, a key) is reused by as much arithmetic as the
registers allow. ``rewrite`` swaps them in for the model's own kernels.

Numerics: the q4 kernels sum each group of 32 products before applying the group's scale
(``scale * sum(q * x)`` instead of ``sum(q * scale * x)``), the same value up to rounding.
"""

from __future__ import annotations

import math
from typing import Any

import tvm
from tvm import relax, tirx
from tvm.script import tirx as T

from . import cpu_schedule
from .errors import LanternError
from .kernels import GROUP, SCHEDULED, f32_matmul_func, linear_out, loops, nibble as _nibble, q4_gemv_func, q4_matmul_func

LOG2E = math.log2(math.e)
PAGE = 16  # KV-cache page size used by the runtimes

GEMV_THREADS = 32  # rows per workgroup: several workgroups even for 576 rows
GEMV_CHUNK = 768  # inputs per launch of the GEMV (see q4_gemv)
MAX_CHUNKS = 4
MATMUL_THREADS = 32
MATMUL_ROWS = 4  # output rows per thread: each activation gather feeds 4 rows
MATMUL_TOKENS = 4  # tokens per thread: each weight word (or float32 weight) feeds 4 tokens
ATTN_THREADS = 8


# --------------------------------------------------------------------------- q4 linear layers


def q4_gemv(k: int, residual: bool, gpu: bool = True) -> tirx.PrimFunc:
    """``out[0, 0, :] = W @ x[0, 0, :] (+ residual)`` for one token; one thread per output row.
    The row count is a parameter: every matrix with ``k`` inputs shares the kernel.

    The reduction over ``k`` is fully unrolled, so every read of ``x`` has a constant index;
    the only gathers are the row's packed words (one vec4 per group of 32) and its scales.
    Past GEMV_CHUNK inputs the unrolled code outgrows the CPU's instruction cache, so longer
    rows are summed in chunks, one kernel launch each, every launch adding to ``out``.
    """
    groups = k // GROUP
    chunk = max(GEMV_CHUNK // GROUP, (groups + MAX_CHUNKS - 1) // MAX_CHUNKS)
    chunks = (groups + chunk - 1) // chunk
    block, thread = loops(gpu)

    @T.macro
    def launch(x, qw, qs, res, out, n, c):  # one kernel: groups c*chunk .. (c+1)*chunk of every row
        for bx in block((n + GEMV_THREADS - 1) // GEMV_THREADS):
            for tx in thread(GEMV_THREADS):
                with T.sblock("gemv"):
                    acc = T.sblock_alloc_buffer((1,), "float32", scope="local")
                    part = T.sblock_alloc_buffer((1,), "float32", scope="local")
                    word = T.sblock_alloc_buffer((4,), "uint32", scope="local")
                    if bx * GEMV_THREADS + tx < n:
                        if c > 0:
                            acc[0] = out[0, 0, bx * GEMV_THREADS + tx]
                        elif res is None:
                            acc[0] = T.float32(0)
                        else:
                            acc[0] = res[0, 0, bx * GEMV_THREADS + tx]
                        for gc in T.unroll(min(chunk, groups - c * chunk)):
                            for v in T.vectorized(4):
                                word[v] = qw[bx * GEMV_THREADS + tx, (c * chunk + gc) * 4 + v]
                            part[0] = T.float32(0)
                            for j in T.unroll(GROUP):
                                part[0] = part[0] + (x[0, 0, (c * chunk + gc) * GROUP + j] * _nibble(word[j // 8], j % 8))
                            acc[0] = acc[0] + part[0] * qs[bx * GEMV_THREADS + tx, c * chunk + gc]
                        out[0, 0, bx * GEMV_THREADS + tx] = acc[0]

    @T.macro
    def body(x, qw, qs, res, out, n):  # TVMScript has no Python loops: up to MAX_CHUNKS launches
        launch(x, qw, qs, res, out, n, 0)
        if chunks > 1:
            launch(x, qw, qs, res, out, n, 1)
        if chunks > 2:
            launch(x, qw, qs, res, out, n, 2)
        if chunks > 3:
            launch(x, qw, qs, res, out, n, 3)

    return q4_gemv_func(k, residual, body)


def q4_matmul(k: int, residual: bool, gpu: bool = True) -> tirx.PrimFunc:
    """``out[b, s, :] = W @ x[b, s, :] (+ residual)`` for any number of tokens (and of rows).

    Each thread owns a tile of MATMUL_ROWS rows x MATMUL_TOKENS tokens. Per group of 32
    inputs it gathers the tile's activations once and each row's four packed words once,
    dequantizes every weight once and uses it for every token of the tile. Row and token
    indices past the end are clamped (the loads stay in bounds; those results are dropped).
    """
    groups = k // GROUP
    rows, toks = MATMUL_ROWS, MATMUL_TOKENS
    block, thread = loops(gpu)
    # Token blocks on the grid's second axis: a flat grid would need a division by the
    # (symbolic) number of row blocks, which SwiftShader pays for at every use.
    token_blocks = (lambda n: T.thread_binding(n, thread="blockIdx.y")) if gpu else T.serial

    @T.macro
    def body(xf, qw, qs, resf, outf, m, n):
        for by in token_blocks((m + toks - 1) // toks):
            for bx in block((n + rows * MATMUL_THREADS - 1) // (rows * MATMUL_THREADS)):
                for tx in thread(MATMUL_THREADS):
                    with T.sblock("matmul"):
                        acc = T.sblock_alloc_buffer((rows * toks,), "float32", scope="local")
                        part = T.sblock_alloc_buffer((toks,), "float32", scope="local")
                        xs = T.sblock_alloc_buffer((toks * GROUP,), "float32", scope="local")
                        word = T.sblock_alloc_buffer((4,), "uint32", scope="local")
                        row0: T.let[T.int32] = (bx * MATMUL_THREADS + tx) * rows
                        tok0: T.let[T.int32] = by * toks
                        if row0 < n:
                            for i in T.unroll(rows * toks):
                                acc[i] = T.float32(0)
                            for g in T.serial(groups):
                                for t in T.unroll(toks):
                                    for j in T.unroll(GROUP):
                                        xs[t * GROUP + j] = xf[T.min(tok0 + t, m - 1) * k + g * GROUP + j]
                                for r in T.unroll(rows):
                                    for v in T.vectorized(4):
                                        word[v] = qw[T.min(row0 + r, n - 1), g * 4 + v]
                                    for t in T.unroll(toks):
                                        part[t] = T.float32(0)
                                    for j in T.unroll(GROUP):
                                        for t in T.unroll(toks):
                                            part[t] = part[t] + xs[t * GROUP + j] * _nibble(word[j // 8], j % 8)
                                    for t in T.unroll(toks):
                                        acc[r * toks + t] = acc[r * toks + t] + part[t] * qs[T.min(row0 + r, n - 1), g]
                            for r in T.unroll(rows):
                                for t in T.unroll(toks):
                                    if row0 + r < n and tok0 + t < m:
                                        if resf is None:
                                            outf[(tok0 + t) * n + row0 + r] = acc[r * toks + t]
                                        else:
                                            outf[(tok0 + t) * n + row0 + r] = resf[(tok0 + t) * n + row0 + r] + acc[r * toks + t]

    return q4_matmul_func(k, residual, body)


def f32_matmul(k: int, residual: bool, bias: bool = False, gelu: bool = False, gpu: bool = True) -> tirx.PrimFunc:
    """``out[b, s, :] = W @ x[b, s, :] (+ residual)`` for a float32 ``W[n, k]`` (q0f32), any number of
    tokens; an encoder's linears add their ``bias`` and then apply ``gelu`` or add the residual.

    q4_matmul's tiling without the dequantization: each thread owns MATMUL_ROWS rows x MATMUL_TOKENS
    tokens and walks ``k`` four inputs at a time, gathering the tile's activations and weights once
    per step; every gathered value feeds MATMUL_TOKENS (or MATMUL_ROWS) multiply-adds, where one thread
    per output (dlight's rule) gathers two values for each one. The output goes through linear_out.
    """
    rows, toks = MATMUL_ROWS, MATMUL_TOKENS
    block, thread = loops(gpu)
    token_blocks = (lambda n: T.thread_binding(n, thread="blockIdx.y")) if gpu else T.serial

    @T.macro
    def body(xf, w, resf, outf, m, n, b=None):
        for by in token_blocks((m + toks - 1) // toks):
            for bx in block((n + rows * MATMUL_THREADS - 1) // (rows * MATMUL_THREADS)):
                for tx in thread(MATMUL_THREADS):
                    with T.sblock("matmul"):
                        acc = T.sblock_alloc_buffer((rows * toks,), "float32", scope="local")
                        xs = T.sblock_alloc_buffer((toks * 4,), "float32", scope="local")
                        ws = T.sblock_alloc_buffer((rows * 4,), "float32", scope="local")
                        row0: T.let[T.int32] = (bx * MATMUL_THREADS + tx) * rows
                        tok0: T.let[T.int32] = by * toks
                        if row0 < n:
                            for i in T.unroll(rows * toks):
                                acc[i] = T.float32(0)
                            for c in T.serial(k // 4):
                                for t in T.unroll(toks):
                                    for v in T.vectorized(4):
                                        xs[t * 4 + v] = xf[T.min(tok0 + t, m - 1) * k + c * 4 + v]
                                for r in T.unroll(rows):
                                    for v in T.vectorized(4):
                                        ws[r * 4 + v] = w[T.min(row0 + r, n - 1), c * 4 + v]
                                for r in T.unroll(rows):
                                    for t in T.unroll(toks):
                                        for v in T.unroll(4):
                                            acc[r * toks + t] = acc[r * toks + t] + ws[r * 4 + v] * xs[t * 4 + v]
                            for r in T.unroll(rows):
                                for t in T.unroll(toks):
                                    if row0 + r < n and tok0 + t < m:
                                        linear_out(acc[r * toks + t], resf, outf, (tok0 + t) * n + row0 + r, row0 + r, b, gelu)

    return f32_matmul_func(k, residual, body, bias)


# --------------------------------------------------------------------------- attention
#
# Replacements for the paged KV cache's TIR attention kernels, with the same signatures
# (the runtime calls them; see tvm/relax/frontend/nn/llm). One thread per (token, query
# head) walks that sequence's keys with an online softmax, like TVM's CPU kernels: each key
# and value row is gathered once and feeds d multiply-adds, and nothing is shared between
# threads. RoPE is applied by the cache before these run (rotary_mode is 0 unless the cache
# uses sliding windows, whose kernels are not replaced).


@T.macro
def _attend(q, o, st, keys, k_base, values, v_base, d, cap):
    """One key/value row into the running state: st = [max, denominator, score, rescale]. ``cap``
    (in the scores' log2 units; 0 for none) soft-caps the score: cap * tanh(score / cap)."""
    st[2] = T.float32(0)
    for i in T.unroll(d):
        st[2] = st[2] + q[i] * keys[k_base + i]
    if cap > 0:
        st[2] = T.float32(cap) * T.tanh(st[2] / T.float32(cap))
    st[3] = T.exp2(st[0] - T.max(st[0], st[2]))
    st[0] = T.max(st[0], st[2])
    st[2] = T.exp2(st[2] - st[0])
    st[1] = st[1] * st[3] + st[2]
    for i in T.unroll(d):
        o[i] = o[i] * st[3] + st[2] * values[v_base + i]


@T.macro
def _start(q, o, st, query, row, head, sm_scale, d):
    for i in T.unroll(d):
        q[i] = query[row, head, i] * (T.fabs(sm_scale) * LOG2E)
        o[i] = T.float32(0)
    st[0] = T.float32(-5e4)  # TVM's kernels start from the same state
    st[1] = T.float32(1)


@T.macro
def _finish(o, st, output, lse, row, head, d):
    for i in T.unroll(d):
        output[row, head, i] = o[i] / st[1]
    lse[row, head] = st[0] + T.log2(st[1])


def _first_key(window, sm_scale, q_pos, k_pos_offset):
    """The first key column a query at ``q_pos`` attends to: 0, or on a windowed layer (the model
    marks one with a negative ``sm_scale``) the first within ``window`` positions of it, keys being at
    positions ``k_pos_offset + col``. ``window`` is the build's constant (0: no layer has one)."""
    if window == 0:
        return 0
    return T.if_then_else(sm_scale < T.float32(0), T.max(q_pos - k_pos_offset - (window - 1), 0), 0)


def _paged_len(indptr, length_info, b):
    """Tokens of sequence ``b`` in the cache: full pages plus the last page's fill."""
    return T.if_then_else(indptr[b] != indptr[b + 1], (indptr[b + 1] - indptr[b] - 1) * PAGE + length_info[b], 0)


def decode_attention(h_kv: int, h_q: int, d: int, gpu: bool = True, softcap: float = 0.0, window: int = 0) -> tirx.PrimFunc:
    """One token per sequence against its pages. One thread per (sequence, KV head) serves all the
    query heads that share it: each key and value row is gathered once for the whole group."""
    cap = softcap * LOG2E  # scores are kept in log2 units (q is scaled by sm_scale * LOG2E)
    group = h_q // h_kv
    block, thread = loops(gpu)

    @T.prim_func(s_tir=True)
    def batch_decode_paged_kv(
        Q_handle: T.handle,
        pages_handle: T.handle,
        page_table_indptr_handle: T.handle,
        page_table_values_handle: T.handle,
        var_length_info: T.handle,
        k_rope_pos_offset_handle: T.handle,
        q_rope_position_handle: T.handle,
        output_handle: T.handle,
        lse_handle: T.handle,
        rotary_mode: T.int32,
        rope_scale: T.float32,
        rope_theta: T.float32,
        sm_scale: T.float32,
    ):
        T.func_attr({"tirx.is_scheduled": True, "global_symbol": "batch_decode_paged_kv"})
        B = T.int32()
        nnz_pages = T.int32()
        max_num_pages = T.int32()
        pages_elem_offset = T.int64()
        page_indptr_elem_offset = T.int32()
        page_values_elem_offset = T.int32()
        k_rope_pos_offset_elem_offset = T.int32()
        q_rope_position_elem_offset = T.int32()
        length_info_elem_offset = T.int32()
        Q = T.match_buffer(Q_handle, (B, h_q, d), "float32")
        pages = T.match_buffer(pages_handle, (max_num_pages, 2, h_kv, PAGE, d), "float32", elem_offset=pages_elem_offset)
        page_table_indptr = T.match_buffer(page_table_indptr_handle, (B + 1,), "int32", elem_offset=page_indptr_elem_offset)
        page_table_values = T.match_buffer(page_table_values_handle, (nnz_pages,), "int32", elem_offset=page_values_elem_offset)
        k_rope_pos_offset = T.match_buffer(k_rope_pos_offset_handle, (B,), "int32", elem_offset=k_rope_pos_offset_elem_offset)
        q_rope_position = T.match_buffer(q_rope_position_handle, (B,), "int32", elem_offset=q_rope_position_elem_offset)
        output = T.match_buffer(output_handle, (B, h_q, d), "float32")
        lse = T.match_buffer(lse_handle, (B, h_q), "float32")
        length_info = T.match_buffer(var_length_info, (B,), "int32", elem_offset=length_info_elem_offset)
        kv = T.decl_buffer((max_num_pages * 2 * h_kv * PAGE * d,), "float32", data=pages.data, elem_offset=pages_elem_offset)
        for bx in block((B * h_kv + ATTN_THREADS - 1) // ATTN_THREADS):
            for tx in thread(ATTN_THREADS):
                with T.sblock("attn"):
                    q = T.sblock_alloc_buffer((group * d,), "float32", scope="local")
                    o = T.sblock_alloc_buffer((group * d,), "float32", scope="local")
                    st = T.sblock_alloc_buffer((group * 4,), "float32", scope="local")
                    key = T.sblock_alloc_buffer((d,), "float32", scope="local")
                    if bx * ATTN_THREADS + tx < B * h_kv:
                        b: T.let[T.int32] = (bx * ATTN_THREADS + tx) // h_kv
                        hk: T.let[T.int32] = (bx * ATTN_THREADS + tx) % h_kv
                        for g in T.unroll(group):  # before and after the key loop, loops stay loops
                            for i in T.serial(d):
                                q[g * d + i] = Q[b, hk * group + g, i] * (T.fabs(sm_scale) * LOG2E)
                                o[g * d + i] = T.float32(0)
                            st[g * 4] = T.float32(-5e4)
                            st[g * 4 + 1] = T.float32(1)
                        for col in T.serial(
                            _first_key(window, sm_scale, q_rope_position[b], k_rope_pos_offset[b]),
                            _paged_len(page_table_indptr, length_info, b),
                        ):
                            page: T.let[T.int32] = page_table_values[page_table_indptr[b] + col // PAGE]
                            k_base: T.let[T.int32] = (((page * 2) * h_kv + hk) * PAGE + col % PAGE) * d
                            for i in T.unroll(d):
                                key[i] = kv[k_base + i]
                            for g in T.unroll(group):
                                st[g * 4 + 2] = T.float32(0)
                                for i in T.unroll(d):
                                    st[g * 4 + 2] = st[g * 4 + 2] + q[g * d + i] * key[i]
                                if cap > 0:
                                    st[g * 4 + 2] = T.float32(cap) * T.tanh(st[g * 4 + 2] / T.float32(cap))
                                st[g * 4 + 3] = T.exp2(st[g * 4] - T.max(st[g * 4], st[g * 4 + 2]))
                                st[g * 4] = T.max(st[g * 4], st[g * 4 + 2])
                                st[g * 4 + 2] = T.exp2(st[g * 4 + 2] - st[g * 4])
                                st[g * 4 + 1] = st[g * 4 + 1] * st[g * 4 + 3] + st[g * 4 + 2]
                            for i in T.unroll(d):
                                key[i] = kv[k_base + h_kv * PAGE * d + i]  # now the value row
                                for g in T.unroll(group):
                                    o[g * d + i] = o[g * d + i] * st[g * 4 + 3] + st[g * 4 + 2] * key[i]
                        for g in T.unroll(group):
                            for i in T.serial(d):
                                output[b, hk * group + g, i] = o[g * d + i] / st[g * 4 + 1]
                            lse[b, hk * group + g] = st[g * 4] + T.log2(st[g * 4 + 1])

    return batch_decode_paged_kv


@T.macro
def _sequence_of(b_sel, indptr, batch_size, t):
    """The sequence whose rows ``indptr[b] <= t < indptr[b + 1]`` hold token ``t``."""
    b_sel[0] = 0
    for b in T.serial(batch_size):
        if indptr[b] <= t and t < indptr[b + 1]:
            b_sel[0] = b


def prefill_attention(h_kv: int, h_q: int, d: int, gpu: bool = True, softcap: float = 0.0, window: int = 0) -> tirx.PrimFunc:
    """New tokens against the pages already in the cache (then merged with the ragged part)."""
    cap = softcap * LOG2E  # scores are kept in log2 units (q is scaled by sm_scale * LOG2E)
    group = h_q // h_kv
    block, thread = loops(gpu)

    @T.prim_func(s_tir=True)
    def batch_prefill_paged_kv(
        var_q: T.handle,
        var_q_indptr: T.handle,
        var_pages: T.handle,
        var_page_indptr: T.handle,
        var_page_values: T.handle,
        var_length_info: T.handle,
        var_k_rope_pos_offset: T.handle,
        var_q_rope_position: T.handle,
        var_output: T.handle,
        var_lse: T.handle,
        causal: T.int32,
        rotary_mode: T.int32,
        rope_scale: T.float32,
        rope_theta: T.float32,
        sm_scale: T.float32,
    ):
        T.func_attr({"tirx.is_scheduled": True, "global_symbol": "batch_prefill_paged_kv"})
        batch_size = T.int32()
        total_len = T.int32()
        nnz_pages = T.int32()
        max_num_pages = T.int32()
        pages_elem_offset = T.int64()
        q_indptr_elem_offset = T.int32()
        page_indptr_elem_offset = T.int32()
        page_values_elem_offset = T.int32()
        k_rope_pos_offset_elem_offset = T.int32()
        q_rope_position_elem_offset = T.int32()
        length_info_elem_offset = T.int32()
        q = T.match_buffer(var_q, (total_len, h_q, d), "float32")
        q_indptr = T.match_buffer(var_q_indptr, (batch_size + 1,), "int32", elem_offset=q_indptr_elem_offset)
        pages = T.match_buffer(var_pages, (max_num_pages, 2, h_kv, PAGE, d), "float32", elem_offset=pages_elem_offset)
        page_indptr = T.match_buffer(var_page_indptr, (batch_size + 1,), "int32", elem_offset=page_indptr_elem_offset)
        page_values = T.match_buffer(var_page_values, (nnz_pages,), "int32", elem_offset=page_values_elem_offset)
        k_rope_pos_offset = T.match_buffer(
            var_k_rope_pos_offset, (batch_size,), "int32", elem_offset=k_rope_pos_offset_elem_offset
        )
        q_rope_position = T.match_buffer(var_q_rope_position, (total_len,), "int32", elem_offset=q_rope_position_elem_offset)
        output = T.match_buffer(var_output, (total_len, h_q, d), "float32")
        lse = T.match_buffer(var_lse, (total_len, h_q), "float32")
        length_info = T.match_buffer(var_length_info, (batch_size,), "int32", elem_offset=length_info_elem_offset)
        kv = T.decl_buffer((max_num_pages * 2 * h_kv * PAGE * d,), "float32", data=pages.data, elem_offset=pages_elem_offset)
        for bx in block((total_len * h_q + ATTN_THREADS - 1) // ATTN_THREADS):
            for tx in thread(ATTN_THREADS):
                with T.sblock("attn"):
                    qv = T.sblock_alloc_buffer((d,), "float32", scope="local")
                    o = T.sblock_alloc_buffer((d,), "float32", scope="local")
                    st = T.sblock_alloc_buffer((4,), "float32", scope="local")
                    b_sel = T.sblock_alloc_buffer((1,), "int32", scope="local")
                    if bx * ATTN_THREADS + tx < total_len * h_q:
                        t: T.let[T.int32] = (bx * ATTN_THREADS + tx) // h_q
                        h: T.let[T.int32] = (bx * ATTN_THREADS + tx) % h_q
                        _sequence_of(b_sel, q_indptr, batch_size, t)
                        kv_len: T.let[T.int32] = _paged_len(page_indptr, length_info, b_sel[0])
                        qo_len: T.let[T.int32] = q_indptr[b_sel[0] + 1] - q_indptr[b_sel[0]]
                        _start(qv, o, st, q, t, h, sm_scale, d)
                        for col in T.serial(
                            _first_key(window, sm_scale, q_rope_position[t], k_rope_pos_offset[b_sel[0]]),
                            T.if_then_else(causal > 0, T.min(kv_len, kv_len - qo_len + (t - q_indptr[b_sel[0]]) + 1), kv_len),
                        ):
                            page: T.let[T.int32] = page_values[page_indptr[b_sel[0]] + col // PAGE]
                            k_base: T.let[T.int32] = (((page * 2) * h_kv + h // group) * PAGE + col % PAGE) * d
                            _attend(qv, o, st, kv, k_base, kv, k_base + h_kv * PAGE * d, d, cap)
                        _finish(o, st, output, lse, t, h, d)

    return batch_prefill_paged_kv


def ragged_attention(h_kv: int, h_q: int, d: int, gpu: bool = True, softcap: float = 0.0, window: int = 0) -> tirx.PrimFunc:
    """New tokens against themselves (causal), from the freshly projected k and v."""
    cap = softcap * LOG2E  # scores are kept in log2 units (q is scaled by sm_scale * LOG2E)
    group = h_q // h_kv
    block, thread = loops(gpu)

    @T.prim_func(s_tir=True)
    def batch_prefill_ragged_kv(
        var_q: T.handle,
        var_q_indptr: T.handle,
        var_k: T.handle,
        var_v: T.handle,
        var_kv_indptr: T.handle,
        var_q_rope_position: T.handle,
        var_k_rope_pos_offset: T.handle,
        var_output: T.handle,
        var_lse: T.handle,
        causal: T.int32,
        rotary_mode: T.int32,
        rope_scale: T.float32,
        rope_theta: T.float32,
        sm_scale: T.float32,
    ):
        T.func_attr({"tirx.is_scheduled": True, "global_symbol": "batch_prefill_ragged_kv"})
        batch_size = T.int32()
        qo_total = T.int32()
        kv_total = T.int32()
        q_indptr_elem_offset = T.int32()
        kv_indptr_elem_offset = T.int32()
        q_rope_position_elem_offset = T.int32()
        k_rope_pos_offset_elem_offset = T.int32()
        q = T.match_buffer(var_q, (qo_total, h_q, d), "float32")
        q_indptr = T.match_buffer(var_q_indptr, (batch_size + 1,), "int32", elem_offset=q_indptr_elem_offset)
        k = T.match_buffer(var_k, (kv_total, h_kv, d), "float32")
        v = T.match_buffer(var_v, (kv_total, h_kv, d), "float32")
        kv_indptr = T.match_buffer(var_kv_indptr, (batch_size + 1,), "int32", elem_offset=kv_indptr_elem_offset)
        q_rope_position = T.match_buffer(var_q_rope_position, (qo_total,), "int32", elem_offset=q_rope_position_elem_offset)
        k_rope_pos_offset = T.match_buffer(
            var_k_rope_pos_offset, (batch_size,), "int32", elem_offset=k_rope_pos_offset_elem_offset
        )
        output = T.match_buffer(var_output, (qo_total, h_q, d), "float32")
        lse = T.match_buffer(var_lse, (qo_total, h_q), "float32")
        kf = T.decl_buffer((kv_total * h_kv * d,), "float32", data=k.data)
        vf = T.decl_buffer((kv_total * h_kv * d,), "float32", data=v.data)
        for bx in block((qo_total * h_q + ATTN_THREADS - 1) // ATTN_THREADS):
            for tx in thread(ATTN_THREADS):
                with T.sblock("attn"):
                    qv = T.sblock_alloc_buffer((d,), "float32", scope="local")
                    o = T.sblock_alloc_buffer((d,), "float32", scope="local")
                    st = T.sblock_alloc_buffer((4,), "float32", scope="local")
                    b_sel = T.sblock_alloc_buffer((1,), "int32", scope="local")
                    if bx * ATTN_THREADS + tx < qo_total * h_q:
                        t: T.let[T.int32] = (bx * ATTN_THREADS + tx) // h_q
                        h: T.let[T.int32] = (bx * ATTN_THREADS + tx) % h_q
                        _sequence_of(b_sel, q_indptr, batch_size, t)
                        kv_len: T.let[T.int32] = kv_indptr[b_sel[0] + 1] - kv_indptr[b_sel[0]]
                        qo_len: T.let[T.int32] = q_indptr[b_sel[0] + 1] - q_indptr[b_sel[0]]
                        _start(qv, o, st, q, t, h, sm_scale, d)
                        for col in T.serial(
                            _first_key(window, sm_scale, q_rope_position[t], k_rope_pos_offset[b_sel[0]]),
                            T.if_then_else(causal > 0, T.min(kv_len, kv_len - qo_len + (t - q_indptr[b_sel[0]]) + 1), kv_len),
                        ):
                            row: T.let[T.int32] = ((kv_indptr[b_sel[0]] + col) * h_kv + h // group) * d
                            _attend(qv, o, st, kf, row, vf, row, d, cap)
                        _finish(o, st, output, lse, t, h, d)

    return batch_prefill_ragged_kv


# --------------------------------------------------------------------------- the rewrite

ATTENTION = {
    "batch_decode_paged_kv": decode_attention,
    "batch_prefill_paged_kv": prefill_attention,
    "batch_prefill_ragged_kv": ragged_attention,
}


def _ints(shape) -> list[int] | None:
    return [int(d) for d in shape] if all(isinstance(d, tirx.IntImm) for d in shape) else None


def _blocks(func: tirx.PrimFunc) -> dict[str, Any]:
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    return {b.name_hint: b for b in (sch.get(rv) for rv in sch.get_child_blocks(sch.get_sblock("root")))}


def _q4_linear(func: tirx.PrimFunc, gpu: bool = True) -> tuple | None:
    """(key, kernel) for a ``dequantize -> matmul [-> add]`` function of quantize.py's q4 layer."""
    try:
        blocks = _blocks(func)
    except tvm.TVMError:
        return None
    if not {"dequantize", "matmul"} <= blocks.keys() <= {"dequantize", "matmul", "T_add"}:
        return None
    params = list(func.params)
    x = next((r.source for r in blocks["matmul"].reads if any(r.source.same_as(p) for p in params)), None)
    weights = [r.source for r in blocks["dequantize"].reads]
    if x is None or len(weights) != 2 or params[:3] != [x, *weights] or len(x.shape) != 3:
        return None
    qw, qs = weights
    qw_shape, qs_shape, k = _ints(qw.shape), _ints(qs.shape), x.shape[-1]
    if (
        qw.dtype != "uint32"
        or x.dtype != "float32"
        or qs.dtype != "float32"
        or not qw_shape
        or not qs_shape
        or not isinstance(k, tirx.IntImm)
        or qw_shape[1] * 8 != int(k)
        or qs_shape[1] * GROUP != int(k)
    ):
        return None
    residual = "T_add" in blocks
    if len(params) != (5 if residual else 4):
        return None
    if residual and (
        not any(r.source.same_as(params[3]) for r in blocks["T_add"].reads) or len(params[3].shape) != 3
    ):  # a bias row is not a residual: dlight schedules that one
        return None
    decode = _ints(x.shape[:2]) == [1, 1]
    key = ("q4_gemv" if decode else "q4_matmul", f"k{int(k)}", "res" if residual else "plain")
    if not gpu:  # the CPU library's own kernels (cpu_schedule.py)
        build = cpu_schedule.q4_gemv if decode else cpu_schedule.q4_matmul
        return key, lambda _: build(int(k), residual)
    build = q4_gemv if decode else q4_matmul
    return key, lambda gpu: build(int(k), residual, gpu)


# The blocks of an encoder's linear with its epilogue fused in (models/bert): the bias, then exact GELU
# (0.5 * v * (1 + erf(v / sqrt 2)): T_multiply, compute (erf), T_multiply_1, T_add1, T_multiply_2), or
# the residual add (T_add1)
_BIAS_GELU = {"matmul", "T_add", "T_multiply", "compute", "T_multiply_1", "T_add1", "T_multiply_2"}
_BIAS_RESIDUAL = {"matmul", "T_add", "T_add1"}


def _f32_linear(func: tirx.PrimFunc, gpu: bool = False) -> tuple | None:
    """(key, kernel) for quantize.py's plain float32 ``linear`` (q0f32): alone, plus a residual (a
    decoder's), or plus a bias and then GELU or a residual (an encoder's). The CPU library gets
    cpu_schedule.py's kernels; a WebGPU library gets f32_matmul for many tokens (dlight keeps the GEMV)."""
    try:
        blocks = _blocks(func)
    except tvm.TVMError:
        return None
    params = list(func.params)
    if len(params) < 3:
        return None
    x, w = params[0], params[1]
    reads = [r.source for r in blocks["matmul"].reads] if "matmul" in blocks else []
    if (
        len(reads) != 2
        or not reads[0].same_as(x)
        or not reads[1].same_as(w)
        or len(x.shape) != 3
        or len(w.shape) != 2
        or x.dtype != "float32"
        or w.dtype != "float32"
    ):
        return None
    k = x.shape[-1]
    if not isinstance(k, tirx.IntImm) or not isinstance(w.shape[1], tirx.IntImm) or int(w.shape[1]) != int(k):
        return None
    names = set(blocks)
    added = [r.source for r in blocks["T_add"].reads] if "T_add" in blocks else []
    bias = len(params) >= 4 and len(params[2].shape) == 1 and any(r.same_as(params[2]) for r in added)
    if bias:
        gelu = names == _BIAS_GELU and len(params) == 4 and "erf" in func.script()
        residual = names == _BIAS_RESIDUAL and len(params) == 5 and len(params[3].shape) == 3
        plain = names == {"matmul", "T_add"} and len(params) == 4
        if not (gelu or residual or plain) or int(k) % cpu_schedule.LANES:
            return None
        epilogue = "bias_gelu" if gelu else "bias_res" if residual else "bias"
        if gpu:
            return ("f32_matmul", f"k{int(k)}", epilogue), lambda g: f32_matmul(int(k), residual, bias=True, gelu=gelu, gpu=g)
        return ("f32_matmul", f"k{int(k)}", epilogue), lambda _: cpu_schedule.f32_matmul(int(k), residual, bias=True, gelu=gelu)
    if not {"matmul"} <= names <= {"matmul", "T_add"}:
        return None
    residual = "T_add" in names
    if len(params) != (4 if residual else 3):
        return None
    if residual and (not any(r.source.same_as(params[2]) for r in blocks["T_add"].reads) or len(params[2].shape) != 3):
        return None
    decode = _ints(x.shape[:2]) == [1, 1]
    if int(k) % (cpu_schedule.WIDE if decode else cpu_schedule.LANES) or (gpu and decode):
        return None
    if gpu:
        return ("f32_matmul", f"k{int(k)}", "res" if residual else "plain"), lambda g: f32_matmul(int(k), residual, gpu=g)
    build = cpu_schedule.f32_gemv if decode else cpu_schedule.f32_matmul
    return (build.__name__, f"k{int(k)}", "res" if residual else "plain"), lambda _: build(int(k), residual)


def _attention(name: str, func: tirx.PrimFunc, softcap: float = 0.0, window: int = 0) -> tuple | None:
    """(key, kernel) for one of the KV cache's attention functions (float32), by its GPU name or its
    CPU one (``..._cpu``: the same signature)."""
    name = name.removesuffix("_cpu")
    if name not in ATTENTION or (func.attrs is not None and VARIANT_ATTR in func.attrs):
        return None
    q, pages_or_k = func.params[0], func.params[2 if name != "batch_decode_paged_kv" else 1]
    if q.dtype != "float32":
        return None
    h_q, d = int(q.shape[1]), int(q.shape[2])
    h_kv = int(pages_or_k.shape[2] if name != "batch_prefill_ragged_kv" else pages_or_k.shape[1])
    return (name, h_kv, h_q, d), lambda gpu: ATTENTION[name](h_kv, h_q, d, gpu, softcap, window)


VARIANT_ATTR = "lantern.attention_variant"


def custom_attention(mod: tvm.IRModule, softcap: float, window: int, gpu: bool) -> tvm.IRModule:
    """Swap every paged-KV attention kernel the runtimes call (decode, prefill against the cache,
    prefill among the chunk's own tokens) for the kernels above, on any target and schedule, with
    what TVM 0.27's kernels lack:

    * ``softcap`` > 0: ``cap * tanh(score / cap)`` on each score (Gemma 2's attention-logit cap);
    * ``window`` > 0: a layer that passes a negative ``sm_scale`` (the one value the model hands the
      kernels per layer) sees only the keys less than ``window`` positions behind each query, over
      the plain full-length cache. TVM's own windowed layers are not usable on 0.27 (the note on
      issue 15 lists why); this costs a full cache's memory but is exact at every length.

    TVM's tree-attention and sliding-window kernels stay as they are: neither runtime calls them (no
    speculative decoding; the caches are made without TVM's windows). Every kernel must be found,
    or the build fails: TVM's would run a negative scale or an uncapped score silently."""
    what = " and ".join(w for w, on in (("attention soft-capping", softcap), ("sliding windows", window)) if on)
    swapped = set()
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, tirx.PrimFunc):
            continue
        if gv.name_hint.removesuffix("_cpu") in ATTENTION and func.params[0].dtype != "float32":
            raise LanternError(
                f"{what}: Lantern's attention kernels are float32 only, this build's are "
                f"{func.params[0].dtype}: build with q4f32_1 or q0f32"
            )
        attention = _attention(gv.name_hint, func, softcap, window)
        if attention is not None:
            kernel = attention[1](gpu).with_attr("global_symbol", gv.name_hint)
            mod[gv] = kernel.with_attr(VARIANT_ATTR, f"softcap={softcap:g},window={window}")
            swapped.add(attention[0][0])
    if swapped != set(ATTENTION):  # a TVM that names or shapes its kernels otherwise: never run TVM's
        raise LanternError(f"{what}: found only {sorted(swapped)} of the KV cache's kernels {sorted(ATTENTION)}")
    return mod


def rewrite(mod: tvm.IRModule, gpu: bool = True) -> tvm.IRModule:
    """Swap this module's kernels in for the functions they implement; others are untouched
    (dlight schedules them). Runs after fusion, before scheduling. For the CPU library
    (``gpu=False``), RMSNorm (dlight's CPU reduction rule spent ~0.4 ms on one 576-wide row), the
    float32 q4 linears and the plain float32 ones, which get cpu_schedule.py's kernels. For WebGPU,
    the plain float32 linears of many tokens get f32_matmul.

    Functions that get the same kernel (prefill's and batch_decode's matmul of one weight shape,
    the head's GEMV in prefill and decode) call one copy: every kernel is a pipeline the browser
    compiles at load, and SwiftShader takes about a second for each unrolled one.
    """
    builder = relax.BlockBuilder(mod)
    shared: dict[tuple, tvm.ir.GlobalVar] = {}
    alias: dict[str, tvm.ir.GlobalVar] = {}
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, tirx.PrimFunc):
            continue
        attention = _attention(gv.name_hint, func) if gpu else None
        if attention is not None:  # called by the KV cache under its own name
            builder.update_func(gv, attention[1](gpu).with_attr("global_symbol", gv.name_hint))
            continue
        match = _q4_linear(func, gpu) or _f32_linear(func, gpu) or _rms_norm(func)
        if match is None:
            continue
        key, build = match
        if key not in shared:  # a fresh function: the old ones' signatures had fixed row counts
            name = "_".join(key).replace(".", "p").replace("-", "m")
            shared[key] = builder.add_func(build(gpu).with_attr("global_symbol", name), name)
        alias[gv.name_hint] = shared[key]
    mod = builder.get()
    return _redirect(mod, alias) if alias else mod


@relax.expr_functor.mutator
class _Redirect(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, alias: dict[str, tvm.ir.GlobalVar]):
        super().__init__(mod)
        self.alias = alias

    def visit_global_var_(self, op: tvm.ir.GlobalVar):
        return self.alias.get(op.name_hint, op)


def _redirect(mod: tvm.IRModule, alias: dict[str, tvm.ir.GlobalVar]) -> tvm.IRModule:
    """Point every call of an aliased function at its twin, then drop the aliases."""
    redirect = _Redirect(mod, alias)
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gv] = redirect.visit_expr(func)
    for gv in [gv for gv in mod.get_global_vars() if gv.name_hint in alias]:
        del mod[gv]
    return mod


@tvm.transform.module_pass(opt_level=0, name="LanternEmulatedKernels")
def rewrite_pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    return rewrite(mod)


@tvm.transform.module_pass(opt_level=0, name="LanternCpuKernels")
def rewrite_cpu_pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    return rewrite(mod, gpu=False)


# --------------------------------------------------------------------------- RMSNorm

RMS_NORM_BLOCKS = {"T_cast", "T_multiply", "T_multiply_red", "rsqrt", "T_cast_1", "T_rms_norm", "T_cast_2"}


def rms_norm(h: int, eps: float, gpu: bool = True) -> tirx.PrimFunc:
    """``out = x * rsqrt(mean(x^2) + eps) * w`` over the last axis; one thread per row.

    Its loops stay loops: unrolled, 576 channels made a 180 KB shader that took SwiftShader 10 s
    to compile, for a kernel that is ~1% of a token's time either way.
    """
    block, thread = loops(gpu)

    @T.prim_func(s_tir=True)
    def rms_norm_rows(
        var_x: T.handle,
        w: T.Buffer((h,), "float32"),  # type: ignore[valid-type]  # TVMScript's T.Buffer(...)
        var_out: T.handle,
    ):
        T.func_attr(SCHEDULED)
        b = T.int32()
        s = T.int32()
        x = T.match_buffer(var_x, (b, s, h), "float32")
        out = T.match_buffer(var_out, (b, s, h), "float32")
        xf = T.decl_buffer((b * s * h,), "float32", data=x.data)
        outf = T.decl_buffer((b * s * h,), "float32", data=out.data)
        for bx in block((b * s + ATTN_THREADS - 1) // ATTN_THREADS):
            for tx in thread(ATTN_THREADS):
                with T.sblock("rms_norm"):
                    acc = T.sblock_alloc_buffer((1,), "float32", scope="local")
                    if bx * ATTN_THREADS + tx < b * s:
                        acc[0] = T.float32(0)
                        for i in T.serial(h):
                            acc[0] = acc[0] + (xf[(bx * ATTN_THREADS + tx) * h + i] * xf[(bx * ATTN_THREADS + tx) * h + i])
                        acc[0] = T.rsqrt(acc[0] / T.float32(h) + T.float32(eps))
                        for i in T.serial(h):
                            outf[(bx * ATTN_THREADS + tx) * h + i] = xf[(bx * ATTN_THREADS + tx) * h + i] * acc[0] * w[i]

    return rms_norm_rows


def _rms_norm(func: tirx.PrimFunc) -> tuple | None:
    """(key, kernel) for relax's legalized ``rms_norm`` over the last axis (float32)."""
    try:
        blocks = _blocks(func)
    except tvm.TVMError:
        return None
    if set(blocks) != RMS_NORM_BLOCKS or len(func.params) != 3:
        return None
    x, w, out = func.params
    h = x.shape[-1] if len(x.shape) == 3 else None
    if h is None or not isinstance(h, tirx.IntImm) or _ints(w.shape) != [int(h)] or {x.dtype, w.dtype, out.dtype} != {"float32"}:
        return None
    value = blocks["rsqrt"].body.value  # rsqrt(sum / h + eps)
    eps = getattr(getattr(value, "args", [None])[0], "b", None)
    if not isinstance(eps, tirx.FloatImm):
        return None
    return ("rms_norm", f"h{int(h)}", f"eps{eps.value:g}"), lambda gpu: rms_norm(int(h), eps.value, gpu)
