// The capability page: what WebGPU and WebAssembly offer here, where model files can be kept, and which
// route and device the router would take for each served model (the same device choice, llama.cpp build
// choice, library choice and memory check the runtime makes).
import {
  autoDevice,
  chooseLibrary,
  chooseLlamaBuild,
  deviceLabel,
  isSoftwareAdapter,
  wasmFeatures,
  wasmLabel,
  wasmThreads,
} from "/runtime/lantern.js";

const facts = document.querySelector("#facts tbody");
const limitsTable = document.querySelector("#limits tbody");

function row(table, name, value) {
  const tr = table.insertRow();
  tr.insertCell().textContent = name;
  tr.insertCell().textContent = value;
}

async function main() {
  const gpu = navigator.gpu;
  const adapter = gpu ? await gpu.requestAdapter().catch(() => null) : null;
  row(facts, "WebGPU", gpu ? (adapter ? "available" : "present, but no adapter") : "not available");
  const features = new Set(adapter ? [...adapter.features] : []);
  const info = adapter?.info ?? {};
  const emulated = isSoftwareAdapter({
    vendor: info.vendor,
    architecture: info.architecture,
    description: info.description,
    isFallbackAdapter: info.isFallbackAdapter ?? adapter?.isFallbackAdapter,
  });
  if (adapter) {
    row(facts, "adapter", `${info.vendor || "?"} ${info.architecture || ""} ${info.description || ""}`.trim());
    row(facts, "WebGPU device", deviceLabel({ vendor: info.vendor, architecture: info.architecture, fallback: emulated }));
    row(facts, "software adapter", emulated ? "yes (CPU-emulated WebGPU: no GPU found, so models answer slowly)" : "no");
    row(facts, "shader-f16", features.has("shader-f16") ? "yes" : "no (f16 models use their f32 library)");
    for (const key of [
      "maxBufferSize",
      "maxStorageBufferBindingSize",
      "maxComputeWorkgroupStorageSize",
      "maxComputeInvocationsPerWorkgroup",
      "maxStorageBuffersPerShaderStage",
    ]) {
      row(limitsTable, key, String(adapter.limits[key]));
    }
  }
  if (adapter) {
    row(facts, "subgroups", features.has("subgroups") ? "yes" : "no");
  }
  const wasm = wasmFeatures();
  const yes = (b) => (b ? "yes" : "no");
  row(facts, "WebAssembly", yes(wasm.webassembly));
  row(facts, "wasm SIMD", yes(wasm.simd));
  row(facts, "wasm memory64", yes(wasm.memory64));
  row(facts, "wasm exceptions", yes(wasm.exceptions));
  row(facts, "JSPI", yes(wasm.jspi));
  row(facts, "SharedArrayBuffer", yes(typeof SharedArrayBuffer === "function"));
  row(facts, "cross-origin isolated", yes(globalThis.crossOriginIsolated === true));
  let build = null;
  try {
    build = chooseLlamaBuild(wasm);
    row(facts, "llama.cpp build", `${build.build} (${build.why})`);
  } catch (err) {
    row(facts, "llama.cpp build", `none: ${err.message}`);
  }
  const threads = wasmThreads(undefined, wasm.threads);
  const cpu = build ? wasmLabel(threads, build.build) : "not available";
  row(facts, "CPU device", `${cpu}${wasm.threads ? "" : " (one thread: no SharedArrayBuffer in a cross-origin isolated page)"}`);
  row(facts, "device memory", navigator.deviceMemory ? `${navigator.deviceMemory} GiB (rounded)` : "not reported");
  row(facts, "storage backends", await storageBackends());
  const quota = await navigator.storage?.estimate?.().catch(() => null);
  row(
    facts,
    "storage quota",
    quota ? `${(quota.usage / 2 ** 20).toFixed(0)} MiB used of ${(quota.quota / 2 ** 20).toFixed(0)} MiB` : "not reported",
  );

  let models = [];
  try {
    models = (await (await fetch("/models/index.json")).json()).models;
  } catch {
    /* no index */
  }
  const verdicts = [];
  const gpuLabel = deviceLabel({ vendor: info.vendor, architecture: info.architecture, fallback: emulated });
  let slow = false;
  for (const m of models) {
    let route = "cloud";
    let where = "";
    let reason = "no WebGPU adapter";
    try {
      const manifest = await (await fetch(new URL("lantern.json", new URL(m.url, location.href)))).json();
      // the runtime's own choice for device "auto"
      const device = autoDevice(adapter ? { emulated } : null, Boolean(manifest.gguf?.files.length));
      if (device === "wasm" && !build) {
        reason = "no WebGPU adapter, and this browser cannot run llama.cpp's wasm builds";
      } else if (device === "wasm") {
        route = "local";
        where = cpu;
        reason = `${where}: ${manifest.gguf.files.length} GGUF part(s), ${(manifest.gguf.bytes / 2 ** 20).toFixed(0)} MiB`;
      } else if (device === "webgpu") {
        const lib = chooseLibrary(manifest, { features, emulated });
        const need = manifest.memory.estimated_gpu_bytes;
        const biggest = Math.min(adapter.limits.maxBufferSize, adapter.limits.maxStorageBufferBindingSize);
        if (navigator.deviceMemory && navigator.deviceMemory < 8 && need > navigator.deviceMemory * 2 ** 30) {
          reason = `needs ${(need / 2 ** 30).toFixed(2)} GiB, device reports ${navigator.deviceMemory} GiB`;
        } else {
          route = "local";
          where = gpuLabel;
          slow ||= emulated;
          reason = `${lib.file}${lib.param_upcast ? " (f16 weights upcast to f32)" : ""}, buffers up to ${(biggest / 2 ** 20).toFixed(0)} MiB`;
        }
      } else {
        reason = "no WebGPU adapter, and the artifact has no GGUF for the CPU";
      }
    } catch (err) {
      reason = `${err.name}: ${err.message}`;
    }
    row(facts, `route for ${m.name}`, `${route}: ${reason}`);
    verdicts.push(`${m.name} would run ${route === "local" ? `locally on ${where}` : "on the cloud"}`);
  }
  const note = slow ? " This adapter emulates a GPU on the CPU; the server (cloud route) answers faster." : "";
  document.getElementById("verdict").textContent =
    (verdicts.length
      ? `${verdicts.join("; ")}.`
      : adapter
        ? "WebGPU works here."
        : "No WebGPU here: models with a GGUF run on the CPU (wasm), others on the cloud.") + note;
  document.body.dataset.ready = "true";
}
/** Which of the runtime's storage backends work on this page (the runtime loads into memory without them). */
async function storageBackends() {
  const works = async (probe) => {
    try {
      return Boolean(await probe());
    } catch {
      return false;
    }
  };
  const found = [];
  if (
    await works(() =>
      caches
        .open("lantern-probe")
        .then(() => caches.delete("lantern-probe"))
        .then(() => true),
    )
  )
    found.push("Cache API");
  if (
    await works(
      () =>
        new Promise((ok, fail) => {
          const req = indexedDB.open("lantern-probe");
          req.onsuccess = () => {
            req.result.close();
            indexedDB.deleteDatabase("lantern-probe");
            ok(true);
          };
          req.onerror = () => fail(req.error);
        }),
    )
  )
    found.push("IndexedDB");
  if (await works(() => navigator.storage.getDirectory())) found.push("OPFS");
  return found.length ? found.join(", ") : "none (model files load into memory on every visit)";
}

main();
