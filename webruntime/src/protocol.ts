// The OpenAI chat-completions shapes (the one TypeScript definition; Python has its own in
// lantern.protocol) and the message schema between the page and the engine's Web Worker.

// developer: OpenAI's, a system message to the chat template (request_rules.ts templateMessages)
export type Role = "system" | "developer" | "user" | "assistant" | "tool";

export interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string }; // arguments: a JSON text, as OpenAI sends it
}

export interface ChatMessage {
  role: Role;
  content: string | null;
  name?: string;
  tool_call_id?: string;
  tool_calls?: ToolCall[];
  reasoning_content?: string | null; // an earlier answer's reasoning, for templates that render it (Qwen3)
}

export interface Tool {
  type: "function";
  function: { name: string; description?: string; parameters?: Record<string, unknown>; strict?: boolean };
}

export type ToolChoice = "none" | "auto" | "required" | { type: "function"; function: { name: string } };

/** OpenAI's text/json_object/json_schema, WebLLM's json_object + schema, Lantern's grammar and regex. */
export type ResponseFormat =
  | { type: "text" }
  | { type: "json_object"; schema?: string | Record<string, unknown> }
  | {
      type: "json_schema";
      json_schema: { name: string; schema: Record<string, unknown> | boolean; strict?: boolean; description?: string };
    }
  | { type: "grammar"; grammar: string }
  | { type: "regex"; pattern: string };

export interface ChatCompletionRequest {
  messages: ChatMessage[];
  model?: string;
  stream?: boolean;
  stream_options?: { include_usage?: boolean };
  max_tokens?: number;
  max_completion_tokens?: number; // OpenAI's newer name for max_tokens; it wins when both are set
  temperature?: number;
  top_p?: number;
  top_k?: number;
  repetition_penalty?: number;
  frequency_penalty?: number;
  presence_penalty?: number;
  dry_multiplier?: number; // absent: schema_defaults.dryMultiplier under a JSON response_format, else 0
  dry_base?: number;
  dry_allowed_length?: number;
  dry_penalty_last_n?: number;
  logit_bias?: Record<string, number>;
  stop?: string | string[];
  stop_token_ids?: number[];
  seed?: number;
  logprobs?: boolean;
  top_logprobs?: number;
  n?: number;
  response_format?: ResponseFormat;
  tools?: Tool[];
  tool_choice?: ToolChoice;
  parallel_tool_calls?: boolean;
  // extra chat-template variables, as vLLM and llama.cpp's server take them (Qwen3's enable_thinking)
  chat_template_kwargs?: Record<string, unknown>;
  /** Lantern's bounds for a schema's unbounded strings and arrays (request_rules.json; 0: none). */
  schema_defaults?: { maxLength?: number; maxItems?: number; dryMultiplier?: number };
  /** Lantern's speculative decoding (request_rules.json): `lantern serve`'s llamacpp engine speculates;
   * the browser devices accept the field and do not yet. */
  speculation?: { mode?: "auto" | "off" | "grammar" | "lookup" | "draft"; max_tokens?: number };
}

/** `chat.completions.create` of the engine, the worker client and the router: a stream for `stream: true`. */
export interface CreateChatCompletion<Options> {
  (req: ChatCompletionRequest & { stream: true }, opts?: Options): Promise<AsyncIterable<ChatCompletionChunk>>;
  (req: ChatCompletionRequest & { stream?: false }, opts?: Options): Promise<ChatCompletion>;
  (req: ChatCompletionRequest, opts?: Options): Promise<ChatCompletion | AsyncIterable<ChatCompletionChunk>>;
}

/** The `chat` namespace that the engine, the worker client and the router expose, as OpenAI's client does:
 * `chat.completions.create` calls the class's own `create`, typed to answer a stream for `stream: true`. */
export function chatNamespace<Options>(
  create: (req: ChatCompletionRequest, opts?: Options) => Promise<ChatCompletion | AsyncIterable<ChatCompletionChunk>>,
): { completions: { create: CreateChatCompletion<Options> } } {
  return { completions: { create: create as CreateChatCompletion<Options> } };
}

/** `embeddings.create`'s request: OpenAI's shape (request_rules.json's `embeddings` endpoint). */
export interface EmbeddingRequest {
  input: string | string[] | number[] | number[][];
  model?: string;
  dimensions?: number;
  encoding_format?: "float" | "base64";
  /** Lantern's: cut a text longer than the model takes instead of refusing it (`lantern serve` only, for now). */
  truncate?: boolean;
}

/** The manifest's `embedding` record (compiler/pipeline.py, embedding_facts). */
export interface EmbeddingFacts {
  dimensions: number;
  pooling: string;
  normalize: boolean;
  max_tokens: number;
  prompts: Record<string, string>;
  // the tokens around a text (BERT's [CLS] and [SEP]); absent in artifacts built before the webgpu device embedded
  special_tokens?: { before: number[]; after: number[] };
}

/** What a loaded engine runs (Engine.model, WorkerEngine.model): the manifest's name and kind, and an
 * embedding model's facts (dimensions, pooling, normalize, max tokens, query and document prompts). */
export interface ModelInfo {
  name: string;
  kind: "chat" | "embedding";
  embedding: EmbeddingFacts | null;
}

export interface EmbeddingList {
  lantern_route?: Route;
  lantern_device?: DeviceName;
  object: "list";
  data: { object: "embedding"; index: number; embedding: number[] | string }[];
  model: string;
  usage: { prompt_tokens: number; total_tokens: number };
}

/** "timeout": from `lantern serve` only (through the router), a request past its `timeout` field. */
export type FinishReason = "stop" | "length" | "abort" | "tool_calls" | "timeout";

export interface TopLogprob {
  token: string;
  logprob: number;
  bytes: number[];
}

export interface TokenLogprob extends TopLogprob {
  top_logprobs: TopLogprob[];
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  // Lantern's timing extension
  ttft_ms: number;
  prefill_tokens_per_s: number;
  decode_tokens_per_s: number;
  tpot_ms: number;
  // prompt tokens whose KV entries were reused from the previous turn: Lantern's field, and OpenAI's
  cached_prompt_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
  // from `lantern serve`'s llamacpp engine, where it speculated (docs/server.md): Lantern's counts, OpenAI's totals
  speculation?: {
    grammar: { proposed: number; accepted: number };
    lookup: { proposed: number; accepted: number };
    draft: { proposed: number; accepted: number };
    forward_passes: number;
  };
  completion_tokens_details?: { accepted_prediction_tokens: number; rejected_prediction_tokens: number };
}

// Where a response was computed; the router sets it, `lantern serve` sends "cloud".
export type Route = "local" | "cloud";

// The browser device that computed a response (set by the engine on every response and chunk).
export type DeviceName = "webgpu" | "wasm";

// What the rewrite of a request's schemas ignored (unknown keywords, annotation formats, ...): on an answer
// and on a stream's first chunk, from both runtimes.
export interface ChatCompletion {
  lantern_route?: Route;
  lantern_device?: DeviceName;
  lantern_warnings?: string[];
  id: string;
  object: "chat.completion";
  created: number;
  model: string;
  choices: {
    index: number;
    // reasoning_content: a reasoning model's <think> block (reasoning.ts); null for other models
    message: { role: "assistant"; content: string | null; reasoning_content?: string | null; tool_calls?: ToolCall[] };
    finish_reason: FinishReason;
    logprobs: { content: TokenLogprob[] } | null;
  }[];
  usage: Usage;
}

export interface ChatCompletionChunk {
  lantern_route?: Route;
  lantern_device?: DeviceName;
  lantern_warnings?: string[];
  // completion tokens generated so far, and the raw text of this chunk before reasoning_content was
  // split off (the router continues a failed stream from here)
  lantern_completion_tokens?: number;
  lantern_text?: string;
  id: string;
  object: "chat.completion.chunk";
  created: number;
  model: string;
  choices: {
    index: number;
    delta: { role?: "assistant"; content?: string; reasoning_content?: string; tool_calls?: (ToolCall & { index: number })[] };
    finish_reason: FinishReason | null;
    logprobs: { content: TokenLogprob[] } | null;
  }[];
  usage?: Usage;
}

export type LoadPhase = "manifest" | "download" | "verify" | "gpu-upload" | "pipeline-compile" | "wasm-load" | "ready";

export interface LoadProgress {
  phase: LoadPhase;
  loadedBytes: number;
  totalBytes: number;
  file?: string;
  fromCache?: boolean;
  // once chosen: the model library this load fetches, and the device label (deviceLabel) it runs on
  library?: string;
  device?: string;
  // fraction of the whole load, 0..1
  progress: number;
}

export type CacheBackend = "cache-api" | "indexeddb" | "none";

/** Where this load keeps the model's files: the backend asked for, or "memory" when the browser could not
 * store them (no such storage, private browsing, the quota), with why. */
export interface StorageState {
  backend: CacheBackend | "memory";
  note: string | null;
}

export interface EngineOptions {
  model: string; // URL of an artifact folder (ends with "/")
  worker?: boolean; // default true
  cache?: CacheBackend; // default "cache-api"
  parallelDownloads?: number; // default 3
  retries?: number; // HTTP retries per file, default 3
  // "auto" (default): WebGPU on a real GPU, else the CPU (wasm) when the artifact has a GGUF
  device?: "auto" | DeviceName;
  // wasm device: llama.cpp threads (default, where SharedArrayBuffer is: navigator.hardwareConcurrency up to 4,
  // measured by threads.ts where more than 2 are claimed; without it, 1)
  threads?: number;
  // tokens of context (prompt + answer) to allocate; default: the model's on webgpu, at most 4096 on wasm
  contextWindow?: number;
  // one engine for every tab of the origin that loads the same model, in a SharedWorker (default: true
  // where SharedWorker exists); false: a dedicated worker for this page
  shared?: boolean;
  // shared: how long the model stays loaded after its last tab has gone (ms; default 20000), so a
  // navigation or a reload finds it loaded
  sharedGraceMs?: number;
  // wasm device: refuse to run on one thread where this context has no SharedArrayBuffer
  // (SharedEngineUnavailableError). createEngine sets it for a shared engine when the page itself could
  // give llama.cpp threads: Firefox's SharedWorker is not cross-origin isolated, a dedicated worker is.
  requireThreads?: boolean;
  onProgress?: (p: LoadProgress) => void;
}

/** Where an engine runs: in the page, in its own worker, in another tab's worker, or in the origin's SharedWorker. */
export interface EngineHost {
  // "tab": another tab's dedicated worker runs it, reached through the SharedWorker (client.ts, startAcrossTabs)
  kind: "page" | "dedicated" | "tab" | "shared";
  tabs: number; // the pages (engines) attached to this loaded model, this one included
  models: number; // models loaded in the worker that runs this one
  fallback?: string; // why a shared engine was asked for and a dedicated worker runs it
  handovers?: number; // across tabs: how often this page's engine moved to a new host tab's worker
}

/** What a worker loads an engine with: the engine options that cross a message. */
export type LoadOptions = Omit<EngineOptions, "onProgress" | "worker">;

/** The options under which pages share one loaded engine: a worker's model map and the host tab's Web Lock. */
export function engineKey(options: LoadOptions): string {
  return JSON.stringify([
    options.model,
    options.device ?? "auto",
    options.threads ?? null,
    options.contextWindow ?? null,
    options.cache ?? "cache-api",
    options.requireThreads ?? false,
  ]);
}

export interface EngineStats {
  device: DeviceName;
  deviceLabel: string; // "WebGPU (software adapter, slow)", "CPU (wasm, 2 threads)"
  kvSequences: number; // sequences alive in the KV cache
  kvAvailablePages: number | null; // paged KV cache (webgpu); null on wasm
  kvTotalPages: number | null;
  cachedTokens: number; // conversation tokens kept for reuse by the next turn
  queued: number;
  library: string; // the model library (webgpu) or GGUF (wasm) that runs
  peakGpuBytes: number | null; // null on wasm
  // the WebGPU adapter; on wasm {vendor: "cpu", architecture: "wasm (N threads)"}
  adapter: { vendor: string; architecture: string; features: string[]; fallback: boolean };
  requests: Record<string, number>; // terminal state -> count
  grammarCache: { entries: number; hits: number }; // compiled grammars kept, and requests that reused one
  storage: StorageState;
  // the wasm device: which llama.cpp build runs and why (llama-builds.ts), and its threads; null on webgpu
  // restarts: starts of llama.cpp's worker given up as hung (Firefox; see wasm.ts START_STALL_S);
  // "encoder": an embedding model's wasm library in workers of its own (cpu-encoder.ts), threads its workers
  wasm: { build: "default" | "compat" | "encoder"; why: string; threads: number; threadsWhy: string; restarts: number } | null;
  host: EngineHost;
}

export interface SerializedError {
  name: string;
  message: string;
  file?: string;
}

// Measurements `lantern validate` takes through the engine (raw tokens, no chat template).
export type DebugOp =
  // -> { tokens, prefillMs, decodeMs, decodeSteps }; text: the prompt as text, which the engine adds for a device
  // that tokenizes itself (wasm: llama.cpp through wllama, which takes no token ids)
  | { op: "greedy"; prompt: number[]; maxTokens: number; text?: string }
  | { op: "logits"; tokens: number[] } // -> { logits: number[] } at the last position
  | { op: "nll"; tokens: number[] }; // -> { nll: number[] } per next token

export interface DebugResult {
  tokens?: number[];
  logits?: number[];
  nll?: number[];
  prefillMs?: number;
  decodeMs?: number;
  decodeSteps?: number;
}

// page -> worker (a dedicated worker, one port of the SharedWorker, or a port to another tab's dedicated worker)
export type WorkerRequest =
  | { kind: "hello"; id: number; tab: string } // the Web Lock this page holds while it lives
  // across tabs (client.ts, startAcrossTabs), to the SharedWorker: this page's dedicated worker runs the engine
  // for `key`; send it the other tabs' ports ("connect")
  | { kind: "host"; id: number; key: string }
  // to the SharedWorker: a port to the worker that runs the engine for `key` ("port"), once a tab hosts it
  | { kind: "join"; id: number; key: string }
  // to this page's dedicated worker, with a port from another tab: serve that tab too
  | { kind: "attach"; id: number }
  | { kind: "load"; id: number; options: LoadOptions }
  | { kind: "create"; id: number; request: ChatCompletionRequest }
  | { kind: "embed"; id: number; request: EmbeddingRequest }
  | { kind: "abort"; id: number; target: number }
  | { kind: "interrupt"; id: number }
  | { kind: "stats"; id: number }
  | { kind: "render"; id: number; request: ChatCompletionRequest }
  | { kind: "debug-lose-device"; id: number }
  | { kind: "debug-crash"; id: number }
  | { kind: "debug"; id: number; request: DebugOp }
  | { kind: "unload"; id: number };

// worker -> page. Chunks are pushed as they are made: no acknowledgement per token.
export type WorkerResponse =
  | { kind: "progress"; id: number; progress: LoadProgress }
  | { kind: "chunk"; id: number; chunk: ChatCompletionChunk }
  | { kind: "result"; id: number; value: unknown }
  | { kind: "error"; id: number; error: SerializedError }
  | { kind: "crash"; id: number; message: string } // an uncaught error ended the worker (to every page it serves)
  // across tabs, from the SharedWorker: the answer to "join", with the port (ev.ports[0])
  | { kind: "port"; id: number }
  // to the host tab: another tab's port (ev.ports[0]) for its dedicated worker
  | { kind: "connect"; id: 0 }
  // to the tabs attached to a host that has gone (closed, navigated away, unloaded or crashed)
  | { kind: "host-gone"; id: 0 };
