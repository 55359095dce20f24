// Runs the browser's structured-output code (webruntime/src/structured.ts) under Node for
// tests/test_structured.py, which compares every answer with the Python twin's.
// Input (stdin): {requests: ChatCompletionRequest[], schemas: unknown[]}.
// Output (stdout): {specs: ({spec} | {error})[], ebnf: string[], numbers: string[][], tight: (string | null)[], calls, limit} -- ebnf from
// web-xgrammar for each schema, numbers: its exact rules (numbers, strings, unique items), tight: each structural tag spec as it is compiled.
import { readFileSync } from "node:fs";
import "@mlc-ai/web-xgrammar";
import type * as XGrammar from "@mlc-ai/web-xgrammar";
import { GrammarCompiler, schemaEbnf, tightStructuralTag } from "../../webruntime/src/grammars";
import { checkSchema, parseToolCalls, requestSpec } from "../../webruntime/src/structured";
import type { ChatCompletionRequest } from "../../webruntime/src/protocol";

const xgr = (globalThis as unknown as { xgrammar: typeof XGrammar }).xgrammar;

const input = JSON.parse(readFileSync(0, "utf8")) as { requests: ChatCompletionRequest[]; schemas: unknown[]; texts: string[] };
const specs = input.requests.map((req) => {
  try {
    return { spec: requestSpec(req) };
  } catch (err) {
    return { error: `${(err as Error).name}: ${(err as Error).message}` };
  }
});
const ebnf: string[] = [];
const numbers: string[][] = [];
for (const schema of input.schemas) {
  const source = JSON.stringify(checkSchema(schema));
  ebnf.push(await xgr.Testings._jsonSchemaToEBNF(source, false, -1, [", ", ": "], true));
  numbers.push((await schemaEbnf(source)).split("\n").filter((line) => line.startsWith("lantern_")));
}
const tight: (string | null)[] = [];
for (const s of specs) {
  const spec = "spec" in s ? s.spec : null;
  tight.push(spec?.kind === "structural_tag" ? await tightStructuralTag(spec.source) : null);
}
const calls = input.texts.map((t) => {
  const { content, calls } = parseToolCalls(t);
  return { content, calls: calls.map((c) => c.function) };
});
// a compiled grammar is kept: the second compile of a spec is a hit
const vocab = Object.fromEntries([..."abcdefghij{}[]\":, 0123456789"].map((c, i) => [c, i]));
const compiler = await GrammarCompiler.create({ model: { vocab } }, "raw", 32, [31]);
const limit: string[] = [];
for (let k = 0; k < 2; k++) {
  try {
    await compiler.compile({ kind: "json_schema", source: '{"type": "string", "maxLength": 3}' });
    limit.push("compiled");
  } catch (err) {
    limit.push(`${(err as Error).name}: ${(err as Error).message}`);
  }
}
process.stdout.write(JSON.stringify({ specs, ebnf, numbers, tight, calls, limit, entries: compiler.entries, hits: compiler.hits }));
