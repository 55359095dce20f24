// The WebGPU side of loading: find an adapter, pick the artifact's library for it, and check
// that the model fits before anything is allocated.
import * as tvmjs from "@mlc-ai/web-runtime";
import { OutOfMemoryError, WebGPUUnavailableError } from "./errors";
import type { LibraryEntry, Manifest } from "./loader";

export interface Gpu {
  device: GPUDevice;
  adapterInfo: { vendor: string; architecture: string; description: string };
  features: Set<string>;
  // a software adapter (SwiftShader, WARP, lavapipe): prefers the "cpu-emulated" schedule
  emulated: boolean;
}

export async function detectGpu(): Promise<Gpu> {
  if (typeof navigator === "undefined" || !("gpu" in navigator)) {
    throw new WebGPUUnavailableError("this browser has no WebGPU (navigator.gpu is missing)");
  }
  let found: Awaited<ReturnType<typeof tvmjs.detectGPUDevice>>;
  try {
    found = await tvmjs.detectGPUDevice();
  } catch (err) {
    throw new WebGPUUnavailableError(`WebGPU adapter request failed: ${err}`);
  }
  if (!found) throw new WebGPUUnavailableError("WebGPU is present but no adapter is available");
  const info = found.adapterInfo as GPUAdapterInfo & { isFallbackAdapter?: boolean };
  const text = `${info.vendor} ${info.architecture} ${info.description}`.toLowerCase();
  return {
    device: found.device,
    adapterInfo: { vendor: info.vendor, architecture: info.architecture, description: info.description },
    features: new Set(found.device.features as unknown as Iterable<string>),
    emulated: Boolean(info.isFallbackAdapter) || /swiftshader|llvmpipe|lavapipe|warp/.test(text),
  };
}

/**
 * The webgpu library this adapter runs best: one whose required features it has, preferring
 * weights as stored over an f32 upcast, then the kernel schedule made for this kind of adapter.
 */
export function chooseLibrary(manifest: Manifest, gpu: Pick<Gpu, "features" | "emulated">): LibraryEntry {
  const usable = manifest.libraries.filter(
    (lib) => lib.target === "webgpu" && lib.required_features.every((f) => gpu.features.has(f)));
  if (!usable.length) {
    const needs = manifest.libraries.filter((l) => l.target === "webgpu").map((l) => l.required_features.join("+"));
    throw new WebGPUUnavailableError(
      `no webgpu library of this artifact runs on this adapter (libraries need: ${needs.join(", ") || "nothing built"})`);
  }
  const wantSchedule = gpu.emulated ? "cpu-emulated" : "gpu";
  const rank = (lib: LibraryEntry) => (lib.param_upcast ? 2 : 0) + ((lib.schedule ?? "gpu") === wantSchedule ? 0 : 1);
  return usable.sort((a, b) => rank(a) - rank(b))[0];
}

/** Throw before allocating when a tensor exceeds the adapter's buffer limits or memory is short. */
export function checkFits(manifest: Manifest, largestTensorBytes: number, device: GPUDevice): void {
  const limit = Math.min(device.limits.maxStorageBufferBindingSize, device.limits.maxBufferSize);
  if (largestTensorBytes > limit) {
    throw new WebGPUUnavailableError(
      `the largest weight tensor is ${largestTensorBytes} bytes but this adapter binds at most ${limit} bytes ` +
      "(maxStorageBufferBindingSize)");
  }
  const gib = (globalThis.navigator as Navigator & { deviceMemory?: number })?.deviceMemory;
  // deviceMemory is rounded down and capped at 8 GiB, so only a clear shortfall is an error.
  if (gib && gib < 8 && manifest.memory.estimated_gpu_bytes > gib * 2 ** 30) {
    throw new OutOfMemoryError(
      `the model needs about ${(manifest.memory.estimated_gpu_bytes / 2 ** 30).toFixed(2)} GiB and this device reports ${gib} GiB`);
  }
}
