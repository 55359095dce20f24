// The Vercel AI SDK provider: `createLantern({ model, cloud? })(modelId)` is a LanguageModelV4 (the
// specification `ai` 7 calls) that runs on Lantern's router, so on the local engine when it can and on
// the cloud otherwise, with the router's failover. It translates the SDK's call options and prompt into
// one OpenAI-style request, and the router's answers and chunks back into the SDK's content and parts.
// For an embedding artifact, `.embeddingModel()` is an EmbeddingModelV4 (`embed`, `embedMany`).
//
// `ai` is a peer dependency of this entry point only. The SDK's error classes come from
// `@ai-sdk/provider` and are bundled in (a few kB); the SDK recognises them by marker symbols, not by
// identity, so `APICallError.isInstance` holds for the application's own copy of `ai`. The runtime
// itself comes from ./index, which the build keeps external (./lantern.js beside this file).
import {
  APICallError,
  InvalidPromptError,
  TooManyEmbeddingValuesForCallError,
  UnsupportedFunctionalityError,
  type EmbeddingModelV4,
  type EmbeddingModelV4CallOptions,
  type EmbeddingModelV4Result,
  type LanguageModelV4,
  type LanguageModelV4CallOptions,
  type LanguageModelV4Content,
  type LanguageModelV4FinishReason,
  type LanguageModelV4GenerateResult,
  type LanguageModelV4Prompt,
  type LanguageModelV4StreamPart,
  type LanguageModelV4StreamResult,
  type LanguageModelV4ToolResultOutput,
  type LanguageModelV4Usage,
  type SharedV4ProviderMetadata,
  type SharedV4Warning,
} from "@ai-sdk/provider";
import {
  createEngine,
  createRouter,
  type ChatCompletion,
  type ChatCompletionChunk,
  type ChatCompletionRequest,
  type ChatMessage,
  type CreateChatCompletion,
  type EmbeddingList,
  type EmbeddingRequest,
  type EngineOptions,
  type FinishReason,
  type LanternEngine,
  type Policy,
  type Route,
  type Router,
  type RouterEvent,
  type Tool,
  type Usage,
  MAX_EMBEDDING_INPUTS,
} from "./index";

/** The router, or the engine alone when there is no cloud: the same create (an engine ignores `route`). */
type Backend = {
  chat: { completions: { create: CreateChatCompletion<{ signal?: AbortSignal; route?: Route }> } };
  embeddings: { create(req: EmbeddingRequest, opts?: { signal?: AbortSignal; route?: Route }): Promise<EmbeddingList> };
};

export interface LanternProviderSettings {
  /** URL of the artifact folder (ends with "/"), as for createEngine. */
  model: string;
  /** Any OpenAI-compatible endpoint (`lantern serve`, vLLM, ...). Without it, every call runs locally. */
  cloud?: { baseURL: string; apiKey?: string; model?: string };
  /** "auto" (default): local when the engine loads, else the cloud. */
  policy?: Policy;
  /** The engine's other options (device, threads, contextWindow, shared, onProgress, ...). */
  engine?: Omit<EngineOptions, "model">;
  /** The router's hooks, as in createRouter. */
  choose?: (req: ChatCompletionRequest) => Route | undefined;
  localTimeoutMs?: number;
  onEvent?: (e: RouterEvent) => void;
  /** embedMany's batch: the texts per embeddings call (default and most: request_rules.json's 2048). */
  maxEmbeddingsPerCall?: number;
}

export interface LanternProvider {
  (modelId?: string): LanternLanguageModel;
  languageModel(modelId?: string): LanternLanguageModel;
  /** The artifact as an embedding model, for `embed` and `embedMany` (it must be an embedding model). */
  embeddingModel(modelId?: string): LanternEmbeddingModel;
  /** The name earlier `ai` majors call (deprecated there): the same model. */
  textEmbeddingModel(modelId?: string): LanternEmbeddingModel;
  /** The router (or, without a cloud, the engine) every model of this provider runs on; loads it once. */
  backend(): Promise<Router | LanternEngine>;
}

/** What a call may put under `providerOptions.lantern`: request fields the SDK has no setting for. */
const PASSED_THROUGH = ["logit_bias", "repetition_penalty", "schema_defaults", "stop_token_ids"] as const;

export function createLantern(settings: LanternProviderSettings): LanternProvider {
  let backend: Promise<Router | LanternEngine> | null = null;
  const load = () => {
    backend ??= settings.cloud
      ? createRouter({
          local: { ...settings.engine, model: settings.model },
          cloud: {
            baseURL: settings.cloud.baseURL,
            apiKey: settings.cloud.apiKey,
            model: settings.cloud.model ?? modelName(settings.model),
          },
          policy: settings.policy,
          choose: settings.choose,
          localTimeoutMs: settings.localTimeoutMs,
          onEvent: settings.onEvent,
        })
      : createEngine({ ...settings.engine, model: settings.model });
    return backend;
  };
  const make = (modelId?: string) => new LanternLanguageModel(modelId ?? modelName(settings.model), settings, load);
  const embedder = (modelId?: string) => new LanternEmbeddingModel(modelId ?? modelName(settings.model), settings, load);
  return Object.assign(make, { languageModel: make, embeddingModel: embedder, textEmbeddingModel: embedder, backend: load });
}

/** The artifact folder's last path segment ("/models/smollm2/" -> "smollm2"). */
function modelName(url: string): string {
  return url.replace(/\/+$/, "").split("/").pop() || "lantern";
}

export class LanternLanguageModel implements LanguageModelV4 {
  readonly specificationVersion = "v4" as const;
  readonly provider = "lantern";
  // Every URL is "supported": the SDK then passes file parts through instead of downloading them,
  // and toRequest refuses them by name (the model takes text only).
  readonly supportedUrls = { "*/*": [/.*/] };

  constructor(
    readonly modelId: string,
    private readonly settings: LanternProviderSettings,
    private readonly backend: () => Promise<Router | LanternEngine>,
  ) {}

  async doGenerate(options: LanguageModelV4CallOptions): Promise<LanguageModelV4GenerateResult> {
    const { request, warnings, route } = toRequest(options, this.modelId);
    const body = { ...request, stream: false as const };
    let reply: ChatCompletion;
    try {
      const backend = (await this.backend()) as Backend;
      reply = await backend.chat.completions.create(body, { signal: options.abortSignal, ...(route ? { route } : {}) });
    } catch (err) {
      throw this.sdkError(err, body);
    }
    const choice = reply.choices[0];
    const content: LanguageModelV4Content[] = [];
    if (choice?.message.reasoning_content) content.push({ type: "reasoning", text: choice.message.reasoning_content });
    if (choice?.message.content) content.push({ type: "text", text: choice.message.content });
    for (const call of choice?.message.tool_calls ?? []) {
      content.push({ type: "tool-call", toolCallId: call.id, toolName: call.function.name, input: call.function.arguments });
    }
    return {
      content,
      finishReason: finishReason(choice?.finish_reason),
      usage: usageOf(reply.usage),
      warnings: [...warnings, ...lanternWarnings(reply.lantern_warnings)],
      providerMetadata: metadata(reply.lantern_route, reply.lantern_device, reply.usage, reply.lantern_warnings),
      request: { body },
      response: { id: reply.id, modelId: reply.model, timestamp: new Date(reply.created * 1000), body: reply },
    };
  }

  async doStream(options: LanguageModelV4CallOptions): Promise<LanguageModelV4StreamResult> {
    const { request, warnings, route } = toRequest(options, this.modelId);
    const body = { ...request, stream: true as const, stream_options: { include_usage: true } };
    // The generation stops when the caller aborts, or when the SDK cancels the stream (its reader left).
    const ctrl = new AbortController();
    const outer = options.abortSignal;
    if (outer?.aborted) ctrl.abort(outer.reason);
    outer?.addEventListener("abort", () => ctrl.abort(outer.reason), { once: true });
    let chunks: AsyncIterator<ChatCompletionChunk>;
    let first: IteratorResult<ChatCompletionChunk>;
    try {
      const backend = (await this.backend()) as Backend;
      chunks = (await backend.chat.completions.create(body, { signal: ctrl.signal, ...(route ? { route } : {}) }))[
        Symbol.asyncIterator
      ]();
      first = await chunks.next(); // the first chunk carries the schema's warnings, for stream-start
    } catch (err) {
      throw this.sdkError(err, body);
    }
    const parts = new StreamParts(options.includeRawChunks ?? false);
    const sdkError = (err: unknown) => this.sdkError(err, body);
    const stream = new ReadableStream<LanguageModelV4StreamPart>({
      async start(controller) {
        const head = first.done ? undefined : first.value;
        controller.enqueue({ type: "stream-start", warnings: [...warnings, ...lanternWarnings(head?.lantern_warnings)] });
        if (head)
          controller.enqueue({
            type: "response-metadata",
            id: head.id,
            modelId: head.model,
            timestamp: new Date(head.created * 1000),
          });
        try {
          for (let next = first; !next.done; next = await chunks.next()) {
            for (const part of parts.push(next.value)) controller.enqueue(part);
          }
        } catch (err) {
          controller.error(ctrl.signal.aborted ? abortError(ctrl.signal) : sdkError(err));
          return;
        }
        // The engine ends an aborted request with finish_reason "abort"; the SDK expects the stream to fail.
        if (ctrl.signal.aborted) {
          controller.error(abortError(ctrl.signal));
          return;
        }
        for (const part of parts.end()) controller.enqueue(part);
        controller.close();
      },
      cancel(reason) {
        ctrl.abort(reason);
      },
    });
    return { stream, request: { body } };
  }

  private sdkError(err: unknown, body: ChatCompletionRequest): unknown {
    return sdkError(err, body, this.settings, "/chat/completions");
  }
}

/**
 * A Lantern error as the AI SDK's: an APICallError whose message keeps Lantern's class and text, with
 * the HTTP status the server would give (400 for a bad request, the cloud's own status), and the
 * original error as `cause`. The SDK's own errors and aborts pass unchanged. ``path``: the cloud's
 * endpoint the request would go to.
 */
function sdkError(err: unknown, body: object, settings: LanternProviderSettings, path: string): unknown {
  const e = err as Error & { status?: number };
  if (e?.name === "AbortError" || e?.name === "TimeoutError" || APICallError.isInstance(err)) return err;
  if (InvalidPromptError.isInstance(err) || UnsupportedFunctionalityError.isInstance(err)) return err;
  const name = e?.name ?? "Error";
  const status =
    name === "CloudError" ? e.status : ["InvalidRequestError", "ModelMismatchError"].includes(name) ? 400 : undefined;
  const onCloud = name === "CloudError" || (name === "NetworkError" && !!settings.cloud);
  const url = onCloud ? `${settings.cloud!.baseURL.replace(/\/$/, "")}${path}` : settings.model;
  return new APICallError({
    message: `${name}: ${e?.message ?? String(err)}`,
    url,
    requestBodyValues: body,
    statusCode: status,
    isRetryable: status !== undefined ? status === 408 || status === 429 || status >= 500 : name === "NetworkError",
    data: { error: { type: name, message: e?.message ?? String(err) } },
    cause: err,
  });
}

/**
 * An embedding artifact as the SDK's EmbeddingModelV4, on the same router (or engine) as the provider's
 * language model: `embedMany` cuts its values into calls of ``maxEmbeddingsPerCall``, one after another
 * (the engine answers one request at a time), and `abortSignal` stops the call.
 */
export class LanternEmbeddingModel implements EmbeddingModelV4 {
  readonly specificationVersion = "v4" as const;
  readonly provider = "lantern";
  readonly supportsParallelCalls = false;
  readonly maxEmbeddingsPerCall: number;

  constructor(
    readonly modelId: string,
    private readonly settings: LanternProviderSettings,
    private readonly backend: () => Promise<Router | LanternEngine>,
  ) {
    const most = settings.maxEmbeddingsPerCall ?? MAX_EMBEDDING_INPUTS;
    if (!(Number.isInteger(most) && most >= 1 && most <= MAX_EMBEDDING_INPUTS)) {
      throw new RangeError(`maxEmbeddingsPerCall must be an integer from 1 to ${MAX_EMBEDDING_INPUTS}, got ${most}`);
    }
    this.maxEmbeddingsPerCall = most;
  }

  async doEmbed(options: EmbeddingModelV4CallOptions): Promise<EmbeddingModelV4Result> {
    const { values, dimensions, abortSignal } = options;
    abortSignal?.throwIfAborted();
    if (values.length > this.maxEmbeddingsPerCall) {
      throw new TooManyEmbeddingValuesForCallError({
        provider: this.provider,
        modelId: this.modelId,
        maxEmbeddingsPerCall: this.maxEmbeddingsPerCall,
        values,
      });
    }
    const extra = (options.providerOptions?.lantern ?? {}) as Record<string, unknown>;
    const route = extra.route === "local" || extra.route === "cloud" ? extra.route : undefined;
    const body: EmbeddingRequest = { input: values, model: this.modelId, ...(dimensions !== undefined ? { dimensions } : {}) };
    let reply: EmbeddingList;
    try {
      const backend = (await this.backend()) as Backend;
      reply = await backend.embeddings.create(body, { signal: abortSignal, ...(route ? { route } : {}) });
    } catch (err) {
      throw abortSignal?.aborted ? abortError(abortSignal) : sdkError(err, body, this.settings, "/embeddings");
    }
    const warnings: SharedV4Warning[] = Object.values(options.headers ?? {}).some((v) => v !== undefined)
      ? [{ type: "unsupported", feature: "headers", details: "the router sends its own headers to the cloud" }]
      : [];
    return {
      embeddings: reply.data.map((d) => d.embedding as number[]),
      usage: { tokens: reply.usage.prompt_tokens },
      providerMetadata: metadata(reply.lantern_route, reply.lantern_device, undefined, undefined),
      response: { body: reply },
      warnings,
    };
  }
}

function abortError(signal: AbortSignal): unknown {
  return signal.reason instanceof Error ? signal.reason : new DOMException("the request was aborted", "AbortError");
}

/** OpenAI-style chunks -> the SDK's stream parts: reasoning, text and tool-input blocks, then finish. */
class StreamParts {
  private open: "reasoning" | "text" | null = null;
  private blocks = 0;
  private readonly calls: { id: string; name: string; args: string }[] = [];
  private finish: FinishReason | null = null;
  private usage: Usage | undefined;
  private route: Route | undefined;
  private device: ChatCompletionChunk["lantern_device"];
  private warnings: string[] | undefined;

  constructor(private readonly raw: boolean) {}

  push(chunk: ChatCompletionChunk): LanguageModelV4StreamPart[] {
    const out: LanguageModelV4StreamPart[] = this.raw ? [{ type: "raw", rawValue: chunk }] : [];
    this.route = chunk.lantern_route ?? this.route;
    this.device = chunk.lantern_device ?? this.device;
    this.warnings ??= chunk.lantern_warnings;
    if (chunk.usage) this.usage = chunk.usage;
    const choice = chunk.choices[0];
    if (!choice) return out;
    const { reasoning_content: reasoning, content, tool_calls: calls } = choice.delta;
    if (reasoning) out.push(...this.block("reasoning", reasoning));
    if (content) out.push(...this.block("text", content));
    for (const call of calls ?? []) {
      // OpenAI streams a call's arguments in pieces under its index; Lantern sends each call whole.
      let known = this.calls[call.index];
      if (!known) {
        out.push(...this.close());
        known = this.calls[call.index] = { id: call.id, name: call.function.name, args: "" };
        out.push({ type: "tool-input-start", id: known.id, toolName: known.name });
      }
      if (call.function.arguments) {
        known.args += call.function.arguments;
        out.push({ type: "tool-input-delta", id: known.id, delta: call.function.arguments });
      }
    }
    if (choice.finish_reason) this.finish = choice.finish_reason;
    return out;
  }

  end(): LanguageModelV4StreamPart[] {
    const out = this.close();
    for (const call of this.calls.filter(Boolean)) {
      out.push({ type: "tool-input-end", id: call.id });
      out.push({ type: "tool-call", toolCallId: call.id, toolName: call.name, input: call.args });
    }
    out.push({
      type: "finish",
      finishReason: finishReason(this.finish ?? undefined),
      usage: usageOf(this.usage),
      providerMetadata: metadata(this.route, this.device, this.usage, this.warnings),
    });
    return out;
  }

  private block(kind: "reasoning" | "text", delta: string): LanguageModelV4StreamPart[] {
    const out: LanguageModelV4StreamPart[] = [];
    if (this.open !== kind) {
      out.push(...this.close());
      this.open = kind;
      out.push({ type: `${kind}-start`, id: `${kind}-${this.blocks}` });
    }
    out.push({ type: `${kind}-delta`, id: `${kind}-${this.blocks}`, delta });
    return out;
  }

  private close(): LanguageModelV4StreamPart[] {
    if (!this.open) return [];
    const part: LanguageModelV4StreamPart = { type: `${this.open}-end`, id: `${this.open}-${this.blocks++}` };
    this.open = null;
    return [part];
  }
}

// ---- the call options and the prompt -> one OpenAI-style request ----------------------------------

function toRequest(
  options: LanguageModelV4CallOptions,
  modelId: string,
): { request: ChatCompletionRequest; warnings: SharedV4Warning[]; route?: Route } {
  const warnings: SharedV4Warning[] = [];
  const request: ChatCompletionRequest = { messages: toMessages(options.prompt, modelId) };
  const set = <K extends keyof ChatCompletionRequest>(key: K, value: ChatCompletionRequest[K] | undefined) => {
    if (value !== undefined) request[key] = value;
  };
  set("max_tokens", options.maxOutputTokens);
  set("temperature", options.temperature);
  set("top_p", options.topP);
  set("top_k", options.topK);
  set("presence_penalty", options.presencePenalty);
  set("frequency_penalty", options.frequencyPenalty);
  set("seed", options.seed);
  if (options.stopSequences?.length) request.stop = options.stopSequences;
  if (options.responseFormat?.type === "json") {
    const { schema, name, description } = options.responseFormat;
    request.response_format = schema
      ? {
          type: "json_schema",
          json_schema: {
            name: name ?? "response",
            schema: schema as Record<string, unknown>,
            strict: true,
            ...(description ? { description } : {}),
          },
        }
      : { type: "json_object" };
  }
  const tools: Tool[] = [];
  for (const t of options.tools ?? []) {
    if (t.type !== "function") {
      warnings.push({
        type: "unsupported",
        feature: `provider-defined tool ${t.name}`,
        details: "Lantern runs function tools only",
      });
      continue;
    }
    tools.push({
      type: "function",
      function: {
        name: t.name,
        ...(t.description ? { description: t.description } : {}),
        parameters: t.inputSchema as Record<string, unknown>,
        ...(t.strict !== undefined ? { strict: t.strict } : {}),
      },
    });
  }
  if (tools.length) {
    request.tools = tools;
    const choice = options.toolChoice;
    if (choice)
      request.tool_choice = choice.type === "tool" ? { type: "function", function: { name: choice.toolName } } : choice.type;
  }
  // Reasoning is on or off (Qwen3's enable_thinking); the template ignores it for other models.
  const extra = (options.providerOptions?.lantern ?? {}) as Record<string, unknown>;
  const reasoning = options.reasoning;
  const kwargs: Record<string, unknown> = { ...(extra.chat_template_kwargs as object | undefined) };
  if (reasoning && reasoning !== "provider-default") {
    kwargs.enable_thinking ??= reasoning !== "none";
    if (reasoning !== "none")
      warnings.push({ type: "unsupported", feature: `reasoning effort "${reasoning}"`, details: "thinking is only on or off" });
  }
  if (Object.keys(kwargs).length) request.chat_template_kwargs = kwargs;
  if (Object.values(options.headers ?? {}).some((v) => v !== undefined)) {
    warnings.push({ type: "unsupported", feature: "headers", details: "the router sends its own headers to the cloud" });
  }
  for (const key of PASSED_THROUGH)
    if (extra[key] !== undefined) (request as unknown as Record<string, unknown>)[key] = extra[key];
  const route = extra.route === "local" || extra.route === "cloud" ? extra.route : undefined;
  return { request, warnings, route };
}

function toMessages(prompt: LanguageModelV4Prompt, modelId: string): ChatMessage[] {
  const unsupported = (what: string) =>
    new UnsupportedFunctionalityError({
      functionality: what,
      message: `${what}: the Lantern model ${modelId} takes text only`,
    });
  const out: ChatMessage[] = [];
  for (const [i, message] of prompt.entries()) {
    switch (message.role) {
      case "system":
        out.push({ role: "system", content: message.content });
        break;
      case "user": {
        const texts = message.content.map((part) => {
          if (part.type === "text") return part.text;
          throw unsupported(`a file part (${part.mediaType}) in user message ${i}`);
        });
        out.push({ role: "user", content: texts.join("\n") });
        break;
      }
      case "assistant": {
        let text = "";
        let reasoning = "";
        const calls: NonNullable<ChatMessage["tool_calls"]> = [];
        for (const part of message.content) {
          if (part.type === "text") text += part.text;
          else if (part.type === "reasoning") reasoning += part.text;
          else if (part.type === "tool-call") {
            calls.push({
              id: part.toolCallId,
              type: "function",
              function: { name: part.toolName, arguments: JSON.stringify(part.input) },
            });
          } else if (part.type === "file" || part.type === "reasoning-file") {
            throw unsupported(`a ${part.type} part (${part.mediaType}) in assistant message ${i}`);
          }
          // provider-executed tool results and custom parts: nothing for the model's template
        }
        out.push({
          role: "assistant",
          content: text || (calls.length ? null : ""),
          ...(reasoning ? { reasoning_content: reasoning } : {}),
          ...(calls.length ? { tool_calls: calls } : {}),
        });
        break;
      }
      case "tool":
        for (const part of message.content) {
          if (part.type !== "tool-result") continue; // approvals are the SDK's business
          out.push({
            role: "tool",
            tool_call_id: part.toolCallId,
            name: part.toolName,
            content: toolOutput(part.output, i, unsupported),
          });
        }
        break;
    }
  }
  if (!out.length) throw new InvalidPromptError({ prompt, message: "the prompt has no messages" });
  return out;
}

function toolOutput(output: LanguageModelV4ToolResultOutput, i: number, unsupported: (what: string) => Error): string {
  switch (output.type) {
    case "text":
    case "error-text":
      return output.value;
    case "json":
    case "error-json":
      return JSON.stringify(output.value);
    case "execution-denied":
      return output.reason ?? "The tool call was denied.";
    case "content":
      return output.value
        .map((p) => {
          if (p.type === "text") return p.text;
          throw unsupported(`a ${p.type} part in the tool result of message ${i}`);
        })
        .join("\n");
  }
}

// ---- the router's answers -> the SDK's terms ---------------------------------------------------------

function finishReason(raw: FinishReason | null | undefined): LanguageModelV4FinishReason {
  const unified = raw === "stop" ? "stop" : raw === "length" ? "length" : raw === "tool_calls" ? "tool-calls" : "other";
  return { unified, raw: raw ?? undefined };
}

function usageOf(usage: Usage | undefined): LanguageModelV4Usage {
  const cached = usage?.prompt_tokens_details?.cached_tokens ?? usage?.cached_prompt_tokens;
  return {
    inputTokens: {
      total: usage?.prompt_tokens,
      noCache: usage && cached !== undefined ? usage.prompt_tokens - cached : undefined,
      cacheRead: cached,
      cacheWrite: undefined,
    },
    outputTokens: { total: usage?.completion_tokens, text: undefined, reasoning: undefined },
    ...(usage ? { raw: { ...usage } } : {}),
  };
}

function lanternWarnings(list: string[] | undefined): SharedV4Warning[] {
  return (list ?? []).map((message) => ({ type: "other", message }));
}

/** `providerMetadata.lantern`: where the answer was computed, and Lantern's timings when the route sends them. */
function metadata(
  route: Route | undefined,
  device: ChatCompletion["lantern_device"],
  usage: Usage | undefined,
  warnings: string[] | undefined,
): SharedV4ProviderMetadata {
  const lantern: Record<string, string | number | string[]> = { route: route ?? "local" };
  if (device) lantern.device = device;
  if (warnings?.length) lantern.warnings = warnings;
  const timings = {
    ttftMs: usage?.ttft_ms,
    prefillTokensPerSecond: usage?.prefill_tokens_per_s,
    decodeTokensPerSecond: usage?.decode_tokens_per_s,
  };
  for (const [key, value] of Object.entries(timings)) if (typeof value === "number") lantern[key] = value;
  return { lantern };
}
