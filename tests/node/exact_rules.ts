// Runs the browser's exact grammars (webruntime/src/numbers.ts, strings.ts, unique.ts) under Node for
// tests/test_structured_exact.py, which compares them with the Python twins', rule for rule.
// Input (stdin): {cases: ({kind: "number" | "integer", schema} | {kind: "string", pattern, min, max}
// | {kind: "unique", items, min, max} | {kind: "classes", pattern})[]}. Output: {out: ({placeholder, rules}
// | {placeholder?, error} | {text})[]}: "classes" is strings.withClasses's pattern for RegExp.
import { readFileSync } from "node:fs";
import * as numbers from "../../webruntime/src/numbers";
import * as strings from "../../webruntime/src/strings";
import * as unique from "../../webruntime/src/unique";

interface Case { kind: string; schema?: Record<string, unknown>; pattern?: string | null; items?: unknown; min: number; max: number | null }

const input = JSON.parse(readFileSync(0, "utf8")) as { cases: Case[] };
const out = input.cases.map((c) => {
  let key: string | undefined;
  try {
    if (c.kind === "classes") return { text: strings.withClasses(c.pattern!) };
    if (c.kind === "string") {
      key = strings.placeholder(c.pattern ?? null, c.min, c.max);
      return { placeholder: key, rules: strings.stringRules(key, "s") };
    }
    if (c.kind === "unique") {
      key = unique.placeholder(unique.itemValues(c.items), c.min, c.max);
      return { placeholder: key, rules: unique.uniqueRules(key, "u") };
    }
    key = numbers.placeholder(c.kind, c.schema!);
    return { placeholder: key, rules: numbers.numberRules(key, "n") };
  } catch (err) {
    return { ...(key === undefined ? {} : { placeholder: key }), error: `${(err as Error).name}: ${(err as Error).message}` };
  }
});
process.stdout.write(JSON.stringify({ out }));
