// Runs the browser engine's request validation (Engine.validate: webruntime/src/request_rules.ts, then the
// sampler's vocabulary check) under Node for tests/test_request_rules.py, which sends the same
// requests to `lantern serve` and compares the answers. No model is loaded: validate only reads the
// manifest's vocabulary size and generation defaults.
// Input (stdin): {vocab, requests: unknown[], chat_configs: unknown[], templates: (string | null)[],
// embedding_requests: unknown[]}.
// Output (stdout): {answers: ({error} | {resolved})[], stop_token_ids: number[][], knows_tools: boolean[],
// embedding_answers: ({error} | {resolved})[]} (an embeddings request under the table's rules alone).
import { readFileSync } from "node:fs";
import { Engine } from "../../webruntime/src/engine";
import type { ChatCompletionRequest } from "../../webruntime/src/protocol";
import { samplingParams } from "../../webruntime/src/sampler";
import { checkRequest, stopList, stopTokenIds, templateKnowsTools, templateMessages, tokenLimit, type CheckedRequest } from "../../webruntime/src/request_rules";

const input = JSON.parse(readFileSync(0, "utf8")) as {
  vocab: number; requests: unknown[]; chat_configs: unknown[]; templates: (string | null)[]; embedding_requests: unknown[];
};
// the engine's own validate, on an engine that is only a manifest
const validate = (Engine.prototype as unknown as { validate: (req: unknown) => CheckedRequest }).validate;
const engine = { manifest: { model: { vocab_size: input.vocab }, generation: {} } };

/** What the engine makes of a valid request: the fields it reads, with their defaults. */
function resolved(req: CheckedRequest) {
  const p = samplingParams(req, input.vocab, {});
  return {
    stream: req.stream, include_usage: req.stream_options.include_usage, n: req.n, logprobs: req.logprobs,
    parallel_tool_calls: req.parallel_tool_calls, token_limit: tokenLimit(req) ?? null, stops: stopList(req),
    stop_token_ids: req.stop_token_ids ?? [], template_messages: templateMessages(req.messages),
    sampling: { temperature: p.temperature, top_p: p.topP, top_k: p.topK, repetition_penalty: p.repetitionPenalty,
      frequency_penalty: p.frequencyPenalty, presence_penalty: p.presencePenalty, seed: p.seed, top_logprobs: p.topLogprobs,
      logit_bias: [...p.logitBias].sort(([a], [b]) => a - b) },
  };
}

const answers = input.requests.map((req) => {
  try {
    return { resolved: resolved(validate.call(engine, req as ChatCompletionRequest)) };
  } catch (err) {
    return { error: `${(err as Error).name}: ${(err as Error).message}` };
  }
});
process.stdout.write(JSON.stringify({
  answers,
  stop_token_ids: input.chat_configs.map((c) => [...stopTokenIds(c)].sort((a, b) => a - b)),
  knows_tools: input.templates.map(templateKnowsTools),
  embedding_answers: input.embedding_requests.map((req) => {
    try {
      return { resolved: checkRequest(req, "embeddings") };
    } catch (err) {
      return { error: `${(err as Error).name}: ${(err as Error).message}` };
    }
  }),
}));
