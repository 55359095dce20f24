// Which build of llama.cpp the `wasm` device runs, chosen by what this JavaScript engine can do (never
// by its name), and that build's files, served beside the runtime and checked against the hashes
// recorded when the runtime was bundled (defines.mjs).
//
// wllama ships two builds. The default one is 64-bit (memory64) and uses wasm exceptions; it runs
// without JSPI too, reading the GGUF into its memory (Firefox). The compat build (Asyncify, 32-bit,
// exceptions in JS) runs where memory64 or wasm exceptions are missing (Safari's JavaScriptCore), at
// a cost in speed (docs: the support matrix). Both need WebAssembly SIMD; both run on one thread
// without SharedArrayBuffer and on several with it.
import { CapabilityError } from "./errors";
import { fetchBlobs, type ManifestFile } from "./loader";
import type { FileStore } from "./storage";

export type LlamaBuild = "default" | "compat";

declare const __LLAMA_BUILDS__: Record<LlamaBuild, Record<string, ManifestFile>>;

/** What this context's WebAssembly can do, as far as choosing and running llama.cpp goes. */
export interface WasmFeatures {
  webassembly: boolean;
  simd: boolean; // 128-bit SIMD: both builds need it
  memory64: boolean; // the default build is 64-bit
  exceptions: boolean; // the default build throws C++ exceptions as wasm exceptions
  jspi: boolean; // JS promise integration: the default build reads files asynchronously with it (optional)
  threads: boolean; // SharedArrayBuffer in a cross-origin isolated context: llama.cpp may use several threads
  relaxedSimd: boolean; // relaxed SIMD's fused multiply-add: an embedding model's faster wasm library (cpu-encoder.ts)
}

// (func (result v128) i32.const 0  i8x16.splat  i8x16.popcnt): valid only where SIMD is
const SIMD_PROBE = new Uint8Array([
  0x00,
  0x61,
  0x73,
  0x6d,
  0x01,
  0x00,
  0x00,
  0x00, // "\0asm", version 1
  0x01,
  0x05,
  0x01,
  0x60,
  0x00,
  0x01,
  0x7b, // type section: () -> v128
  0x03,
  0x02,
  0x01,
  0x00, // function section: one function of that type
  0x0a,
  0x0a,
  0x01,
  0x08,
  0x00,
  0x41,
  0x00,
  0xfd,
  0x0f,
  0xfd,
  0x62,
  0x0b, // its code
]);

// (func (result v128) three v128.const 0, f32x4.relaxed_madd): valid only where relaxed SIMD is
const RELAXED_BODY = [0x00, ...[0, 1, 2].flatMap(() => [0xfd, 0x0c, ...new Array(16).fill(0)]), 0xfd, 0x85, 0x02, 0x0b];
const RELAXED_SIMD_PROBE = new Uint8Array([
  ...[0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00], // "\0asm", version 1
  ...[0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7b], // type section: () -> v128
  ...[0x03, 0x02, 0x01, 0x00], // function section: one function of that type
  ...[0x0a, RELAXED_BODY.length + 2, 0x01, RELAXED_BODY.length, ...RELAXED_BODY], // its code
]);

export function wasmFeatures(): WasmFeatures {
  const wasm = typeof WebAssembly === "object" && typeof WebAssembly.validate === "function";
  const memory64 =
    wasm &&
    (() => {
      try {
        // an engine without memory64 rejects the BigInt size, or the address type
        new WebAssembly.Memory({ address: "i64", initial: 1n } as unknown as WebAssembly.MemoryDescriptor);
        return true;
      } catch {
        return false;
      }
    })();
  const api = WebAssembly as unknown as Record<string, unknown>;
  return {
    webassembly: wasm,
    simd: wasm && WebAssembly.validate(SIMD_PROBE),
    memory64,
    exceptions: wasm && typeof api.Tag === "function",
    jspi: wasm && typeof api.Suspending === "function",
    threads: wasm && typeof SharedArrayBuffer === "function" && globalThis.crossOriginIsolated === true,
    relaxedSimd: wasm && WebAssembly.validate(RELAXED_SIMD_PROBE),
  };
}

/** The build for ``f`` and why, or CapabilityError naming what no build can do without. */
export function chooseLlamaBuild(f: WasmFeatures): { build: LlamaBuild; why: string } {
  if (!f.webassembly) throw new CapabilityError("this browser cannot run WebAssembly, which the CPU (wasm) device needs");
  if (!f.simd) throw new CapabilityError("this browser's WebAssembly has no SIMD, which llama.cpp's builds need");
  const missing = [!f.memory64 && "memory64", !f.exceptions && "wasm exceptions"].filter(Boolean);
  if (missing.length) return { build: "compat", why: `no ${missing.join(" or ")}: llama.cpp's compat build` };
  return {
    build: "default",
    why: f.jspi ? "memory64, wasm exceptions and JSPI" : "memory64 and wasm exceptions (no JSPI: the GGUF is read into memory)",
  };
}

/** A build's files as wllama takes them: the wasm's URL and, for the compat build, its glue's code. */
export interface LlamaFiles {
  wasm: string; // an object URL of the verified wasm: release() revokes it
  glue: string | null;
  release(): void;
}

/**
 * Fetch ``build``'s files from beside the runtime (``base``), verified against their recorded size
 * and sha256 (IntegrityError otherwise) and cached in ``store`` like the model's files, so a page that
 * goes offline after one visit still starts llama.cpp.
 */
export async function fetchLlamaBuild(build: LlamaBuild, base: string, store: FileStore): Promise<LlamaFiles> {
  const files = __LLAMA_BUILDS__[build];
  const names = Object.keys(files);
  const blobs = await fetchBlobs(base, { files }, names, { store, parallel: names.length, retries: 3, onProgress: () => {} });
  const wasmName = names.find((n) => n.endsWith(".wasm"))!;
  const glueName = names.find((n) => n.endsWith(".js"));
  // typed, so the glue instantiates it while it streams in
  const wasm = URL.createObjectURL(new Blob([blobs.get(wasmName)!], { type: "application/wasm" }));
  return { wasm, glue: glueName ? await blobs.get(glueName)!.text() : null, release: () => URL.revokeObjectURL(wasm) };
}
