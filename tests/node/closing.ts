// Runs the browser's closing policy (webruntime/src/closing.ts) under Node for tests/test_closing.py,
// which compares it with the Python twin's (lantern/server/closing.py).
// Input (stdin): {tokenizer: string (tokenizer.json), postproc, vocabSize, stopIds, cases: [{source (a json_schema spec), steps, maxTokens}]}.
// Output (stdout): {orders: [outside, inside], closed: ({kept, path} | null)[]}.
import { readFileSync } from "node:fs";
import { Closer } from "../../webruntime/src/closing";
import { GrammarCompiler, type TokenizerJson } from "../../webruntime/src/grammars";
import { TextCodec } from "../../webruntime/src/text";

const input = JSON.parse(readFileSync(0, "utf8")) as {
  tokenizer: string; postproc: string; vocabSize: number; stopIds: number[];
  cases: { source: string; steps: string[]; maxTokens: number }[];
};
const bytes = new TextEncoder().encode(input.tokenizer);
const codec = await TextCodec.create(bytes.buffer as ArrayBuffer, {});
const tokenizer = JSON.parse(input.tokenizer) as TokenizerJson;
const closer = Closer.forTokenizer(codec, tokenizer, input.vocabSize, input.stopIds);
const compiler = await GrammarCompiler.create(tokenizer, input.postproc, input.vocabSize, input.stopIds);
const closed = [];
for (const c of input.cases) {
  const mask = await compiler.matcher(await compiler.compile({ kind: "json_schema", source: c.source }));
  closed.push(await closer.close(mask.matcher, c.steps, c.maxTokens));
  mask.dispose();
}
process.stdout.write(JSON.stringify({ orders: closer.orders, closed }));
