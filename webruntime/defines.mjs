// The JSON files the runtime inlines when it is bundled (esbuild's `define`): one description each,
// read by the Python server too. build.mjs and the tests' bundles (tests/test_structured.py) use this.
import { readFileSync } from "node:fs";

const server = (name) => readFileSync(new URL(`../server/${name}`, import.meta.url), "utf8");
export const defines = {
  // the schema keywords both engines accept (webruntime/src/structured.ts)
  __SCHEMA_SUPPORT__: server("schema_support.json"),
  // the OpenAI request rules both runtimes apply (webruntime/src/rules.ts)
  __REQUEST_RULES__: server("request_rules.json"),
};
