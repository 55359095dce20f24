// Runs the browser's reasoning split (webruntime/src/reasoning.ts) under Node for
// tests/test_reasoning.py, which compares it with the server's twin (lantern.server.reasoning).
// Input (stdin): {splits: {tags, inReasoning, pieces}[], kwargs: {kwargs, tags, strict}[], prompts: {prompt, tags}[]}.
// Output (stdout): {splits: [reasoning, content][][] (one pair per push, then finish), kwargs: (object | {error})[], prompts: boolean[]}.
import { readFileSync } from "node:fs";
import { opensInPrompt, ReasoningSplitter, templateKwargs } from "../../webruntime/src/reasoning";

interface SplitCase { tags: string[]; inReasoning: boolean; pieces: string[] }
interface KwargsCase { kwargs: unknown; tags: string[] | null; strict: boolean }
const input = JSON.parse(readFileSync(0, "utf8")) as {
  splits: SplitCase[]; kwargs: KwargsCase[]; prompts: { prompt: string; tags: string[] }[];
};
const splits = input.splits.map((c) => {
  const s = new ReasoningSplitter(c.tags, c.inReasoning);
  const out = c.pieces.map((p) => s.push(p));
  out.push(s.finish());
  return out.map((o) => [o.reasoning, o.content]);
});
const kwargs = input.kwargs.map((c) => {
  try {
    return templateKwargs(c.kwargs, c.tags, c.strict);
  } catch (err) {
    return { error: `${(err as Error).name}: ${(err as Error).message}` };
  }
});
const prompts = input.prompts.map((c) => opensInPrompt(c.prompt, c.tags));
process.stdout.write(JSON.stringify({ splits, kwargs, prompts }));
