"""Kernel-level checks on WebGPU (SwiftShader): each Lantern kernel against the CPU build of the same TIR.

SwiftShader runs SIMD groups of 4 and exposes races real GPUs hide; these are the
kernels TVM 0.27 gets wrong on WebGPU (merge-state, cumsum in top-p, argsort).
"""

import numpy as np
import pytest
import tvm
from tvm import relax

import sampling_reference as ref
from browser import probe_page
from sampling_reference import V, nucleus_logits

from lantern import kernels, link, lower

pytestmark = [pytest.mark.browser, pytest.mark.webgpu_build]


def arg(a: np.ndarray) -> dict:
    return {"dtype": str(a.dtype), "shape": list(a.shape), "data": a.ravel().tolist()}


def call_on_webgpu(folder, lib_file: str, calls: list[tuple[str, list[np.ndarray]]]) -> list[list[np.ndarray]]:
    with probe_page(folder) as (page, model_url):
        out = page.evaluate(
            "([u, l, c]) => callFunctions(u, l, c)",
            [model_url, lib_file, [{"name": n, "args": [arg(a) for a in args]} for n, args in calls]],
        )
    return [[np.array(x) for x in outputs] for outputs in out]


def test_sampling_functions_on_webgpu_match_cpu(tiny_q4):
    cpu = tiny_q4.cpu_model()
    rng = np.random.default_rng(11)
    logits = rng.normal(0, 3, (1, 1, V)).astype(np.float32)
    probs = ref.softmax(rng.normal(0, 2, V).astype(np.float32), 1.0).astype(np.float32)[None]
    calls = [
        ("softmax_with_temperature", [logits, np.array([0.8], np.float32)]),
        ("softmax_with_temperature", [logits, np.array([0.0], np.float32)]),
        ("argsort_probs", [probs]),
        (
            "apply_penalty_inplace",
            [
                logits[0],
                np.zeros(1, np.int32),
                np.zeros(2, np.int32),
                np.array([4, 40000], np.int32),
                np.array([1, 3], np.int32),
                np.array([[0.2, 0.1, 1.2]], np.float32),
            ],
        ),
        (
            "apply_logit_bias_inplace",
            [logits[0], np.zeros(2, np.int32), np.array([1, 2], np.int32), np.array([5.0, -5.0], np.float32)],
        ),
    ]
    for nucleus in (1, 10, 1000):
        p = ref.softmax(nucleus_logits(nucleus, seed=nucleus), 1.0).astype(np.float32)
        order = ref.argsort_desc(p)
        mass = np.cumsum(p[order].astype(np.float64))
        top_p = float(mass[nucleus - 1]) * 0.999 if nucleus > 1 else 0.5
        us = np.random.default_rng(nucleus).random(32).astype(np.float32)
        calls.append(
            (
                "sample_with_top_p",
                [p[order][None], order.astype(np.int32)[None], us, np.zeros(32, np.int32), np.array([top_p], np.float32)],
            )
        )
    gpu = call_on_webgpu(tiny_q4.path, tiny_q4.library("webgpu").name, calls)
    for (name, args), got in zip(calls, gpu):
        expected = cpu.call(name, *args)
        for e, g in zip(expected, got):
            g = g.reshape(e.shape)
            if e.dtype == np.int32:
                np.testing.assert_array_equal(g, e, err_msg=name)
            else:
                np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-7, err_msg=name)


def test_merge_state_kernel_on_webgpu_matches_cpu(tmp_path, cache_dir):
    """Lantern's merge-state kernel, alone in a library, against TVM's serial CPU kernel."""
    from tvm.relax.frontend.nn.llm.kv_cache import _merge_state_inplace_cpu

    n, h, d = 37, 9, 64

    def module(prim):
        bb = relax.BlockBuilder()
        tt = lambda *s: relax.TensorType(s, "float32")  # noqa: E731
        params = [
            relax.Var("v", tt(n, h, d)),
            relax.Var("s", tt(n, h)),
            relax.Var("v_other", tt(n, h, d)),
            relax.Var("s_other", tt(n, h)),
        ]
        with bb.function("merge", params):
            gv = bb.add_func(prim, "merge_state")
            out = bb.emit(relax.call_tir_inplace(gv, params, inplace_indices=[0, 1], out_ty=[params[0].ty, params[1].ty]))
            bb.emit_func_output(out)
        return bb.finalize()

    webgpu = lower.TARGETS["webgpu"]()
    ex, _, _ = lower.compile_module(module(kernels.merge_state_inplace("float32")), webgpu)
    link.link_wasm(ex, tmp_path / "merge.wasm", cache_dir)
    cpu_target = lower.TARGETS["cpu"]()
    cpu_mod = module(_merge_state_inplace_cpu("float32"))
    with cpu_target:
        cpu_vm = relax.VirtualMachine(relax.build(cpu_mod, target=cpu_target), tvm.cpu())
    rng = np.random.default_rng(5)
    args = [
        rng.normal(size=(n, h, d)).astype(np.float32),
        rng.normal(size=(n, h)).astype(np.float32),
        rng.normal(size=(n, h, d)).astype(np.float32),
        rng.normal(size=(n, h)).astype(np.float32),
    ]
    expected = [t.numpy() for t in cpu_vm["merge"](*[tvm.runtime.tensor(a) for a in args])]
    got = call_on_webgpu(tmp_path, "merge.wasm", [("merge", args)])[0]
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g.reshape(e.shape), e, rtol=1e-5, atol=1e-5)
