// Runs the browser's number-range grammars (webruntime/src/numbers.ts) under Node for
// tests/test_structured_exact.py, which compares them with the Python twin's, rule for rule.
// Input (stdin): {schemas: {kind, schema}[]}. Output: {out: ({placeholder, rules} | {error})[]}.
import { readFileSync } from "node:fs";
import { numberRules, placeholder } from "../../webruntime/src/numbers";

const input = JSON.parse(readFileSync(0, "utf8")) as { schemas: { kind: string; schema: Record<string, unknown> }[] };
const out = input.schemas.map(({ kind, schema }) => {
  const key = placeholder(kind, schema);
  try {
    return { placeholder: key, rules: numberRules(key, "n") };
  } catch (err) {
    return { placeholder: key, error: `${(err as Error).name}: ${(err as Error).message}` };
  }
});
process.stdout.write(JSON.stringify({ out }));
