// Runs the wasm device's grammar translation (toLlamaGrammar in webruntime/src/gbnf.ts) under Node
// for tests/test_gbnf.py, which checks the GBNF against the xgrammar grammar it came from.
// Input (stdin): {cases: {text, root}[]}. Output: {out: ({grammar, triggers} | {error})[]}.
import { readFileSync } from "node:fs";
import { toLlamaGrammar } from "../../webruntime/src/gbnf";

const input = JSON.parse(readFileSync(0, "utf8")) as { cases: { text: string; root: string }[] };
const out = input.cases.map((c) => {
  try {
    return toLlamaGrammar(c.text, c.root);
  } catch (err) {
    return { error: `${(err as Error).name}: ${(err as Error).message}` };
  }
});
process.stdout.write(JSON.stringify({ out }));
