// Runs ajv (JSON Schema 2020-12 with ajv-formats, as webruntime/src/schema-check.mjs sets it up for the
// browser tests; a schema whose $schema names 2019-09, draft-07 or draft-06 gets ajv's validator for that
// draft) under Node for tests/test_structured_exact.py and tests/test_schema_normalize.py.
// Input: {cases: {schema, texts}[]}. Output: {out: (boolean | null)[][]}: whether each text validates (each
// schema compiled once); null for a draft-04 schema, which ajv 8 does not read.
import { readFileSync } from "node:fs";
import Ajv from "ajv";
import Ajv2019 from "ajv/dist/2019";
import Ajv2020 from "ajv/dist/2020";
import addFormats from "ajv-formats";
import draft6 from "ajv/dist/refs/json-schema-draft-06.json";

const input = JSON.parse(readFileSync(0, "utf8")) as { cases: { schema: { $schema?: string }; texts: string[] }[] };
const ajv2020 = addFormats(new Ajv2020({ strict: false }));
const ajv2019 = addFormats(new Ajv2019({ strict: false }));
const ajv07 = addFormats(new Ajv({ strict: false }));
ajv07.addMetaSchema(draft6);
const out = input.cases.map((c) => {
  const draft = typeof c.schema === "object" && c.schema !== null ? c.schema.$schema ?? "" : "";
  if (draft.includes("draft-04")) return c.texts.map(() => null);
  const ajv = draft.includes("2019-09") ? ajv2019 : draft.includes("draft-07") || draft.includes("draft-06") ? ajv07 : ajv2020;
  const validate = ajv.compile(c.schema);
  return c.texts.map((t) => validate(JSON.parse(t)) as boolean);
});
process.stdout.write(JSON.stringify({ out }));
