// Bundles the runtime (src/index.ts) and the worker entries (../worker/worker.ts, shared.ts) into one ES
// module each under dist/, next to llama.cpp's wasm; `lantern serve` serves them under /runtime/.
import { copyFileSync, readFileSync } from "node:fs";
import * as esbuild from "esbuild";
import { defines, LLAMA_BUILDS } from "./defines.mjs";

const common = {
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  logLevel: "warning",
  // tvmjs and web-tokenizers probe for Node modules they never use in a browser
  external: ["fs", "path", "perf_hooks", "ws", "url", "crypto", "module"],
  // The schema keywords and the request rules: one file each, read by the Python server too.
  define: defines,
};
await esbuild.build({ ...common, entryPoints: ["src/index.ts"], outfile: "dist/lantern.js" });
await esbuild.build({ ...common, entryPoints: ["../worker/worker.ts"], outfile: "dist/worker.js" });
// The origin's SharedWorker: one engine per model for every tab (createEngine's `shared`).
await esbuild.build({ ...common, entryPoints: ["../worker/shared.ts"], outfile: "dist/shared-worker.js" });
// The wasm device's encoder workers (cpu-encoder.ts): TVM's web runtime and an embedding model's wasm library.
await esbuild.build({ ...common, entryPoints: ["../worker/encoder.ts"], outfile: "dist/encoder-worker.js" });
// The AI SDK provider (`@lantern-llm/webruntime/ai-sdk`): its own small module over the runtime, which
// it imports from ./lantern.js beside it, so the main bundle does not grow and the page loads one runtime.
const runtimeBeside = {
  name: "runtime-beside",
  setup(build) {
    build.onResolve({ filter: /^\.\/index$/ }, () => ({ path: "./lantern.js", external: true }));
  },
};
await esbuild.build({ ...common, entryPoints: ["src/ai-sdk.ts"], outfile: "dist/ai-sdk.js", plugins: [runtimeBeside] });
// Not part of the npm package: the structured-output compiler (structured.ts and what it imports) as one plain
// script for `lantern serve`, which runs it in V8 (lantern/server/schema_host.py), with web-xgrammar for the
// server's wasm build of xgrammar (lantern/server/xgrammar_wasm.py). src/v8-shims.js, first, stands in for what
// bare V8 lacks and web-xgrammar's loader or grammars.ts read (console, atob, location, performance).
const host = {
  format: "iife",
  platform: "neutral",
  entryPoints: ["src/schema-host.ts"],
  outfile: "dist/schema-host.js",
  mainFields: ["main"],
  banner: { js: readFileSync("src/v8-shims.js", "utf8") },
};
await esbuild.build({ ...common, ...host });
// Not part of the npm package: ajv for the site's JSON mode and the tests (/runtime/schema-check.js).
await esbuild.build({ ...common, entryPoints: ["src/schema-check.mjs"], outfile: "dist/schema-check.js" });
// Not part of the npm package: the `ai` package itself, for the site's embed page (/runtime/ai.js).
await esbuild.build({ ...common, entryPoints: ["src/vendor-ai.mjs"], outfile: "dist/ai.js", minify: true });
// llama.cpp in wasm for the `wasm` device, both builds; the runtime loads them from beside itself.
for (const files of Object.values(LLAMA_BUILDS)) {
  for (const [name, path] of Object.entries(files)) copyFileSync(path, `dist/${name}`);
}
