// The WebGPU side of loading: find an adapter, pick the artifact's library for it, and check
// that the model fits before anything is allocated.
import * as tvmjs from "@mlc-ai/web-runtime";
import { OutOfMemoryError, WebGPUUnavailableError } from "./errors";
import { type AdapterTraits, isSoftwareAdapter } from "./library";
import type { Manifest } from "./loader";

export interface Gpu extends AdapterTraits {
  device: GPUDevice;
  adapterInfo: { vendor: string; architecture: string; description: string };
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
  // GPUAdapterInfo's fields are getters: copy them, a spread would see none
  const adapterInfo = { vendor: info.vendor, architecture: info.architecture, description: info.description };
  const fallback = info.isFallbackAdapter ?? (found.adapter as { isFallbackAdapter?: boolean }).isFallbackAdapter;
  return {
    device: found.device,
    adapterInfo,
    features: new Set(found.device.features as unknown as Iterable<string>),
    emulated: isSoftwareAdapter({ ...adapterInfo, isFallbackAdapter: fallback }),
  };
}

/** Throw OutOfMemoryError before the weights are fetched when a tensor exceeds the adapter's buffer
 * limits or memory is short (device "auto" then runs the GGUF on the CPU, where there is one). */
export function checkFits(manifest: Manifest, largestTensorBytes: number, device: GPUDevice): void {
  const limit = Math.min(device.limits.maxStorageBufferBindingSize, device.limits.maxBufferSize);
  if (largestTensorBytes > limit) {
    throw new OutOfMemoryError(
      `the largest weight tensor is ${largestTensorBytes} bytes but this adapter binds at most ${limit} bytes ` +
        "(maxStorageBufferBindingSize, maxBufferSize)",
    );
  }
  const gib = (globalThis.navigator as Navigator & { deviceMemory?: number })?.deviceMemory;
  // deviceMemory is rounded down and capped at 8 GiB, so only a clear shortfall is an error.
  if (gib && gib < 8 && manifest.memory.estimated_gpu_bytes > gib * 2 ** 30) {
    throw new OutOfMemoryError(
      `the model needs about ${(manifest.memory.estimated_gpu_bytes / 2 ** 30).toFixed(2)} GiB and this device reports ${gib} GiB`,
    );
  }
}
