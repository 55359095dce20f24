// The engine: loads an artifact on a device (webgpu or wasm), queues chat requests and runs each
// through an explicit lifecycle (queued -> prefill -> decode -> completed | cancelled | failed).
// The device generates tokens (devices.ts); the engine owns everything a request sees around them.
import { detectGpu, type Gpu } from "./device";
import type { Device, Generation } from "./devices";
import {
  ArtifactError,
  EngineNotLoadedError,
  InvalidRequestError,
  LanternError,
  OutOfMemoryError,
  WebGPUUnavailableError,
} from "./errors";
import { autoDevice } from "./library";
import { fetchFiles, fetchManifest, type Manifest } from "./loader";
import { chatNamespace } from "./protocol";
import type {
  ChatCompletion,
  ChatCompletionChunk,
  ChatCompletionRequest,
  DebugOp,
  DebugResult,
  DeviceName,
  EmbeddingList,
  EmbeddingRequest,
  ModelInfo,
  EngineOptions,
  EngineStats,
  FinishReason,
  LoadProgress,
  TokenLogprob,
  Usage,
} from "./protocol";
import { samplingParams } from "./sampler";
import { openStore, type FileStore } from "./storage";
import {
  checkRequest,
  message,
  stopList,
  stopTokenIds,
  templateMessages,
  tokenLimit,
  type CheckedRequest,
} from "./request_rules";
import { PushStream } from "./stream";
import { heldBack, opensInPrompt, ReasoningSplitter, templateKwargs } from "./reasoning";
import { Closer, closesCutAnswers, HOLD } from "./closing";
import { LazyGrammars } from "./grammars";
import { callsTools, parseToolCalls, requestSpec, TOOL_OPEN, toolMessages, type GrammarSpec } from "./structured";
import { StreamingDetokenizer, TextCodec, type TokenizerConfig } from "./text";
import { checkDimensions, embeddingInputs, embeddingList, embeddingTokens, finishVectors } from "./embeddings";
import { WasmDevice } from "./wasm";
import { CpuEncoderDevice, hasEncoderLibrary } from "./cpu-encoder";
import { WebGpuDevice } from "./webgpu";

export type RequestState = "queued" | "prefill" | "decode" | "completed" | "cancelled" | "failed";

const NEXT: Record<RequestState, RequestState[]> = {
  queued: ["prefill", "cancelled", "failed"],
  prefill: ["decode", "completed", "cancelled", "failed"],
  decode: ["completed", "cancelled", "failed"],
  completed: [],
  cancelled: [],
  failed: [],
};

class Job {
  state: RequestState = "queued";
  cancelled = false;
  readonly id = `chatcmpl-${crypto.randomUUID()}`;
  readonly created = Math.floor(Date.now() / 1000);

  constructor(
    readonly request: ChatCompletionRequest,
    readonly grammar: PreparedGrammar | null,
    readonly prompt: PromptPlan,
    readonly onEvent: (e: StepEvent) => void,
  ) {}

  move(to: RequestState): void {
    if (!NEXT[this.state].includes(to)) throw new Error(`internal: request went ${this.state} -> ${to}`);
    this.state = to;
  }
}

/** A request's grammar: its spec, and what the device made of it (device.prepare). */
interface PreparedGrammar {
  spec: GrammarSpec;
  prepared: unknown;
}

/** What the chat template makes of a request, and how its answer splits into reasoning and content. */
export interface PromptPlan {
  text: string;
  // a reasoning model's tags, and whether the prompt already opened the reasoning; null: no split
  reasoning: { tags: string[]; inReasoning: boolean } | null;
}

interface StepEvent {
  delta: string; // content
  reasoning: string; // reasoning_content ("" for models without reasoning)
  raw: string; // the generated text of this step, before the split
  tokens: number; // completion tokens so far
  logprobs: TokenLogprob[] | null;
  finish: FinishReason | null;
  usage?: Usage;
}

export interface CreateOptions {
  signal?: AbortSignal;
}

const DEVICES = ["auto", "webgpu", "wasm"];

/**
 * The device for ``want``: "webgpu" and "wasm" as named; "auto" as autoDevice says, and the CPU
 * (wasm) also when WebGPU fails to load with WebGPUUnavailableError or OutOfMemoryError (the model
 * does not fit the GPU) and the artifact has something the wasm device runs (a GGUF, an encoder's wasm library).
 */
async function openDevice(
  want: string,
  open: { webgpu: (gpu: Gpu) => Promise<Device>; wasm: () => Promise<Device> },
  hasGguf: boolean,
): Promise<Device> {
  if (!DEVICES.includes(want)) throw new InvalidRequestError(`device must be one of ${DEVICES.join(", ")}, got '${want}'`);
  if (want === "wasm") return open.wasm();
  if (want === "webgpu") return open.webgpu(await detectGpu());
  let gpu: Gpu | null = null;
  let why = "";
  try {
    gpu = await detectGpu();
  } catch (err) {
    if (!(err instanceof WebGPUUnavailableError) || !hasGguf) throw err;
    why = err.message;
  }
  if (autoDevice(gpu, hasGguf) === "webgpu") {
    try {
      return await open.webgpu(gpu!);
    } catch (err) {
      if (!(err instanceof WebGPUUnavailableError || err instanceof OutOfMemoryError) || !hasGguf) throw err;
      why = err.message;
    }
  } else if (gpu) {
    gpu.device.destroy();
    why = "the WebGPU adapter is a software one";
  }
  console.info(`lantern: running on the CPU (wasm): ${why}`);
  return open.wasm();
}

export class Engine {
  readonly chat = chatNamespace<CreateOptions>((req, opts) => this.create(req, opts));
  /** An embedding model's vectors, in OpenAI's shape (`embeddings.create`), on either device. */
  readonly embeddings = { create: (req: EmbeddingRequest, opts?: CreateOptions) => this.embed(req, opts) };

  private device: Device | null;
  private tail: Promise<void> = Promise.resolve();
  private queued = 0;
  private running: Job | null = null;
  private readonly counts: Record<string, number> = {};

  private closer: Closer | null = null;

  private constructor(
    device: Device,
    private readonly codec: TextCodec,
    readonly manifest: Manifest,
    private readonly stopTokenIds: Set<number>,
    private readonly grammars: LazyGrammars,
    private readonly store: FileStore,
  ) {
    this.device = device;
  }

  static async load(options: EngineOptions): Promise<Engine> {
    const report = options.onProgress ?? (() => {});
    const cw = options.contextWindow;
    if (cw !== undefined && !(Number.isInteger(cw) && cw > 0))
      throw new InvalidRequestError(`contextWindow must be a positive integer, got ${cw}`);
    const modelUrl = new URL(options.model, globalThis.location?.href).href.replace(/\/?$/, "/");
    const store: FileStore = openStore(options.cache ?? "cache-api");
    report({ phase: "manifest", loadedBytes: 0, totalBytes: 0, progress: 0 });
    const manifest = await fetchManifest(modelUrl, store);
    const config = ["tokenizer.json", "tokenizer_config.json", "mlc-chat-config.json"];
    const small = await fetchFiles(modelUrl, manifest, config, {
      store,
      parallel: 3,
      retries: options.retries ?? 3,
      onProgress: () => {},
    });
    const json = (name: string) => JSON.parse(new TextDecoder().decode(small.get(name)!));
    // the tokenizer starts while the device loads (the wasm device loads in llama.cpp's own worker)
    const codecReady = TextCodec.create(small.get("tokenizer.json")!, json("tokenizer_config.json") as TokenizerConfig);
    codecReady.catch(() => {}); // awaited below
    const chatConfig = json("mlc-chat-config.json");
    const stops = stopTokenIds(chatConfig);
    const embedding = manifest.model.kind === "embedding";
    if (!stops.size && !embedding) throw new ArtifactError("mlc-chat-config.json names no eos_token_id");
    const grammars = new LazyGrammars(
      small.get("tokenizer.json")!,
      chatConfig.tokenizer_info?.token_postproc_method ?? "raw",
      manifest.model.vocab_size,
      [...stops].sort((a, b) => a - b),
    );

    const device = await openDevice(
      options.device ?? "auto",
      {
        webgpu: async (gpu) =>
          WebGpuDevice.open({
            modelUrl,
            manifest,
            gpu,
            store,
            options,
            codec: await codecReady,
            grammars,
            stopTokenIds: stops,
            report,
          }),
        // an embedding model with a wasm library runs it (cpu-encoder.ts); anything else llama.cpp
        wasm: () =>
          hasEncoderLibrary(manifest)
            ? CpuEncoderDevice.open(modelUrl, manifest, store, options, report)
            : WasmDevice.open(modelUrl, manifest, store, options, report, chatConfig.model_config ?? {}),
      },
      Boolean(manifest.gguf?.files.length || hasEncoderLibrary(manifest)),
    );
    return new Engine(device, await codecReady, manifest, stops, grammars, store);
  }

  private loaded(): Device {
    if (!this.device) throw new EngineNotLoadedError("the engine was unloaded");
    return this.device;
  }

  /** The model this engine runs: its name, kind and (an embedding model's) facts. */
  get model(): ModelInfo {
    const { name, kind } = this.manifest.model;
    return { name, kind: kind ?? "chat", embedding: this.manifest.embedding ?? null };
  }

  /** The device this engine runs on: "webgpu" or "wasm". */
  get deviceKind(): DeviceName {
    return this.loaded().kind;
  }

  private async embed(request: EmbeddingRequest, opts: CreateOptions = {}): Promise<EmbeddingList> {
    opts.signal?.throwIfAborted();
    const device = this.loaded();
    const name = this.manifest.model.name;
    const facts = this.manifest.embedding;
    if (!facts || !device.embed) {
      throw new InvalidRequestError(`model ${name} is a chat model: it has no pooling for embeddings (load an embedding model)`);
    }
    const req = checkRequest(request, "embeddings") as unknown as EmbeddingRequest;
    const dimensions = checkDimensions(req.dimensions, facts, name);
    const inputs = embeddingInputs(req.input, this.manifest.model.vocab_size);
    const tokens = embeddingTokens(inputs, (text) => this.codec.encode(text), facts, name, req.truncate);
    const embed = device.embed.bind(device);
    // in turn with chat requests: one device, one request at a time
    const turn = this.tail.then(() => embed(tokens, opts.signal));
    this.tail = turn.then(
      () => {},
      () => {},
    );
    const vectors = await turn;
    const count = tokens.reduce((n, t) => n + t.length, 0);
    const list = embeddingList(finishVectors(vectors, dimensions, facts), req.encoding_format ?? "float", name, count);
    return { ...list, lantern_device: device.kind };
  }

  private async create(
    request: ChatCompletionRequest,
    opts: CreateOptions = {},
  ): Promise<ChatCompletion | AsyncIterable<ChatCompletionChunk>> {
    const device = this.loaded();
    if (this.manifest.embedding) {
      throw new InvalidRequestError(
        `model ${this.manifest.model.name} is an embedding model: it answers embeddings.create, not text`,
      );
    }
    const req = this.validate(request);
    // Bad schemas, grammars and template variables fail here, before the request is queued.
    const spec = requestSpec(req);
    const plan = this.plan(req, spec);
    const grammar = spec ? { spec, prepared: await device.prepare(spec) } : null;
    // what the schema's rewrite ignored (unknown keywords, ...), and a speculation field no device here
    // acts on: said on the console and on the answer, as the server says it
    const ignored = speculationIgnored(request, device.kind);
    const said = [...(spec?.warnings ?? []), ...(ignored ? [ignored] : [])];
    const warnings = said.length ? { lantern_warnings: said } : {};
    if (said.length) console.warn(`lantern: ${said.join("; ")}`);
    if (req.stream) return this.stream(req, grammar, plan, opts, warnings);
    let text = "";
    let reasoning = "";
    const logprobs: TokenLogprob[] = [];
    let finish: FinishReason = "stop";
    let usage: Usage | undefined;
    const job = await this.run(req, grammar, plan, opts, (e) => {
      text += e.delta;
      reasoning += e.reasoning;
      if (e.logprobs) logprobs.push(...e.logprobs);
      if (e.finish) finish = e.finish;
      if (e.usage) usage = e.usage;
    });
    const message: ChatCompletion["choices"][0]["message"] = {
      role: "assistant",
      content: text,
      ...(plan.reasoning ? { reasoning_content: reasoning } : {}),
    };
    if (callsTools(req)) {
      const { content, calls } = parseToolCalls(text);
      if (calls.length) {
        Object.assign(message, { content, tool_calls: calls });
        finish = "tool_calls";
      }
    }
    return {
      id: job.id,
      object: "chat.completion",
      created: job.created,
      model: this.manifest.model.name,
      lantern_device: device.kind,
      choices: [{ index: 0, message, finish_reason: finish, logprobs: req.logprobs ? { content: logprobs } : null }],
      usage: usage!,
      ...warnings,
    };
  }

  private stream(
    req: CheckedRequest,
    grammar: PreparedGrammar | null,
    plan: PromptPlan,
    opts: CreateOptions,
    warnings: { lantern_warnings?: string[] },
  ): AsyncIterable<ChatCompletionChunk> {
    const chunks = new PushStream<ChatCompletionChunk>();
    let first = true;
    const includeUsage = req.stream_options.include_usage;
    const kind = this.loaded().kind;
    let jobRef: Job | null = null;
    let sent = ""; // content streamed so far (tool calls are held back for the last chunk)
    const chunk = (job: Job, e: StepEvent): ChatCompletionChunk => {
      const delta: ChatCompletionChunk["choices"][0]["delta"] = first
        ? { role: "assistant", content: e.delta }
        : { content: e.delta };
      if (e.reasoning) delta.reasoning_content = e.reasoning;
      const opening = first ? warnings : {};
      first = false;
      let finish = e.finish;
      if (e.finish && callsTools(req)) {
        const { content, calls } = parseToolCalls(sent + e.delta);
        if (calls.length) {
          delta.content = (content ?? "").startsWith(sent) ? (content ?? "").slice(sent.length) : "";
          delta.tool_calls = calls.map((c, index) => ({ index, ...c }));
          finish = "tool_calls";
        }
      }
      sent += e.delta;
      const c: ChatCompletionChunk = {
        id: job.id,
        object: "chat.completion.chunk",
        created: job.created,
        model: this.manifest.model.name,
        lantern_device: kind,
        choices: [{ index: 0, delta, finish_reason: finish, logprobs: e.logprobs ? { content: e.logprobs } : null }],
        lantern_completion_tokens: e.tokens,
        ...(plan.reasoning ? { lantern_text: e.raw } : {}),
        ...opening,
      };
      if (e.usage && includeUsage) c.usage = e.usage;
      return c;
    };
    this.run(
      req,
      grammar,
      plan,
      opts,
      (e) => chunks.push(chunk(jobRef!, e)),
      (job) => {
        jobRef = job;
      },
    ).then(
      () => chunks.end(),
      (err) => chunks.fail(err instanceof Error ? err : new Error(String(err))),
    );
    return chunks;
  }

  /**
   * The request under compiler/contracts/request_rules.json (the server's rules too), nulls dropped and defaults
   * filled; then the checks that need the model (logit_bias within the vocabulary).
   */
  private validate(request: ChatCompletionRequest): CheckedRequest {
    const req = checkRequest(request, "chat");
    samplingParams(req, this.manifest.model.vocab_size, this.manifest.generation);
    return req;
  }

  /** Queue a request and run it when its turn comes; resolves when it reached a terminal state. */
  private run(
    req: ChatCompletionRequest,
    grammar: PreparedGrammar | null,
    plan: PromptPlan,
    opts: CreateOptions,
    onEvent: (e: StepEvent) => void,
    onJob: (job: Job) => void = () => {},
  ): Promise<Job> {
    const job = new Job(req, grammar, plan, onEvent);
    onJob(job);
    const abort = () => {
      job.cancelled = true;
    };
    opts.signal?.addEventListener("abort", abort);
    if (opts.signal?.aborted) abort();
    this.queued++;
    const turn = this.tail.then(async () => {
      this.queued--;
      try {
        await this.execute(job);
      } finally {
        opts.signal?.removeEventListener("abort", abort);
        this.counts[job.state] = (this.counts[job.state] ?? 0) + 1;
      }
      return job;
    });
    this.tail = turn.then(
      () => {},
      () => {},
    );
    return turn;
  }

  private async execute(job: Job): Promise<void> {
    const device = this.loaded();
    const req = job.request;
    const params = samplingParams(req, this.manifest.model.vocab_size, this.manifest.generation);
    const stops = stopList(req);
    // A tool call is not streamed as text: hold back from its opening tag (and a partial one).
    const holds = callsTools(req) ? [...stops, TOOL_OPEN] : stops;
    // a JSON answer cut by max_tokens is closed (closing.ts): its last HOLD tokens wait for the end
    const closable = job.grammar !== null && closesCutAnswers(req, callsTools(req));
    const steps: string[] = []; // with closable: each token's text
    let exact = true; // every step came with its token id (the wasm device's come without, unless asked)
    let held = 0; // with closable: the text's length before the tokens that may be rewound
    const started = performance.now();
    let promptTokens = 0;
    let completion = 0;
    let firstTokenAt = 0;
    let gen: Generation | null = null;
    const usage = (): Usage => {
      const decodeMs = performance.now() - firstTokenAt;
      const cachedTokens = gen?.cachedTokens ?? 0;
      const prefillMs = firstTokenAt - started;
      return {
        prompt_tokens: promptTokens,
        completion_tokens: completion,
        total_tokens: promptTokens + completion,
        ttft_ms: firstTokenAt ? prefillMs : 0,
        prefill_tokens_per_s: firstTokenAt ? (promptTokens - cachedTokens) / (prefillMs / 1000) : 0,
        decode_tokens_per_s: completion > 1 ? (completion - 1) / (decodeMs / 1000) : 0,
        tpot_ms: completion > 1 ? decodeMs / (completion - 1) : 0,
        cached_prompt_tokens: cachedTokens,
        prompt_tokens_details: { cached_tokens: cachedTokens },
      };
    };
    this.running = job;
    try {
      if (job.cancelled) {
        job.move("cancelled");
        job.onEvent({ delta: "", reasoning: "", raw: "", tokens: 0, logprobs: null, finish: "abort", usage: usage() });
        return;
      }
      job.move("prefill");
      const promptText = job.prompt.text;
      const split = job.prompt.reasoning
        ? new ReasoningSplitter(job.prompt.reasoning.tags, job.prompt.reasoning.inReasoning)
        : null;
      const emit = (
        raw: string,
        finish: FinishReason | null,
        logprobs: TokenLogprob[] | null,
        extra: Partial<StepEvent> = {},
      ) => {
        let parts = split ? split.push(raw) : { reasoning: "", content: raw };
        if (split && finish) {
          const rest = split.finish();
          parts = { reasoning: parts.reasoning + rest.reasoning, content: parts.content + rest.content };
        }
        job.onEvent({ delta: parts.content, reasoning: parts.reasoning, raw, tokens: completion, logprobs, finish, ...extra });
      };
      const prompt = this.codec.encode(promptText);
      promptTokens = prompt.length;
      const room = device.contextWindow - prompt.length;
      if (room < 1) {
        throw new InvalidRequestError(message("prompt_too_long", { tokens: prompt.length, window: device.contextWindow }));
      }
      const maxTokens = Math.min(tokenLimit(req) ?? room, room);
      gen = await device.start({
        prompt,
        promptText,
        params,
        grammar: job.grammar?.prepared ?? null,
        maxTokens,
        stopTokenIds: new Set([...this.stopTokenIds, ...(req.stop_token_ids ?? [])]),
      });

      let text = ""; // decoded so far (full characters only)
      let sent = 0; // chars of text already handed out
      let finish: FinishReason | null = null;
      let pendingLogprobs: TokenLogprob[] = [];
      for (;;) {
        if (job.cancelled) {
          finish = "abort";
          break;
        }
        const step = await gen.next();
        if (!firstTokenAt) firstTokenAt = performance.now();
        if (job.state === "prefill") job.move("decode");
        if (!step) {
          finish = "stop";
          break;
        }
        completion++;
        if (step.logprob) pendingLogprobs.push(step.logprob);
        text += step.text;
        if (closable) steps.push(step.text);
        exact &&= step.token >= 0;
        const hit = stops.map((st) => text.indexOf(st, Math.max(0, sent - st.length))).filter((i) => i >= 0);
        if (hit.length) {
          text = text.slice(0, Math.min(...hit));
          finish = "stop";
          break;
        }
        if (completion >= maxTokens) {
          finish = "length";
          const closed = closable ? await this.closeAnswer(job.grammar!.spec, steps, exact, maxTokens) : null;
          if (closed) ({ text, tokens: completion } = closed);
          break;
        }
        let safe = text.length - heldBack(text, holds);
        if (holds !== stops && text.includes(TOOL_OPEN)) safe = Math.min(safe, text.indexOf(TOOL_OPEN));
        if (closable) {
          if (completion <= maxTokens - HOLD) held = text.length;
          safe = Math.min(safe, held);
        }
        if (safe > sent) {
          emit(text.slice(sent, safe), null, pendingLogprobs.length ? pendingLogprobs : null);
          sent = safe;
          pendingLogprobs = [];
        }
      }
      await gen.close(finish === "abort" ? "abort" : "done");
      job.move(finish === "abort" ? "cancelled" : "completed");
      emit(text.slice(sent), finish, pendingLogprobs.length ? pendingLogprobs : null, { usage: usage() });
    } catch (err) {
      job.move("failed");
      await gen?.close("error").catch(() => {});
      throw err instanceof LanternError || err instanceof Error ? err : new Error(String(err));
    } finally {
      this.running = null;
    }
  }

  /** A cut JSON answer closed within maxTokens (closing.ts), or null where it cannot be. `steps`: each
   * generated token's text; `exact`: whether their boundaries are the model's own. */
  private async closeAnswer(
    spec: GrammarSpec,
    steps: string[],
    exact: boolean,
    maxTokens: number,
  ): Promise<{ text: string; tokens: number } | null> {
    if (!exact) {
      // Without ids a chunk's text comes with its last token: the answer is tokenized again, so that
      // it may be rewound token by token. What comes back is then at most maxTokens of these tokens.
      const detok = new StreamingDetokenizer(this.codec);
      steps = this.codec.encode(steps.join("")).map((id) => detok.push(id));
    }
    const compiler = await this.grammars.compiler();
    this.closer ??= Closer.forTokenizer(this.codec, this.grammars.tokenizer, this.grammars.vocabSize, this.grammars.stopIds);
    const mask = await compiler.matcher(await compiler.compile(spec));
    try {
      const closed = await this.closer.close(mask.matcher, steps, maxTokens);
      return (
        closed && {
          text: steps.slice(0, closed.kept).join("") + this.codec.decode(closed.path),
          tokens: closed.kept + closed.path.length,
        }
      );
    } catch (err) {
      // on the wasm device llama.cpp wrote the text under gbnf.ts's translation of this grammar: were
      // the two ever to differ, the answer comes back cut, as it would without closing
      console.warn(`lantern: the cut answer was not closed: ${err instanceof Error ? err.message : err}`);
      return null;
    } finally {
      mask.dispose();
    }
  }

  /**
   * The prompt text (tools go through the chat template when it knows them, else Lantern's format)
   * and the reasoning split. The twin of chat_completions in lantern.server.routes.
   */
  private plan(req: ChatCompletionRequest, spec: GrammarSpec | null): PromptPlan {
    const tools = callsTools(req) ? req.tools! : null;
    // a grammar that decides every token: no reasoning first (auto tool calls leave free text)
    const choice = req.tool_choice;
    const strict = spec !== null && !(tools && (choice === undefined || choice === null || choice === "auto"));
    const tags = this.manifest.model.reasoning_tags ?? null;
    const kwargs = templateKwargs(req.chat_template_kwargs, tags, strict);
    const messages = templateMessages(req.messages);
    const text =
      tools && this.codec.knowsTools
        ? this.codec.renderChat(messages, tools, kwargs)
        : this.codec.renderChat(toolMessages(messages, tools), null, kwargs);
    return { text, reasoning: tags && !strict ? { tags, inReasoning: opensInPrompt(text, tags) } : null };
  }

  /** The prompt and reasoning split of a plain (unconstrained) request: the router continues a failed stream from it. */
  renderPrompt(req: ChatCompletionRequest): PromptPlan {
    return this.plan(req, null);
  }

  private webgpu(what: string): WebGpuDevice {
    const device = this.loaded();
    if (!(device instanceof WebGpuDevice))
      throw new InvalidRequestError(`${what} needs the webgpu device; this engine runs on ${device.kind}`);
    return device;
  }

  /**
   * Measurements on raw token ids for `lantern validate`, queued like a request (the wasm device
   * measures greedy tokens only); they use the KV sequence afresh, so the cached conversation is dropped.
   */
  debug(req: DebugOp): Promise<DebugResult> {
    const device = this.loaded();
    const op = req.op === "greedy" && device.kind === "wasm" ? { ...req, text: this.codec.decode(req.prompt) } : req;
    const turn = this.tail.then(() => device.debug(op));
    this.tail = turn.then(
      () => {},
      () => {},
    );
    return turn;
  }

  /** Test hook: destroy the GPU device, as a driver reset would; the next step fails with DeviceLostError. */
  debugLoseDevice(): void {
    this.webgpu("debugLoseDevice").loseDevice();
  }

  /** Stop the running request at its next decode step (it finishes with finish_reason "abort"). */
  interrupt(): void {
    if (this.running) this.running.cancelled = true;
  }

  stats(): EngineStats {
    const device = this.loaded();
    return {
      device: device.kind,
      deviceLabel: device.label,
      library: device.library,
      queued: this.queued,
      requests: { ...this.counts },
      ...device.stats(),
      storage: this.store.state(),
      host: { kind: "page", tabs: 1, models: 1 },
    };
  }

  async unload(): Promise<void> {
    this.interrupt();
    await this.tail;
    await this.device?.dispose();
    this.device = null;
  }
}

export type { LoadProgress };

/**
 * The warning for a request whose ``speculation`` field asks for guesses (mode not off) on a device that
 * makes none; null where it did not ask. The twin of Generator.speculation_ignored in server/engine.py.
 */
export function speculationIgnored(request: ChatCompletionRequest, device: string): string | null {
  const mode = request.speculation?.mode ?? (request.speculation ? "auto" : "off");
  if (mode === "off") return null;
  return message("speculation_ignored", {
    why: `the ${device} device does not speculate yet (lantern serve's llamacpp engine does)`,
  });
}
