// The JSON files the runtime inlines when it is bundled (esbuild's `define`): one description each,
// read by the Python side too. build.mjs and the tests' bundles (tests/test_structured.py) use this.
import { readFileSync } from "node:fs";

const read = (path) => readFileSync(new URL(`../${path}`, import.meta.url), "utf8");
export const defines = {
  // the schema keywords both engines accept (webruntime/src/structured.ts)
  __SCHEMA_SUPPORT__: read("server/schema_support.json"),
  // the Unicode general categories of \p{..} in patterns (webruntime/src/strings.ts)
  __UNICODE_CATEGORIES__: read("server/unicode_categories.json"),
  // the OpenAI request rules both runtimes apply (webruntime/src/rules.ts)
  __REQUEST_RULES__: read("compiler/request_rules.json"),
  // the runtime's version: the SharedWorker's name (webruntime/src/client.ts)
  __LANTERN_VERSION__: JSON.stringify(JSON.parse(read("webruntime/package.json")).version),
};
