"""A fallback CPU schedule: run each block's outer spatial loops in parallel.

TVM leaves unscheduled TIR serial on the CPU; dlight's CPU rules cover GEMV
(decode) only. Prefill matmuls, norms and the rest get their leading spatial
loops fused and parallelised here, which is always legal for them (every
spatial iteration writes its own outputs).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.target import Target


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
