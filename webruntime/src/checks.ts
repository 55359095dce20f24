// Checks `lantern validate` runs in the page besides the engine: does every kernel of a model
// library compile into a WebGPU compute pipeline on this adapter?
import * as tvmjs from "@mlc-ai/web-runtime";
import { detectGpu } from "./device";

export interface PipelineCheck {
  file: string;
  checked: boolean; // false when the adapter lacks a feature the library needs
  ok: boolean;
  kernels: number;
  seconds: number;
  error?: string;
  missingFeatures?: string[];
}

export async function checkLibraryPipelines(modelUrl: string, file: string, requiredFeatures: string[]): Promise<PipelineCheck> {
  const gpu = await detectGpu();
  const missing = requiredFeatures.filter((f) => !gpu.features.has(f));
  if (missing.length) return { file, checked: false, ok: false, kernels: 0, seconds: 0, missingFeatures: missing };
  const wasm = await (await fetch(new URL(file, new URL(modelUrl, location.href)))).arrayBuffer();
  const started = performance.now();
  const tvm = await tvmjs.instantiate(wasm, tvmjs.createPolyfillWASI(), () => {});
  let kernels = 0;
  try {
    tvm.initWebGPU(gpu.device);
    tvm.beginScope();
    const vm = tvm.detachFromCurrentScope(tvm.createVirtualMachine(tvm.webgpu()));
    kernels = Object.keys(JSON.parse(vm.getInternalModule().getFunction("webgpu.get_fmap", true)())).length;
    tvm.endScope();
    gpu.device.pushErrorScope("validation");
    await tvm.asyncLoadWebGPUPipelines(vm.getInternalModule());
    const invalid = await gpu.device.popErrorScope();
    if (invalid) throw new Error(invalid.message);
    return { file, checked: true, ok: true, kernels, seconds: (performance.now() - started) / 1000 };
  } catch (err) {
    return {
      file,
      checked: true,
      ok: false,
      kernels,
      seconds: (performance.now() - started) / 1000,
      error: err instanceof Error ? err.message : String(err),
    };
  } finally {
    tvm.dispose();
  }
}
