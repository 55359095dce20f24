"""Sampling and logit-processing functions compiled into every model library.

These are the six helpers WebLLM calls (``apply_bitmask_inplace``,
``apply_logit_bias_inplace``, ``apply_penalty_inplace``,
``softmax_with_temperature``, ``argsort_probs``, ``sample_with_top_p``), with
MLC's signatures and semantics. They are written here rather than taken from
TVM because TVM 0.27's WebGPU cumsum races and its argsort does not build for
WebGPU. Every kernel uses one thread per independent item and no shared
memory, so there is nothing to race on; the same TIR builds for the CPU
(serial loops) so the server samples exactly like the browser.

* softmax: per-chunk max / sum / count of maxima, merged per row, then one
  thread per element. ``temperature <= 1e-5`` is greedy: a one-hot over the
  maxima (ties split evenly).
* argsort: a bitonic sort in global memory over the row padded to a power of
  two, descending by probability, ties by ascending token id. One kernel
  launch per compare-exchange pass (136 passes for 49152 tokens).
* top-p: per-chunk sums of the sorted probabilities, then one thread per
  sample walks chunks and then elements: the nucleus ends at the first index
  whose running sum reaches ``top_p``; the token is the first index whose
  running sum exceeds ``u * nucleus_mass``.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.script import tirx as T

from .kernels import loops

CHUNK = 256  # elements per thread in the row reductions
THREADS = 256
GREEDY_TEMPERATURE = 1e-5


def _attrs(gpu: bool) -> dict:
    return {"tirx.is_scheduled": True, "tirx.noalias": True}


def logit_bias_kernel(gpu: bool, vocab: int):
    block, thread = loops(gpu)

    @T.prim_func(s_tir=True)
    def apply_logit_bias(var_logits: T.handle, var_pos2seq: T.handle, var_ids: T.handle, var_bias: T.handle):
        T.func_attr(_attrs(gpu))
        B = T.int32()
        N = T.int32()
        logits = T.match_buffer(var_logits, (B, vocab), "float32")
        pos2seq = T.match_buffer(var_pos2seq, (N,), "int32")
        ids = T.match_buffer(var_ids, (N,), "int32")
        bias = T.match_buffer(var_bias, (N,), "float32")
        for bx in block((N + THREADS - 1) // THREADS):
            for tx in thread(THREADS):
                with T.sblock("bias"):
                    if bx * THREADS + tx < N:
                        logits[pos2seq[bx * THREADS + tx], ids[bx * THREADS + tx]] = (
                            logits[pos2seq[bx * THREADS + tx], ids[bx * THREADS + tx]] + bias[bx * THREADS + tx]
                        )

    return apply_logit_bias


def penalty_kernel(gpu: bool, vocab: int):
    block, thread = loops(gpu)

    @T.prim_func(s_tir=True)
    def apply_penalty(
        var_logits: T.handle,
        var_seq_ids: T.handle,
        var_pos2seq: T.handle,
        var_ids: T.handle,
        var_cnt: T.handle,
        var_penalties: T.handle,
    ):
        T.func_attr(_attrs(gpu))
        B = T.int32()
        S = T.int32()
        N = T.int32()
        logits = T.match_buffer(var_logits, (B, vocab), "float32")
        seq_ids = T.match_buffer(var_seq_ids, (S,), "int32")
        pos2seq = T.match_buffer(var_pos2seq, (N,), "int32")
        ids = T.match_buffer(var_ids, (N,), "int32")
        cnt = T.match_buffer(var_cnt, (N,), "int32")
        penalties = T.match_buffer(var_penalties, (S, 3), "float32")
        for bx in block((N + THREADS - 1) // THREADS):
            for tx in thread(THREADS):
                with T.sblock("penalty"):
                    value = T.sblock_alloc_buffer((1,), "float32", scope="local")
                    if bx * THREADS + tx < N:
                        # presence and frequency first, then repetition on the result (MLC's order)
                        value[0] = (
                            logits[seq_ids[pos2seq[bx * THREADS + tx]], ids[bx * THREADS + tx]]
                            - penalties[pos2seq[bx * THREADS + tx], 0]
                            - T.Cast("float32", cnt[bx * THREADS + tx]) * penalties[pos2seq[bx * THREADS + tx], 1]
                        )
                        logits[seq_ids[pos2seq[bx * THREADS + tx]], ids[bx * THREADS + tx]] = T.if_then_else(
                            value[0] < T.float32(0),
                            value[0] * penalties[pos2seq[bx * THREADS + tx], 2],
                            value[0] / penalties[pos2seq[bx * THREADS + tx], 2],
                        )

    return apply_penalty


def bitmask_kernel(gpu: bool, vocab: int):
    block, thread = loops(gpu)
    words = (vocab + 31) // 32

    @T.prim_func(s_tir=True)
    def apply_bitmask(var_logits: T.handle, var_seq_ids: T.handle, var_bitmask: T.handle):
        T.func_attr(_attrs(gpu))
        B = T.int32()
        S = T.int32()
        logits = T.match_buffer(var_logits, (B, vocab), "float32")
        seq_ids = T.match_buffer(var_seq_ids, (S,), "int32")
        bitmask = T.match_buffer(var_bitmask, (B, words), "int32")
        for bx in block((S * vocab + THREADS - 1) // THREADS):
            for tx in thread(THREADS):
                with T.sblock("mask"):
                    if bx * THREADS + tx < S * vocab:
                        # bits are LSB-first within each int32 word; a masked token gets the
                        # lowest float (not -inf, so softmax never sees inf - inf)
                        if (
                            T.bitwise_and(
                                T.shift_right(
                                    bitmask[seq_ids[(bx * THREADS + tx) // vocab], ((bx * THREADS + tx) % vocab) // 32],
                                    ((bx * THREADS + tx) % vocab) % 32,
                                ),
                                1,
                            )
                            == 0
                        ):
                            logits[seq_ids[(bx * THREADS + tx) // vocab], (bx * THREADS + tx) % vocab] = T.min_value("float32")

    return apply_bitmask


def softmax_kernels(gpu: bool, vocab: int):
    """(chunk statistics, merge + normalise) kernels of softmax_with_temperature."""
    block, thread = loops(gpu)
    chunks = (vocab + CHUNK - 1) // CHUNK

    @T.prim_func(s_tir=True)
    def softmax_chunk_stats(var_logits: T.handle, var_temperature: T.handle, var_stats: T.handle):
        T.func_attr(_attrs(gpu))
        B = T.int32()
        logits = T.match_buffer(var_logits, (B, vocab), "float32")
        temperature = T.match_buffer(var_temperature, (B,), "float32")
        stats = T.match_buffer(var_stats, (B, chunks, 3), "float32")  # max, sum exp(x - max), count of max
        for bx in block((B * chunks + THREADS - 1) // THREADS):
            for tx in thread(THREADS):
                with T.sblock("chunk_stats"):
                    acc = T.sblock_alloc_buffer((3,), "float32", scope="local")
                    if bx * THREADS + tx < B * chunks:
                        acc[0] = T.min_value("float32")
                        acc[1] = T.float32(0)
                        acc[2] = T.float32(0)
                        for j in T.serial(CHUNK):
                            if ((bx * THREADS + tx) % chunks) * CHUNK + j < vocab:
                                acc[0] = T.max(
                                    acc[0], logits[(bx * THREADS + tx) // chunks, ((bx * THREADS + tx) % chunks) * CHUNK + j]
                                )
                        for j in T.serial(CHUNK):
                            if ((bx * THREADS + tx) % chunks) * CHUNK + j < vocab:
                                if logits[(bx * THREADS + tx) // chunks, ((bx * THREADS + tx) % chunks) * CHUNK + j] == acc[0]:
                                    acc[2] = acc[2] + T.float32(1)
                                if temperature[(bx * THREADS + tx) // chunks] > T.float32(GREEDY_TEMPERATURE):
                                    acc[1] = acc[1] + T.exp(
                                        (
                                            logits[(bx * THREADS + tx) // chunks, ((bx * THREADS + tx) % chunks) * CHUNK + j]
                                            - acc[0]
                                        )
                                        / temperature[(bx * THREADS + tx) // chunks]
                                    )
                        stats[(bx * THREADS + tx) // chunks, (bx * THREADS + tx) % chunks, 0] = acc[0]
                        stats[(bx * THREADS + tx) // chunks, (bx * THREADS + tx) % chunks, 1] = acc[1]
                        stats[(bx * THREADS + tx) // chunks, (bx * THREADS + tx) % chunks, 2] = acc[2]

    @T.prim_func(s_tir=True)
    def softmax_normalize(var_logits: T.handle, var_temperature: T.handle, var_stats: T.handle, var_probs: T.handle):
        T.func_attr(_attrs(gpu))
        B = T.int32()
        logits = T.match_buffer(var_logits, (B, vocab), "float32")
        temperature = T.match_buffer(var_temperature, (B,), "float32")
        stats = T.match_buffer(var_stats, (B, chunks, 3), "float32")
        probs = T.match_buffer(var_probs, (B, vocab), "float32")
        for bx in block((B * vocab + THREADS - 1) // THREADS):
            for tx in thread(THREADS):
                with T.sblock("normalize"):
                    row = T.sblock_alloc_buffer((3,), "float32", scope="local")  # max, sum, count
                    if bx * THREADS + tx < B * vocab:
                        # every thread merges its row's chunk statistics itself: no second kernel,
                        # no shared state (chunks is small: 192 for a 49152-token vocabulary)
                        row[0] = T.min_value("float32")
                        row[1] = T.float32(0)
                        row[2] = T.float32(0)
                        for c in T.serial(chunks):
                            row[0] = T.max(row[0], stats[(bx * THREADS + tx) // vocab, c, 0])
                        for c in T.serial(chunks):
                            if stats[(bx * THREADS + tx) // vocab, c, 0] == row[0]:
                                row[2] = row[2] + stats[(bx * THREADS + tx) // vocab, c, 2]
                            if temperature[(bx * THREADS + tx) // vocab] > T.float32(GREEDY_TEMPERATURE):
                                row[1] = row[1] + stats[(bx * THREADS + tx) // vocab, c, 1] * T.exp(
                                    (stats[(bx * THREADS + tx) // vocab, c, 0] - row[0])
                                    / temperature[(bx * THREADS + tx) // vocab]
                                )
                        if temperature[(bx * THREADS + tx) // vocab] > T.float32(GREEDY_TEMPERATURE):
                            probs[(bx * THREADS + tx) // vocab, (bx * THREADS + tx) % vocab] = (
                                T.exp(
                                    (logits[(bx * THREADS + tx) // vocab, (bx * THREADS + tx) % vocab] - row[0])
                                    / temperature[(bx * THREADS + tx) // vocab]
                                )
                                / row[1]
                            )
                        else:
                            probs[(bx * THREADS + tx) // vocab, (bx * THREADS + tx) % vocab] = T.if_then_else(
                                logits[(bx * THREADS + tx) // vocab, (bx * THREADS + tx) % vocab] == row[0],
                                T.float32(1) / row[2],
                                T.float32(0),
                            )

    return softmax_chunk_stats, softmax_normalize


def sort_kernels(gpu: bool, vocab: int):
    """(pad, one bitonic pass, unpad) kernels of argsort_probs."""
    block, thread = loops(gpu)
    padded = 1 << (vocab - 1).bit_length()
    half = padded // 2

    @T.prim_func(s_tir=True)
    def sort_pad(var_probs: T.handle, var_keys: T.handle, var_ids: T.handle):
        T.func_attr(_attrs(gpu))
        B = T.int32()
        probs = T.match_buffer(var_probs, (B, vocab), "float32")
        keys = T.match_buffer(var_keys, (B, padded), "float32")
        ids = T.match_buffer(var_ids, (B, padded), "int32")
        for bx in block((B * padded + THREADS - 1) // THREADS):
            for tx in thread(THREADS):
                with T.sblock("pad"):
                    if bx * THREADS + tx < B * padded:
                        keys[(bx * THREADS + tx) // padded, (bx * THREADS + tx) % padded] = T.if_then_else(
                            (bx * THREADS + tx) % padded < vocab,
                            probs[(bx * THREADS + tx) // padded, T.min((bx * THREADS + tx) % padded, vocab - 1)],
                            T.float32(-1),
                        )
                        ids[(bx * THREADS + tx) // padded, (bx * THREADS + tx) % padded] = (bx * THREADS + tx) % padded

    @T.prim_func(s_tir=True)
    def sort_pass(var_keys: T.handle, var_ids: T.handle, k: T.int32, j: T.int32):
        T.func_attr(_attrs(gpu))
        B = T.int32()
        keys = T.match_buffer(var_keys, (B, padded), "float32")
        ids = T.match_buffer(var_ids, (B, padded), "int32")
        for bx in block((B * half + THREADS - 1) // THREADS):
            for tx in thread(THREADS):
                with T.sblock("compare_exchange"):
                    # pair (lo, lo + j) of row b; segments with (lo & k) == 0 sort descending
                    pos = T.sblock_alloc_buffer((3,), "int32", scope="local")  # row, lo, hi
                    key = T.sblock_alloc_buffer((2,), "float32", scope="local")
                    idx = T.sblock_alloc_buffer((2,), "int32", scope="local")
                    swap = T.sblock_alloc_buffer((1,), "int32", scope="local")
                    if bx * THREADS + tx < B * half:
                        pos[0] = (bx * THREADS + tx) // half
                        pos[1] = 2 * j * (((bx * THREADS + tx) % half) // j) + ((bx * THREADS + tx) % half) % j
                        pos[2] = pos[1] + j
                        key[0] = keys[pos[0], pos[1]]
                        key[1] = keys[pos[0], pos[2]]
                        idx[0] = ids[pos[0], pos[1]]
                        idx[1] = ids[pos[0], pos[2]]
                        # hi_first: the hi element belongs before lo (larger key, or equal key and
                        # smaller id). Segments with (lo & k) == 0 sort descending, others ascending.
                        swap[0] = T.Cast("int32", key[1] > key[0] or (key[1] == key[0] and idx[1] < idx[0]))
                        if T.bitwise_and(pos[1], k) != 0:
                            swap[0] = 1 - swap[0]
                        if swap[0] == 1:
                            keys[pos[0], pos[1]] = key[1]
                            keys[pos[0], pos[2]] = key[0]
                            ids[pos[0], pos[1]] = idx[1]
                            ids[pos[0], pos[2]] = idx[0]

    @T.prim_func(s_tir=True)
    def sort_unpad(var_keys: T.handle, var_ids: T.handle, var_sorted: T.handle, var_sorted_ids: T.handle):
        T.func_attr(_attrs(gpu))
        B = T.int32()
        keys = T.match_buffer(var_keys, (B, padded), "float32")
        ids = T.match_buffer(var_ids, (B, padded), "int32")
        sorted_probs = T.match_buffer(var_sorted, (B, vocab), "float32")
        sorted_ids = T.match_buffer(var_sorted_ids, (B, vocab), "int32")
        for bx in block((B * vocab + THREADS - 1) // THREADS):
            for tx in thread(THREADS):
                with T.sblock("unpad"):
                    if bx * THREADS + tx < B * vocab:
                        sorted_probs[(bx * THREADS + tx) // vocab, (bx * THREADS + tx) % vocab] = keys[
                            (bx * THREADS + tx) // vocab, (bx * THREADS + tx) % vocab
                        ]
                        sorted_ids[(bx * THREADS + tx) // vocab, (bx * THREADS + tx) % vocab] = ids[
                            (bx * THREADS + tx) // vocab, (bx * THREADS + tx) % vocab
                        ]

    passes = [(k, j) for k in (1 << e for e in range(1, padded.bit_length())) for j in (k >> s for s in range(1, k.bit_length()))]
    return sort_pad, sort_pass, sort_unpad, padded, passes


def top_p_kernels(gpu: bool, vocab: int):
    """(chunk sums, per-sample walk) kernels of sample_with_top_p."""
    block, thread = loops(gpu)
    chunks = (vocab + CHUNK - 1) // CHUNK

    @T.prim_func(s_tir=True)
    def top_p_chunk_sums(var_sorted: T.handle, var_sums: T.handle):
        T.func_attr(_attrs(gpu))
        B = T.int32()
        sorted_probs = T.match_buffer(var_sorted, (B, vocab), "float32")
        sums = T.match_buffer(var_sums, (B, chunks), "float32")
        for bx in block((B * chunks + THREADS - 1) // THREADS):
            for tx in thread(THREADS):
                with T.sblock("chunk_sum"):
                    acc = T.sblock_alloc_buffer((1,), "float32", scope="local")
                    if bx * THREADS + tx < B * chunks:
                        acc[0] = T.float32(0)
                        for j in T.serial(CHUNK):
                            if ((bx * THREADS + tx) % chunks) * CHUNK + j < vocab:
                                acc[0] = (
                                    acc[0]
                                    + sorted_probs[(bx * THREADS + tx) // chunks, ((bx * THREADS + tx) % chunks) * CHUNK + j]
                                )
                        sums[(bx * THREADS + tx) // chunks, (bx * THREADS + tx) % chunks] = acc[0]

    @T.prim_func(s_tir=True)
    def top_p_sample(
        var_sorted: T.handle,
        var_sorted_ids: T.handle,
        var_sums: T.handle,
        var_uniform: T.handle,
        var_sample_idx: T.handle,
        var_top_p: T.handle,
        var_out: T.handle,
    ):
        T.func_attr(_attrs(gpu))
        B = T.int32()
        N = T.int32()
        sorted_probs = T.match_buffer(var_sorted, (B, vocab), "float32")
        sorted_ids = T.match_buffer(var_sorted_ids, (B, vocab), "int32")
        sums = T.match_buffer(var_sums, (B, chunks), "float32")
        uniform = T.match_buffer(var_uniform, (N,), "float32")
        sample_idx = T.match_buffer(var_sample_idx, (N,), "int32")
        top_p = T.match_buffer(var_top_p, (B,), "float32")
        out = T.match_buffer(var_out, (N,), "int32")
        for bx in block((N + THREADS - 1) // THREADS):
            for tx in thread(THREADS):
                with T.sblock("walk"):
                    # run: [sum before the current chunk, sum inside it, nucleus mass, u * mass]
                    run = T.sblock_alloc_buffer((4,), "float32", scope="local")
                    # at: [chunk found (-1: none), index found (-1: none), last index of the nucleus]
                    at = T.sblock_alloc_buffer((3,), "int32", scope="local")
                    if bx * THREADS + tx < N:
                        # pass 1: the nucleus ends at the first index whose running sum >= top_p
                        run[0] = T.float32(0)
                        at[0] = -1
                        for c in T.serial(chunks):
                            if at[0] < 0:
                                if run[0] + sums[sample_idx[bx * THREADS + tx], c] >= top_p[sample_idx[bx * THREADS + tx]]:
                                    at[0] = c
                                else:
                                    run[0] = run[0] + sums[sample_idx[bx * THREADS + tx], c]
                        run[2] = run[0]  # the whole row when rounding keeps the sum below top_p
                        at[2] = vocab - 1
                        if at[0] >= 0:
                            at[1] = -1
                            run[1] = run[0]
                            for j in T.serial(CHUNK):
                                if at[1] < 0 and at[0] * CHUNK + j < vocab:
                                    run[1] = run[1] + sorted_probs[sample_idx[bx * THREADS + tx], at[0] * CHUNK + j]
                                    if run[1] >= top_p[sample_idx[bx * THREADS + tx]]:
                                        at[1] = at[0] * CHUNK + j
                            if at[1] >= 0:
                                at[2] = at[1]
                            run[2] = run[1]
                        # pass 2: the token is the first index whose running sum exceeds u * mass
                        run[3] = uniform[bx * THREADS + tx] * run[2]
                        run[0] = T.float32(0)
                        at[0] = -1
                        for c in T.serial(chunks):
                            if at[0] < 0:
                                if run[0] + sums[sample_idx[bx * THREADS + tx], c] > run[3]:
                                    at[0] = c
                                else:
                                    run[0] = run[0] + sums[sample_idx[bx * THREADS + tx], c]
                        at[1] = -1
                        if at[0] >= 0:
                            run[1] = run[0]
                            for j in T.serial(CHUNK):
                                if at[1] < 0 and at[0] * CHUNK + j < vocab:
                                    run[1] = run[1] + sorted_probs[sample_idx[bx * THREADS + tx], at[0] * CHUNK + j]
                                    if run[1] > run[3]:
                                        at[1] = at[0] * CHUNK + j
                        if at[1] < 0 or at[1] > at[2]:
                            at[1] = at[2]  # rounding fallback: stay inside the nucleus
                        out[bx * THREADS + tx] = sorted_ids[sample_idx[bx * THREADS + tx], at[1]]

    return top_p_chunk_sums, top_p_sample


def attach_sampler(mod: tvm.IRModule, vocab: int, target: tvm.target.Target) -> tvm.IRModule:
    """Add the six sampling/logit functions (as Relax functions WebLLM can call) to ``mod``."""
    gpu = target.kind.name != "llvm"
    bb = relax.BlockBuilder(mod)
    batch = tirx.Var("batch_size", "int64")
    f32 = lambda *shape: relax.TensorType(shape, "float32")  # noqa: E731
    i32 = lambda *shape: relax.TensorType(shape, "int32")  # noqa: E731
    n = tirx.Var("num_positions", "int64")
    s = tirx.Var("num_seqs", "int64")

    def inplace(name: str, kernel, params: list[relax.Var]) -> None:
        with bb.function(name, params):
            gv = bb.add_func(kernel, f"{name}_kernel")
            out = bb.emit(relax.call_tir_inplace(gv, params, inplace_indices=[0], out_ty=params[0].ty))
            bb.emit_func_output(out)

    logits = lambda: relax.Var("logits", f32(batch, vocab))  # noqa: E731
    inplace(
        "apply_logit_bias_inplace",
        logit_bias_kernel(gpu, vocab),
        [logits(), relax.Var("pos2seq_id", i32(n)), relax.Var("token_ids", i32(n)), relax.Var("logit_bias", f32(n))],
    )
    inplace(
        "apply_penalty_inplace",
        penalty_kernel(gpu, vocab),
        [
            logits(),
            relax.Var("seq_ids", i32(s)),
            relax.Var("pos2seq_id", i32(n)),
            relax.Var("token_ids", i32(n)),
            relax.Var("token_cnt", i32(n)),
            relax.Var("penalties", f32(s, 3)),
        ],
    )
    inplace(
        "apply_bitmask_inplace",
        bitmask_kernel(gpu, vocab),
        [logits(), relax.Var("seq_ids", i32(s)), relax.Var("bitmask", i32(batch, (vocab + 31) // 32))],
    )

    chunks = (vocab + CHUNK - 1) // CHUNK
    stats_k, norm_k = softmax_kernels(gpu, vocab)
    x, temp = relax.Var("logits", f32(batch, 1, vocab)), relax.Var("temperature", f32(batch))
    with bb.function("softmax_with_temperature", [x, temp]):
        flat = bb.emit(relax.op.reshape(x, relax.ShapeExpr([batch, vocab])))
        stats = bb.emit(relax.call_tir(bb.add_func(stats_k, "softmax_chunk_stats"), [flat, temp], f32(batch, chunks, 3)))
        probs = bb.emit(relax.call_tir(bb.add_func(norm_k, "softmax_normalize"), [flat, temp, stats], f32(batch, vocab)))
        bb.emit_func_output(bb.emit(relax.op.reshape(probs, relax.ShapeExpr([batch, 1, vocab]))))

    pad_k, pass_k, unpad_k, padded, passes = sort_kernels(gpu, vocab)
    probs = relax.Var("probs", f32(batch, vocab))
    with bb.function("argsort_probs", [probs]):
        work = bb.emit(relax.call_tir(bb.add_func(pad_k, "sort_pad"), [probs], [f32(batch, padded), i32(batch, padded)]))
        pass_gv = bb.add_func(pass_k, "sort_pass")
        keys, ids = bb.emit(relax.TupleGetItem(work, 0)), bb.emit(relax.TupleGetItem(work, 1))
        for k, j in passes:
            work = bb.emit(
                relax.call_tir_inplace(
                    pass_gv,
                    [keys, ids, relax.prim_value(tirx.IntImm("int32", k)), relax.prim_value(tirx.IntImm("int32", j))],
                    inplace_indices=[0, 1],
                    out_ty=[keys.ty, ids.ty],
                )
            )
            keys, ids = bb.emit(relax.TupleGetItem(work, 0)), bb.emit(relax.TupleGetItem(work, 1))
        out = bb.emit(relax.call_tir(bb.add_func(unpad_k, "sort_unpad"), [keys, ids], [f32(batch, vocab), i32(batch, vocab)]))
        bb.emit_func_output(out)

    sums_k, walk_k = top_p_kernels(gpu, vocab)
    samples = tirx.Var("num_samples", "int64")
    sp, si = relax.Var("sorted_probs", f32(batch, vocab)), relax.Var("sorted_indices", i32(batch, vocab))
    u, idx, top_p = (
        relax.Var("uniform_samples", f32(samples)),
        relax.Var("sample_indices", i32(samples)),
        relax.Var("top_p", f32(batch)),
    )
    with bb.function("sample_with_top_p", [sp, si, u, idx, top_p]):
        sums = bb.emit(relax.call_tir(bb.add_func(sums_k, "top_p_chunk_sums"), [sp], f32(batch, chunks)))
        tokens = bb.emit(relax.call_tir(bb.add_func(walk_k, "top_p_sample"), [sp, si, sums, u, idx, top_p], i32(samples)))
        bb.emit_func_output(tokens)
    return bb.finalize()
