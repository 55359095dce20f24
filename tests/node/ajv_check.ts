// Runs ajv (JSON Schema 2020-12, ajv-formats: webruntime/src/schema-check.mjs, as the browser tests
// use it) under Node for tests/test_structured_exact.py. Input: {cases: {schema, texts}[]}.
// Output: {out: boolean[][]}: whether each text validates.
import { readFileSync } from "node:fs";
import { checkJson } from "../../webruntime/src/schema-check.mjs";

const input = JSON.parse(readFileSync(0, "utf8")) as { cases: { schema: unknown; texts: string[] }[] };
const out = input.cases.map((c) => c.texts.map((t) => checkJson(c.schema, t) === null));
process.stdout.write(JSON.stringify({ out }));
