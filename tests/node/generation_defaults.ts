// Runs the browser's sampling-field resolution (samplingParams in webruntime/src/sampler.ts) under
// Node for tests/test_generation_defaults.py, which compares it with the server's twin.
// Input (stdin): {vocab: number, cases: {request, defaults}[]}.
// Output (stdout): {fields: GENERATION_FIELDS,
//                  params: ({temperature, top_p, top_k, repetition_penalty, dry: [multiplier, base, allowed, last_n]} | {error})[]}.
import { readFileSync } from "node:fs";
import type { ChatCompletionRequest } from "../../webruntime/src/protocol";
import { GENERATION_FIELDS, samplingParams, type GenerationDefaults } from "../../webruntime/src/sampler";

interface Case { request: Partial<ChatCompletionRequest>; defaults: GenerationDefaults }
const input = JSON.parse(readFileSync(0, "utf8")) as { vocab: number; cases: Case[] };
const params = input.cases.map((c) => {
  try {
    const p = samplingParams({ messages: [], ...c.request } as ChatCompletionRequest, input.vocab, c.defaults);
    return { temperature: p.temperature, top_p: p.topP, top_k: p.topK, repetition_penalty: p.repetitionPenalty,
      dry: [p.dryMultiplier, p.dryBase, p.dryAllowedLength, p.dryPenaltyLastN] };
  } catch (err) {
    return { error: `${(err as Error).name}: ${(err as Error).message}` };
  }
});
process.stdout.write(JSON.stringify({ fields: GENERATION_FIELDS, params }));
