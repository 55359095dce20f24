// The browser's decision on each schema, for tests/test_structured.py, which compares it with the server's:
// input (stdin) {schemas: unknown[], defaults}; output (stdout) {out: ({source, warnings, size, ebnf} | {error})[]}:
// the spec's JSON (responseFormatSpec, as a json_schema response_format), what it ignored, the size the compile
// limit reads, and the grammar text (schemaEbnf), or the error that refused it.
import { readFileSync } from "node:fs";
import { schemaEbnf } from "../../webruntime/src/grammars";
import { grammarSize, responseFormatSpec, type SchemaDefaults } from "../../webruntime/src/structured";

console.log = (...args: unknown[]) => process.stderr.write(`${args.join(" ")}\n`);  // xgrammar's warnings: not on stdout
const input = JSON.parse(readFileSync(0, "utf8")) as { schemas: unknown[]; defaults: SchemaDefaults };
const out = [];
for (const schema of input.schemas) {
  try {
    const spec = responseFormatSpec({ type: "json_schema", json_schema: { name: "s", schema } } as never, input.defaults)!;
    let ebnf: string | null = null;  // null: xgrammar refuses the checked schema (the compile would fail)
    try {
      ebnf = await schemaEbnf(spec.source);
    } catch {
      // compared as a refusal on both sides
    }
    out.push({ source: spec.source, warnings: spec.warnings ?? [], size: grammarSize(JSON.parse(spec.source)), ebnf });
  } catch (err) {
    out.push({ error: `${(err as Error).name}: ${(err as Error).message}` });
  }
}
process.stdout.write(JSON.stringify({ out }));
