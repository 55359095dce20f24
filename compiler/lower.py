"""Stages 3-4: model -> Relax IRModule -> compiled executable, per target.

The whole lowering is one list of phases (graph, schedule, lower, vm), each
announced through ``on_phase`` and optionally dumped to ``dump_dir`` so a
reader can see every step the compiler takes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import tvm
from tvm import relax
from tvm.relax.frontend import nn

from . import emulated, package
from .cpu_schedule import ParallelSpatial
from .kernels import replace_racy_kernels
from .quantize import QuantSpec
from .sampling_kernels import attach_sampler

# The targets built from the same model source: "wasm" is the CPU library's schedule compiled for the
# browser's wasm device (128-bit SIMD, which every browser Lantern's wasm device runs in has), linked as
# the webgpu libraries are.
WEBGPU_HOST = {"kind": "llvm", "mtriple": "wasm32-unknown-unknown-wasm"}
TARGETS = {
    "cpu": lambda: tvm.target.Target({"kind": "llvm"}),
    "webgpu": lambda: tvm.target.Target({"kind": "webgpu", "host": WEBGPU_HOST}),
    "wasm": lambda: tvm.target.Target({**WEBGPU_HOST, "mattr": ["+simd128"]}),
}
LINKED = ("webgpu", "wasm")  # targets whose library is a .wasm linked with TVM's web runtime (link.py)
# The wasm target's second library: relaxed SIMD's fused multiply-add (f32x4.relaxed_madd), which LLVM
# selects for the kernels' multiply-adds; 1.5x the float32 linears' speed in V8, where an engine has it
# (Chromium does; the runtime probes, webruntime/src/llama-builds.ts). It requires the "relaxed-simd" feature.
WASM_RELAXED = "relaxed-simd"


def target_for(name: str, variant: str | None = None) -> tvm.target.Target:
    """The TVM target of ``name`` (a key of TARGETS); ``variant`` WASM_RELAXED adds relaxed SIMD to wasm's."""
    if name == "wasm" and variant == WASM_RELAXED:
        return tvm.target.Target({**WEBGPU_HOST, "mattr": ["+simd128", "+relaxed-simd"]})
    return TARGETS[name]()


@dataclass
class Exported:
    mod: tvm.IRModule
    param_names: list[str]  # the order the library takes its packed parameters in


def export(family, config, spec: QuantSpec, target: tvm.target.Target, metadata: dict) -> Exported:
    """Instantiate the family's model for ``target`` and export its entry points to Relax."""
    model: nn.Module = family.model(config, spec, target)
    mod, named = model.export_tvm(spec=model.get_default_spec())
    if target.kind.name != "llvm":
        mod = replace_racy_kernels(mod, spec.model_dtype)
    # TVM's KV-cache attention kernels can do neither: Lantern's can (an embedder has no KV cache: its
    # attention, window included, is plain relax, models/llama/embedder.py)
    if family.kind == "chat" and (config.attention_softcap or config.windowed):
        mod = emulated.custom_attention(
            mod, config.attention_softcap, config.sliding_window if config.windowed else 0, gpu=target.kind.name != "llvm"
        )
    if family.kind == "chat":  # an encoder has no logits to sample from
        mod = attach_sampler(mod, config.vocab_size, target)
    names = [n for n, _ in named]
    shapes = [[int(d) for d in p.shape] for _, p in named]
    dtypes = [p.dtype for _, p in named]
    meta = dict(
        metadata,
        params=[
            {"name": n, "shape": s, "dtype": d, "preprocs": [], "pipeline_stages": [0]} for n, s, d in zip(names, shapes, dtypes)
        ],
    )
    return Exported(_attach_metadata(mod, meta), names)


def _attach_metadata(mod: tvm.IRModule, metadata: dict) -> tvm.IRModule:
    # WebLLM reads the model's metadata by calling a zero-argument `_metadata`.
    bb = relax.BlockBuilder(mod)
    with bb.function("_metadata", params=[]):
        bb.emit_func_output(tvm.ir.StringImm(json.dumps(metadata)))
    return bb.finalize()


# How WebGPU kernels are scheduled. "gpu" is dlight's default for real GPUs: GEMVs and
# reductions split the reduction across a workgroup and combine partial sums in shared
# memory. Software adapters (SwiftShader, WARP, lavapipe) run workgroups on CPU threads,
# where shared memory, barriers and any load at a non-constant index are slow: "cpu-emulated"
# swaps in the kernels of emulated.py (and falls back to dlight for the rest).
# "both" builds one library of each; the runtimes pick by adapter (package.choose_library).
WEBGPU_SCHEDULES = package.SCHEDULES
SCHEDULE_CHOICES = (*WEBGPU_SCHEDULES, "both")


def schedules(choice: str) -> tuple[str, ...]:
    """The library schedules a ``--webgpu-schedule`` choice builds."""
    return WEBGPU_SCHEDULES if choice == "both" else (choice,)


def _phases(
    target: tvm.target.Target, quantized: bool, schedule_profile: str = "gpu", encoder: bool = False
) -> list[tuple[str, list[tvm.transform.Pass]]]:
    from tvm.s_tir import dlight as dl

    graph = [
        relax.backend.DispatchSampling(),
        relax.backend.DispatchSortScan(),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
    ]
    if target.kind.name == "llvm":
        # dlight's CPU GEMV rule doubles q4 decode speed (it dequantizes inside the dot
        # product) but spends minutes compiling plain f32/f16 GEMVs: only for quantized models.
        gemv = [dl.cpu.GEMV()] if quantized else []
        schedule = [emulated.rewrite_cpu_pass, dl.ApplyDefaultSchedule(*gemv, dl.cpu.Reduction(), ParallelSpatial())]
    elif schedule_profile == "cpu-emulated":
        # An encoder's matmuls have dynamic texts and tokens, where dlight's Matmul rule writes 50-120 KB
        # shaders that SwiftShader compiled for over 5 minutes and then lost the device (flattening them
        # to one dynamic dimension left them as big). Its linears get emulated.f32_matmul (rewrite_pass);
        # the rest (attention's batched matmuls) one thread per output element (Fallback), a short loop
        # SwiftShader compiles at once.
        rules = [dl.gpu.Fallback()] if encoder else [dl.gpu.Matmul(), dl.gpu.Fallback()]
        schedule = [emulated.rewrite_pass, dl.ApplyDefaultSchedule(*rules)]
    else:
        schedule = [
            dl.ApplyDefaultSchedule(
                dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()
            )
        ]
    lower = [
        relax.transform.RewriteDataflowReshape(),
        relax.transform.ToNonDataflow(),
        relax.transform.RemovePurityChecking(),
        relax.transform.CallTIRRewrite(),
    ]
    vm = [
        relax.transform.StaticPlanBlockMemory(),
        relax.transform.LowerAllocTensor(),
        relax.transform.KillAfterLastUse(),
        relax.transform.LowerRuntimeBuiltin(),
        relax.transform.ComputePrimValue(),
        relax.transform.VMShapeLower(),
        relax.transform.AttachGlobalSymbol(),
    ]
    return [("graph", graph), ("schedule", schedule), ("lower", lower), ("vm", vm)]


def compile_module(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    *,
    quantized: bool = False,
    schedule_profile: str = "gpu",
    encoder: bool = False,
    dump_dir: Path | None = None,
    on_phase: Callable[[str], None] = lambda _: None,
) -> tuple[relax.Executable, int, int]:
    """Run the phases, then build TIR and VM bytecode for ``target``.

    Returns the executable, its kernel count and the size of its largest kernel
    (WGSL bytes for webgpu, TIR script bytes for cpu).
    """
    with target:
        for i, (name, passes) in enumerate(_phases(target, quantized, schedule_profile, encoder), start=1):
            on_phase(name)
            mod = tvm.transform.Sequential(passes, name=name)(mod)
            if dump_dir is not None:
                dump_dir.mkdir(parents=True, exist_ok=True)
                (dump_dir / f"{i}-{name}.py").write_text(mod.script(show_meta=False))
        kernels = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
        on_phase("codegen")
        executable = relax.build(mod, target=target, relax_pipeline=None)
    if target.kind.name == "webgpu":
        wgsl = device_source(executable)
        if dump_dir is not None:
            (dump_dir / "kernels.wgsl").write_text(wgsl)
        sizes = [len(k) for k in wgsl.split("@compute")[1:]]
    else:
        sizes = [len(k.script()) for k in kernels]
    return executable, len(kernels), max(sizes, default=0)


def device_source(executable: relax.Executable) -> str:
    """The WGSL of every kernel of a webgpu executable."""
    host = executable.mod.imports[0]
    return "\n".join(m.inspect_source("wgsl") for m in host.imports if m.kind == "webgpu")
