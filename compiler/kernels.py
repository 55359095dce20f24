"""GPU kernels Lantern ships in place of TVM 0.27's where those are wrong on WebGPU.

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
        return (lambda n: T.thread_binding(n, thread="blockIdx.x"),
                lambda n: T.thread_binding(n, thread="threadIdx.x"))
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
                        s_max[0] = T.max(S[(bx * THREADS + tx) // H, (bx * THREADS + tx) % H],
                                         S_other[(bx * THREADS + tx) // H, (bx * THREADS + tx) % H])
                        scale[0] = T.exp2(S[(bx * THREADS + tx) // H, (bx * THREADS + tx) % H] - s_max[0])
                        scale[1] = T.exp2(S_other[(bx * THREADS + tx) // H, (bx * THREADS + tx) % H]
                                          - s_max[0])
                        for d in T.serial(D):
                            V[(bx * THREADS + tx) // H, (bx * THREADS + tx) % H, d] = T.Cast(
                                v_dtype,
                                (T.Cast("float32", V[(bx * THREADS + tx) // H, (bx * THREADS + tx) % H, d])
                                 * scale[0]
                                 + T.Cast("float32",
                                          V_other[(bx * THREADS + tx) // H, (bx * THREADS + tx) % H, d])
                                 * scale[1]) / (scale[0] + scale[1]))
                        S[(bx * THREADS + tx) // H, (bx * THREADS + tx) % H] = (
                            T.log2(scale[0] + scale[1]) + s_max[0])

    return merge_state


def replace_racy_kernels(mod: tvm.IRModule, dtype: str) -> tvm.IRModule:
    """Swap TVM's racy GPU kernels in ``mod`` for the ones above (GPU targets only)."""
    for gv, func in list(mod.functions.items()):
        if gv.name_hint == "tir_attention_merge_state":
            mod[gv] = merge_state_inplace(dtype).with_attr("global_symbol", gv.name_hint)
    return mod
