// Which of an artifact's libraries a device runs. The twin of choose_library in
// compiler/package.py: tests/test_library_choice.py feeds both the same cases.
import { CapabilityError, WebGPUUnavailableError } from "./errors";
import type { LibraryEntry, Manifest } from "./loader";

/** Kernel schedules this runtime knows: for real GPUs, and for software adapters (SwiftShader...). */
export const SCHEDULES = ["gpu", "cpu-emulated"] as const;

export interface AdapterTraits {
  features: Set<string>;
  // a software adapter (SwiftShader, WARP, lavapipe, llvmpipe): prefers the "cpu-emulated" schedule
  emulated: boolean;
}

/**
 * The ``target`` library (webgpu, or an embedding model's wasm) this adapter or engine runs best: one
 * whose required features it has and whose schedule this runtime knows (none means "gpu"), preferring
 * weights as stored over an f32 upcast, then the schedule made for this kind of adapter, then the one
 * that needs more of its features (made for them: wasm's relaxed SIMD). A library of an unknown schedule
 * is skipped with a warning.
 */
export function chooseLibrary(
  manifest: Pick<Manifest, "libraries">,
  adapter: AdapterTraits,
  target: "webgpu" | "wasm" = "webgpu",
): LibraryEntry {
  const candidates = manifest.libraries.filter((lib) => lib.target === target);
  const known = candidates.filter((lib) => {
    const ok = (SCHEDULES as readonly string[]).includes(lib.schedule ?? "gpu");
    if (!ok) console.warn(`lantern: skipping ${lib.file}: unknown kernel schedule '${lib.schedule}'`);
    return ok;
  });
  const usable = known.filter((lib) => lib.required_features.every((f) => adapter.features.has(f)));
  if (!usable.length) {
    const needs = candidates.map((lib) =>
      lib.required_features.length
        ? `${lib.file} needs ${lib.required_features.join(" + ")}`
        : `${lib.file} has the unknown schedule '${lib.schedule}'`,
    );
    const why = `no ${target} library runs here (${needs.join("; ") || "none was built"})`;
    throw target === "webgpu" ? new WebGPUUnavailableError(why) : new CapabilityError(why);
  }
  const want = adapter.emulated ? "cpu-emulated" : "gpu";
  // as one number: the first two rules, then more of the features first (a library needs at most a few)
  const rank = (lib: LibraryEntry) =>
    10 * ((lib.param_upcast ? 2 : 0) + ((lib.schedule ?? "gpu") === want ? 0 : 1)) - lib.required_features.length;
  return usable.reduce((best, lib) => (rank(lib) < rank(best) ? lib : best));
}

/** A software adapter by what it says of itself: Chrome's isFallbackAdapter, or its name. */
export function isSoftwareAdapter(info: {
  vendor?: string;
  architecture?: string;
  description?: string;
  isFallbackAdapter?: boolean;
}): boolean {
  const text = `${info.vendor ?? ""} ${info.architecture ?? ""} ${info.description ?? ""}`.toLowerCase();
  return Boolean(info.isFallbackAdapter) || /swiftshader|llvmpipe|lavapipe|warp|microsoft basic render/.test(text);
}

const VENDOR_NAMES: Record<string, string> = {
  nvidia: "NVIDIA",
  amd: "AMD",
  intel: "Intel",
  apple: "Apple",
  qualcomm: "Qualcomm",
  arm: "Arm",
  "img-tec": "Imagination",
  microsoft: "Microsoft",
};

/**
 * The device a page names to its user: "WebGPU (software adapter, slow)" for an adapter that runs on
 * the CPU, else "WebGPU (NVIDIA ampere)" from what the adapter says of itself.
 */
export function deviceLabel(adapter: { vendor?: string; architecture?: string; fallback: boolean }): string {
  if (adapter.fallback) return "WebGPU (software adapter, slow)";
  const vendor = VENDOR_NAMES[(adapter.vendor ?? "").toLowerCase()] ?? adapter.vendor ?? "";
  const name = `${vendor} ${adapter.architecture ?? ""}`.trim();
  return `WebGPU (${name || "GPU"})`;
}

/**
 * The device `device: "auto"` takes: WebGPU on a real adapter; the CPU (wasm) when there is no
 * adapter or only a software one and the artifact has a GGUF; WebGPU on a software adapter when it
 * has none; null when nothing can run it here.
 */
export function autoDevice(adapter: { emulated: boolean } | null, hasGguf: boolean): "webgpu" | "wasm" | null {
  if (adapter && (!adapter.emulated || !hasGguf)) return "webgpu";
  return hasGguf ? "wasm" : null;
}
