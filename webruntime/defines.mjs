// The JSON files the runtime inlines when it is bundled (esbuild's `define`): one description each,
// read by the Python side too. build.mjs and the tests' bundles (tests/test_structured.py) use this.
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";

const read = (path) => readFileSync(new URL(`../${path}`, import.meta.url), "utf8");

// llama.cpp in wasm, the `wasm` device's two builds (webruntime/src/llama-builds.ts): wllama's default
// build (memory64, wasm exceptions; its glue is inside wllama's JS) and its Asyncify build for engines
// without them (Safari's), with its own glue. The runtime serves each file beside itself under the name
// given here (build.mjs copies them) and checks every download against the size and sha256 below.
export const LLAMA_BUILDS = {
  default: { "wllama.wasm": "node_modules/@wllama/wllama/esm/wasm/wllama.wasm" },
  compat: {
    "wllama-compat.wasm": "node_modules/@wllama/wllama-compat/wasm/wllama.wasm",
    "wllama-compat.js": "node_modules/@wllama/wllama-compat/wasm/wllama.js",
  },
};
const fileEntry = (path) => {
  const bytes = readFileSync(new URL(path, import.meta.url));
  return { size: bytes.length, sha256: createHash("sha256").update(bytes).digest("hex") };
};
const llamaBuilds = Object.fromEntries(
  Object.entries(LLAMA_BUILDS).map(([build, files]) => [
    build,
    Object.fromEntries(Object.entries(files).map(([name, path]) => [name, fileEntry(path)])),
  ]),
);
export const defines = {
  // the schema keywords both engines accept (webruntime/src/structured.ts)
  __SCHEMA_SUPPORT__: read("compiler/contracts/schema_support.json"),
  // the Unicode general categories of \p{..} in patterns (webruntime/src/strings.ts)
  __UNICODE_CATEGORIES__: read("compiler/contracts/unicode_categories.json"),
  // the OpenAI request rules both runtimes apply (webruntime/src/request_rules.ts)
  __REQUEST_RULES__: read("compiler/contracts/request_rules.json"),
  // the runtime's version: the SharedWorker's name (webruntime/src/client.ts)
  // each llama.cpp build's files: {build: {name: {size, sha256}}}
  __LLAMA_BUILDS__: JSON.stringify(llamaBuilds),
  __LANTERN_VERSION__: JSON.stringify(JSON.parse(read("webruntime/package.json")).version),
};
