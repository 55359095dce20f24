// Test page source for tests/test_ai_sdk_browser.py: the real `ai` package and zod, bundled by the test
// with esbuild (the runtime's provider stays external: /runtime/ai-sdk.js, as `lantern serve` serves it).
import { APICallError, cosineSimilarity, embed, embedMany, generateText, jsonSchema, Output, stepCountIs, streamText, tool, UnsupportedFunctionalityError } from "ai";
import { z } from "zod";
import { createLantern } from "/runtime/ai-sdk.js";

let provider = null;
const events = [];

// settings: createLantern's ({ model, cloud?, policy?, engine? }); resolves once the router or engine is up.
window.setup = async (settings) => {
  provider = createLantern({ ...settings, onEvent: (e) => events.push(e) });
  await provider.backend();
  return true;
};

// The same request through the runtime's own API, for comparison.
window.plain = async (request) => (await provider.backend()).chat.completions.create(request);

window.streamCase = async ({ prompt, maxOutputTokens, seed }) => {
  const result = streamText({ model: provider(), prompt, maxOutputTokens, temperature: 0, seed });
  const parts = [];
  for await (const part of result.fullStream) parts.push(part.type);
  return { parts, text: await result.text, usage: await result.usage, finishReason: await result.finishReason,
    metadata: (await result.providerMetadata)?.lantern ?? null, warnings: await result.warnings };
};

// A zod schema through Output.object: the SDK parses and validates the answer against it.
window.objectCase = async () => {
  const schema = z.object({ city: z.string().max(12), population: z.number().int().min(0).max(1000000), capital: z.boolean() });
  const result = await generateText({ model: provider(), prompt: "Describe a city as JSON.", maxOutputTokens: 96,
    temperature: 0, output: Output.object({ schema }), include: { requestBody: true } });
  return { output: result.output, text: result.text, valid: schema.safeParse(JSON.parse(result.text)).success,
    body: result.request.body, metadata: result.providerMetadata?.lantern ?? null };
};

// A tool loop: the first step must call the tool, which runs here; its result goes back and the
// second step (tools off) answers in text.
window.toolCase = async () => {
  const ran = [];
  const result = await generateText({
    model: provider(), prompt: "What is the weather in Paris?", maxOutputTokens: 160, temperature: 0,
    tools: { get_weather: tool({ description: "Current weather in a city", inputSchema: z.object({ city: z.string().max(12) }),
      execute: async ({ city }) => { ran.push(city); return { city, celsius: 21 }; } }) },
    toolChoice: "required", stopWhen: stepCountIs(2), include: { requestBody: true },
    prepareStep: ({ stepNumber }) => (stepNumber === 1 ? { toolChoice: "none" } : {}),
  });
  return { ran, steps: result.steps.map((s) => ({ finishReason: s.finishReason, toolCalls: s.toolCalls.map((c) => ({ name: c.toolName, input: c.input })),
    toolResults: s.toolResults.map((r) => r.output), text: s.text, messages: s.request.body.messages })) };
};

// Abort a stream after `after` text deltas; then the engine must answer the next request.
window.abortCase = async (after) => {
  const ctrl = new AbortController();
  let aborted = 0;
  const result = streamText({ model: provider(), prompt: "Tell me a long story.", maxOutputTokens: 200, temperature: 0,
    abortSignal: ctrl.signal, onAbort: () => { aborted++; } });
  const parts = [];
  let deltas = 0;
  for await (const part of result.fullStream) {
    parts.push(part.type);
    if (part.type === "text-delta" && ++deltas === after) ctrl.abort();
  }
  return { parts, aborted, deltas };
};

// An error as the application sees it: the SDK class (by its own isInstance) and the message.
window.errorCase = async (kind) => {
  const image = [{ role: "user", content: [{ type: "text", text: "What is this?" }, { type: "image", image: new URL("https://example.com/cat.png") }] }];
  const refused = { odd: tool({ inputSchema: jsonSchema({ type: "object", properties: { x: { type: "number", multipleOf: 0.1 } }, required: ["x"] }) }) };
  try {
    if (kind === "image") await generateText({ model: provider(), messages: image, maxOutputTokens: 4, maxRetries: 0 });
    else await generateText({ model: provider(), prompt: "Hi", tools: refused, toolChoice: "required", maxOutputTokens: 8, maxRetries: 0 });
    return null;
  } catch (e) {
    return { name: e.name, message: e.message, apiCall: APICallError.isInstance(e), unsupported: UnsupportedFunctionalityError.isInstance(e),
      status: e.statusCode ?? null, lantern: e.cause?.name ?? null, functionality: e.functionality ?? null };
  }
};

// A reasoning model's answer as the SDK's parts; `req` is an OpenAI-style request (one user message).
window.reasoningCase = async (req) => {
  const result = streamText({ model: provider(), prompt: req.messages[0].content, maxOutputTokens: req.max_tokens,
    temperature: req.temperature, seed: req.seed, providerOptions: { lantern: { logit_bias: req.logit_bias } } });
  let reasoning = "";
  let text = "";
  const parts = [];
  for await (const part of result.fullStream) {
    parts.push(part.type);
    if (part.type === "reasoning-delta") reasoning += part.text;
    if (part.type === "text-delta") text += part.text;
  }
  return { reasoning, text, parts, reasoningText: (await result.reasoningText) ?? "" };
};

// An embedding model through embedMany (cut into calls of the provider's maxEmbeddingsPerCall) and embed,
// then embedMany aborted before it starts, and embed of a chat model's provider (`chat`: its settings).
window.embedCase = async ({ values, chat }) => {
  const model = provider.embeddingModel();
  const many = await embedMany({ model, values, maxParallelCalls: 1 });
  const direct = await (await provider.backend()).embeddings.create({ input: values });
  const one = await embed({ model, value: values[1], providerOptions: { lantern: { route: "cloud" } } });
  const ctrl = new AbortController();
  ctrl.abort();
  const aborted = await embedMany({ model, values, abortSignal: ctrl.signal }).then(() => null, (e) => e.name);
  const wrong = await embed({ model: createLantern(chat).embeddingModel(), value: "hi", maxRetries: 0 }).then(
    () => null, (e) => ({ name: e.name, status: e.statusCode ?? null, message: e.message }));
  return { embeddings: many.embeddings, calls: many.responses.length, usage: many.usage, perCall: model.maxEmbeddingsPerCall,
    metadata: many.providerMetadata?.lantern ?? null, cloudCosine: cosineSimilarity(one.embedding, many.embeddings[1]),
    cloudRoute: one.providerMetadata?.lantern?.route ?? null, aborted, wrong, direct };
};

window.routerEvents = () => events;
window.stats = async () => {
  const backend = await provider.backend();
  return (backend.local ?? backend).stats ? await (backend.local ?? backend).stats() : null;
};
document.getElementById("status").textContent = "ready";
