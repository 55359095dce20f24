// Runs ajv (JSON Schema 2020-12 with ajv-formats, as webruntime/src/schema-check.mjs sets it up for the
// browser tests) under Node for tests/test_structured_exact.py. Input: {cases: {schema, texts}[]}.
// Output: {out: boolean[][]}: whether each text validates (each schema compiled once).
import { readFileSync } from "node:fs";
import Ajv2020 from "ajv/dist/2020";
import addFormats from "ajv-formats";

const input = JSON.parse(readFileSync(0, "utf8")) as { cases: { schema: object; texts: string[] }[] };
const ajv = addFormats(new Ajv2020({ strict: false }));
const out = input.cases.map((c) => {
  const validate = ajv.compile(c.schema);
  return c.texts.map((t) => validate(JSON.parse(t)) as boolean);
});
process.stdout.write(JSON.stringify({ out }));
