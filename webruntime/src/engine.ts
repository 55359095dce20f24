// The engine: loads an artifact, queues chat requests and runs each through an explicit
// lifecycle (queued -> prefill -> decode -> completed | cancelled | failed) on the model.
import { checkFits, detectGpu } from "./device";
import { chooseLibrary, deviceLabel } from "./library";
import { ArtifactError, EngineNotLoadedError, InvalidRequestError, LanternError } from "./errors";
import { fetchFiles, fetchManifest, type Manifest } from "./loader";
import { largestTensorBytes, TvmModel, type TensorCacheIndex } from "./model";
import type {
  ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, CreateChatCompletion, DebugOp, DebugResult, EngineOptions, EngineStats,
  FinishReason, LoadProgress, TokenLogprob, Usage,
} from "./protocol";
import { samplingParams, Sampler, type Sampled } from "./sampler";
import { openStore } from "./storage";
import { PushStream } from "./stream";
import {
  callsTools, GrammarCompiler, parseToolCalls, requestSpec, TOOL_OPEN, toolMessages, type TokenizerJson, type TokenMask,
} from "./structured";
import { StreamingDetokenizer, TextCodec, type TokenizerConfig } from "./text";
import type { CompiledGrammar } from "@mlc-ai/web-xgrammar";

export type RequestState = "queued" | "prefill" | "decode" | "completed" | "cancelled" | "failed";

const NEXT: Record<RequestState, RequestState[]> = {
  queued: ["prefill", "cancelled", "failed"],
  prefill: ["decode", "completed", "cancelled", "failed"],
  decode: ["completed", "cancelled", "failed"],
  completed: [], cancelled: [], failed: [],
};

class Job {
  state: RequestState = "queued";
  cancelled = false;
  readonly id = `chatcmpl-${crypto.randomUUID()}`;
  readonly created = Math.floor(Date.now() / 1000);

  constructor(readonly request: ChatCompletionRequest, readonly grammar: CompiledGrammar | null,
              readonly onEvent: (e: StepEvent) => void) {}

  move(to: RequestState): void {
    if (!NEXT[this.state].includes(to)) throw new Error(`internal: request went ${this.state} -> ${to}`);
    this.state = to;
  }
}

interface StepEvent {
  delta: string;
  tokens: number;  // completion tokens so far
  logprobs: TokenLogprob[] | null;
  finish: FinishReason | null;
  usage?: Usage;
}

export interface CreateOptions { signal?: AbortSignal }

// The one sequence the engine keeps: the last finished conversation, for reuse by the next turn.
const SEQ = 0;

/** Characters at the end of ``text`` that could still grow into one of ``stops``. */
function heldBack(text: string, stops: string[]): number {
  let hold = 0;
  for (const s of stops) {
    for (let k = Math.min(s.length - 1, text.length); k > hold; k--) {
      if (text.endsWith(s.slice(0, k))) { hold = k; break; }
    }
  }
  return hold;
}

function commonPrefix(a: number[], b: number[]): number {
  let n = 0;
  while (n < a.length && n < b.length && a[n] === b[n]) n++;
  return n;
}

export class Engine {
  readonly chat = {
    completions: {
      create: ((req: ChatCompletionRequest, opts?: CreateOptions) => this.create(req, opts)) as CreateChatCompletion<CreateOptions>,
    },
  };

  private model: TvmModel | null;
  private tail: Promise<void> = Promise.resolve();
  private queued = 0;
  private running: Job | null = null;
  private kvTokens: number[] = [];
  private readonly counts: Record<string, number> = {};
  private grammars: Promise<GrammarCompiler> | null = null;
  private grammarsReady: GrammarCompiler | null = null;  // the same, once made (for stats)

  private constructor(model: TvmModel, private readonly codec: TextCodec, readonly manifest: Manifest,
                      private readonly stopTokenIds: Set<number>, private readonly library: string,
                      private readonly adapter: EngineStats["adapter"], private readonly tokenizerJson: ArrayBuffer,
                      private readonly tokenPostproc: string) {
    this.model = model;
  }

  static async load(options: EngineOptions): Promise<Engine> {
    let report = options.onProgress ?? (() => {});
    const modelUrl = new URL(options.model, globalThis.location?.href).href.replace(/\/?$/, "/");
    const store = openStore(options.cache ?? "cache-api");
    report({ phase: "manifest", loadedBytes: 0, totalBytes: 0, progress: 0 });
    const manifest = await fetchManifest(modelUrl, store);
    const gpu = await detectGpu();
    const lib = chooseLibrary(manifest, gpu);
    const adapter = { vendor: gpu.adapterInfo.vendor, architecture: gpu.adapterInfo.architecture,
      features: [...gpu.features].sort(), fallback: gpu.emulated };
    const tell = report;  // from here on, every report names the library and the device
    report = (p) => tell({ ...p, library: lib.file, device: deviceLabel(adapter) });

    const config = ["tensor-cache.json", "tokenizer.json", "tokenizer_config.json", "mlc-chat-config.json"];
    const small = await fetchFiles(modelUrl, manifest, config, { store, parallel: 4, retries: options.retries ?? 3, onProgress: () => {} });
    const json = (name: string) => JSON.parse(new TextDecoder().decode(small.get(name)!));
    const index: TensorCacheIndex = json("tensor-cache.json");
    const upcast = lib.param_upcast === "float16->float32";
    checkFits(manifest, largestTensorBytes(index, upcast), gpu.device);

    // Downloads are 90% of the bar; upload and pipeline compile share the rest.
    const shardNames = index.records.map((r) => r.dataPath);
    const files = await fetchFiles(modelUrl, manifest, [lib.file, ...shardNames], {
      store, parallel: options.parallelDownloads ?? 3, retries: options.retries ?? 3,
      onProgress: (p) => report({ ...p, progress: 0.9 * p.progress }),
    });
    const codec = await TextCodec.create(small.get("tokenizer.json")!, json("tokenizer_config.json") as TokenizerConfig);
    const chatConfig = json("mlc-chat-config.json");
    const total = manifest.weights.bytes;
    const model = await TvmModel.load(files.get(lib.file)!, gpu, index, files, {
      upcast,
      onUpload: (done, n) => report({ phase: "gpu-upload", loadedBytes: Math.round(total * done / n), totalBytes: total,
        progress: 0.9 + 0.05 * done / n }),
      onCompile: (done, n) => report({ phase: "pipeline-compile", loadedBytes: done, totalBytes: n,
        progress: 0.95 + 0.05 * done / n }),
    });
    const stops = new Set<number>([chatConfig.eos_token_id].flat().filter((x: unknown) => typeof x === "number"));
    for (const id of chatConfig.conv_template?.stop_token_ids ?? []) stops.add(id);
    if (!stops.size) throw new ArtifactError("mlc-chat-config.json names no eos_token_id");
    report({ phase: "ready", loadedBytes: total, totalBytes: total, progress: 1 });
    return new Engine(model, codec, manifest, stops, lib.file, adapter, small.get("tokenizer.json")!,
      chatConfig.tokenizer_info?.token_postproc_method ?? "raw");
  }

  private loaded(): TvmModel {
    if (!this.model) throw new EngineNotLoadedError("the engine was unloaded");
    return this.model;
  }

  /** The grammar compiler for this model's vocabulary, made on the first structured request. */
  private grammarCompiler(): Promise<GrammarCompiler> {
    this.grammars ??= GrammarCompiler.create(JSON.parse(new TextDecoder().decode(this.tokenizerJson)) as TokenizerJson,
      this.tokenPostproc, this.manifest.model.vocab_size, [...this.stopTokenIds])
      .then((g) => (this.grammarsReady = g));
    return this.grammars;
  }

  private async create(req: ChatCompletionRequest, opts: CreateOptions = {}):
    Promise<ChatCompletion | AsyncIterable<ChatCompletionChunk>> {
    this.loaded();
    this.validate(req);
    // Bad schemas and grammars fail here, before the request is queued.
    const spec = requestSpec(req);
    const grammar = spec ? await (await this.grammarCompiler()).compile(spec) : null;
    if (req.stream) return this.stream(req, grammar, opts);
    let text = "";
    const logprobs: TokenLogprob[] = [];
    let finish: FinishReason = "stop";
    let usage: Usage | undefined;
    const job = await this.run(req, grammar, opts, (e) => {
      text += e.delta;
      if (e.logprobs) logprobs.push(...e.logprobs);
      if (e.finish) finish = e.finish;
      if (e.usage) usage = e.usage;
    });
    const message: ChatCompletion["choices"][0]["message"] = { role: "assistant", content: text };
    if (callsTools(req)) {
      const { content, calls } = parseToolCalls(text);
      if (calls.length) {
        Object.assign(message, { content, tool_calls: calls });
        finish = "tool_calls";
      }
    }
    return {
      id: job.id, object: "chat.completion", created: job.created, model: this.manifest.model.name,
      choices: [{ index: 0, message, finish_reason: finish, logprobs: req.logprobs ? { content: logprobs } : null }],
      usage: usage!,
    };
  }

  private stream(req: ChatCompletionRequest, grammar: CompiledGrammar | null, opts: CreateOptions): AsyncIterable<ChatCompletionChunk> {
    const chunks = new PushStream<ChatCompletionChunk>();
    let first = true;
    const includeUsage = req.stream_options?.include_usage ?? true;
    let jobRef: Job | null = null;
    let sent = "";  // content streamed so far (tool calls are held back for the last chunk)
    const chunk = (job: Job, e: StepEvent): ChatCompletionChunk => {
      const delta: ChatCompletionChunk["choices"][0]["delta"] = first ? { role: "assistant", content: e.delta } : { content: e.delta };
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
        id: job.id, object: "chat.completion.chunk", created: job.created, model: this.manifest.model.name,
        choices: [{ index: 0, delta, finish_reason: finish, logprobs: e.logprobs ? { content: e.logprobs } : null }],
        lantern_completion_tokens: e.tokens,
      };
      if (e.usage && includeUsage) c.usage = e.usage;
      return c;
    };
    this.run(req, grammar, opts, (e) => chunks.push(chunk(jobRef!, e)), (job) => { jobRef = job; })
      .then(() => chunks.end(), (err) => chunks.fail(err instanceof Error ? err : new Error(String(err))));
    return chunks;
  }

  private validate(req: ChatCompletionRequest): void {
    if (!req || !Array.isArray(req.messages) || !req.messages.length) {
      throw new InvalidRequestError("messages must be a non-empty array");
    }
    for (const [i, m] of req.messages.entries()) {
      if (!["system", "user", "assistant", "tool"].includes(m?.role)) {
        throw new InvalidRequestError(`messages[${i}].role must be system, user, assistant or tool`);
      }
      if (typeof m.content !== "string" && !(m.role === "assistant" && (m.content === null || m.tool_calls?.length))) {
        throw new InvalidRequestError(`messages[${i}].content must be a string`);
      }
    }
    if (req.n !== undefined && req.n !== 1) throw new InvalidRequestError("only n=1 is supported");
    if (req.max_tokens !== undefined && (!Number.isInteger(req.max_tokens) || req.max_tokens < 1)) {
      throw new InvalidRequestError("max_tokens must be a positive integer");
    }
    const stop = req.stop;
    if (stop !== undefined && typeof stop !== "string" && !(Array.isArray(stop) && stop.every((s) => typeof s === "string" && s))) {
      throw new InvalidRequestError("stop must be a string or an array of non-empty strings");
    }
    samplingParams(req, this.manifest.model.vocab_size, this.manifest.generation);
  }

  /** Queue a request and run it when its turn comes; resolves when it reached a terminal state. */
  private run(req: ChatCompletionRequest, grammar: CompiledGrammar | null, opts: CreateOptions,
              onEvent: (e: StepEvent) => void, onJob: (job: Job) => void = () => {}): Promise<Job> {
    const job = new Job(req, grammar, onEvent);
    onJob(job);
    const abort = () => { job.cancelled = true; };
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
    this.tail = turn.then(() => {}, () => {});
    return turn;
  }

  private async execute(job: Job): Promise<void> {
    const model = this.loaded();
    const req = job.request;
    const params = samplingParams(req, this.manifest.model.vocab_size, this.manifest.generation);
    const sampler = new Sampler(params);
    const stops = typeof req.stop === "string" ? [req.stop] : req.stop ?? [];
    // A tool call is not streamed as text: hold back from its opening tag (and a partial one).
    const holds = callsTools(req) ? [...stops, TOOL_OPEN] : stops;
    let mask: TokenMask | null = null;
    const stopIds = new Set([...this.stopTokenIds, ...(req.stop_token_ids ?? [])]);
    const started = performance.now();
    let promptTokens = 0;
    let cachedTokens = 0;
    let completion = 0;
    let prefillMs = 0;
    let firstTokenAt = 0;
    const usage = (): Usage => {
      const decodeMs = performance.now() - firstTokenAt;
      return {
        prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion,
        ttft_ms: firstTokenAt ? firstTokenAt - started : 0,
        prefill_tokens_per_s: prefillMs ? (promptTokens - cachedTokens) / (prefillMs / 1000) : 0,
        decode_tokens_per_s: completion > 1 ? (completion - 1) / (decodeMs / 1000) : 0,
        tpot_ms: completion > 1 ? decodeMs / (completion - 1) : 0,
        cached_prompt_tokens: cachedTokens,
      };
    };
    this.running = job;
    try {
      if (job.cancelled) {
        job.move("cancelled");
        job.onEvent({ delta: "", tokens: 0, logprobs: null, finish: "abort", usage: usage() });
        return;
      }
      job.move("prefill");
      if (job.grammar) mask = await (await this.grammarCompiler()).matcher(job.grammar);
      const prompt = this.codec.encode(this.promptText(req));
      promptTokens = prompt.length;
      const room = model.contextWindow - prompt.length;
      if (room < 1) {
        throw new InvalidRequestError(`the prompt is ${prompt.length} tokens; the context window is ${model.contextWindow}`);
      }
      const maxTokens = Math.min(req.max_tokens ?? room, room);

      // Reuse the previous turn's KV entries for the shared prefix (at least one token is run).
      let reuse = Math.min(commonPrefix(this.kvTokens, prompt), prompt.length - 1);
      if (model.sequenceCount && reuse > 0) {
        model.popTokens(SEQ, this.kvTokens.length - reuse);
      } else {
        model.removeSequence(SEQ);
        model.addSequence(SEQ);
        reuse = 0;
      }
      this.kvTokens = prompt.slice(0, reuse);
      cachedTokens = reuse;
      const t0 = performance.now();
      let logits = await model.forward(SEQ, prompt.slice(reuse));
      this.kvTokens = prompt.slice();
      prefillMs = performance.now() - t0;

      const detok = new StreamingDetokenizer(this.codec);
      let text = "";  // decoded so far (full characters only)
      let sent = 0;  // chars of text already handed out
      let finish: FinishReason | null = null;
      let pendingLogprobs: TokenLogprob[] = [];
      for (;;) {
        if (job.cancelled) { finish = "abort"; break; }
        const s: Sampled = sampler.sample(logits, mask ? await mask.allowed() : undefined);
        if (!firstTokenAt) firstTokenAt = performance.now();
        if (job.state === "prefill") job.move("decode");
        if (stopIds.has(s.token)) { finish = "stop"; break; }
        completion++;
        sampler.accept(s.token);
        mask?.accept(s.token);
        if (params.topLogprobs >= 0) pendingLogprobs.push(this.logprobEntry(s));
        text += detok.push(s.token);
        const hit = stops.map((st) => text.indexOf(st, Math.max(0, sent - st.length))).filter((i) => i >= 0);
        if (hit.length) {
          text = text.slice(0, Math.min(...hit));
          finish = "stop";
          break;
        }
        if (completion >= maxTokens) { finish = "length"; break; }
        let safe = text.length - heldBack(text, holds);
        if (holds !== stops && text.includes(TOOL_OPEN)) safe = Math.min(safe, text.indexOf(TOOL_OPEN));
        if (safe > sent) {
          job.onEvent({ delta: text.slice(sent, safe), tokens: completion,
            logprobs: pendingLogprobs.length ? pendingLogprobs : null, finish: null });
          sent = safe;
          pendingLogprobs = [];
        }
        logits = await model.forward(SEQ, [s.token]);
        this.kvTokens.push(s.token);
      }
      if (finish === "abort") {
        job.move("cancelled");
        this.release();
      } else {
        job.move("completed");
      }
      job.onEvent({ delta: text.slice(sent), tokens: completion, logprobs: pendingLogprobs.length ? pendingLogprobs : null,
        finish, usage: usage() });
    } catch (err) {
      job.move("failed");
      this.release();
      throw err instanceof LanternError || err instanceof Error ? err : new Error(String(err));
    } finally {
      this.running = null;
      mask?.dispose();
    }
  }

  /** The prompt text: tools go through the chat template when it knows them, else Lantern's format. */
  private promptText(req: ChatCompletionRequest): string {
    const tools = callsTools(req) ? req.tools! : null;
    if (tools && this.codec.knowsTools) return this.codec.renderChat(req.messages, tools);
    return this.codec.renderChat(toolMessages(req.messages, tools));
  }

  /** Free the conversation's KV pages (after a cancelled or failed request). */
  private release(): void {
    this.model?.removeSequence(SEQ);
    this.kvTokens = [];
  }

  private logprobEntry(s: Sampled): TokenLogprob {
    const entry = (id: number, lp: number) => {
      const token = this.codec.decode([id]);
      return { token, logprob: lp, bytes: Array.from(new TextEncoder().encode(token)) };
    };
    return { ...entry(s.token, s.logprob), top_logprobs: s.top.map(([id, lp]) => entry(id, lp)) };
  }

  /** The prompt text the model's chat template makes of ``messages`` (the router continues from it). */
  renderPrompt(messages: ChatCompletionRequest["messages"]): string {
    return this.codec.renderChat(messages);
  }

  /**
   * Measurements on raw token ids for `lantern validate`, queued like a request; they use the
   * KV sequence afresh, so the cached conversation is dropped.
   */
  debug(req: DebugOp): Promise<DebugResult> {
    const turn = this.tail.then(async (): Promise<DebugResult> => {
      const model = this.loaded();
      this.release();
      model.addSequence(SEQ);
      try {
        if (req.op === "nll") return { nll: await model.tokenNll(SEQ, req.tokens) };
        if (req.op === "logits") return { logits: Array.from(await model.forward(SEQ, req.tokens)) };
        const out: number[] = [];
        const t0 = performance.now();
        let logits = await model.forward(SEQ, req.prompt);
        const t1 = performance.now();
        let steps = 0;
        while (out.length < req.maxTokens) {
          let best = 0;
          for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
          if (this.stopTokenIds.has(best)) break;
          out.push(best);
          if (out.length < req.maxTokens) {
            logits = await model.forward(SEQ, [best]);
            steps++;
          }
        }
        return { tokens: out, prefillMs: t1 - t0, decodeMs: performance.now() - t1, decodeSteps: steps };
      } finally {
        model.removeSequence(SEQ);
      }
    });
    this.tail = turn.then(() => {}, () => {});
    return turn;
  }

  /** Test hook: destroy the GPU device, as a driver reset would; the next step fails with DeviceLostError. */
  debugLoseDevice(): void {
    this.loaded().loseDevice("destroyed by debugLoseDevice()");
  }

  /** Stop the running request at its next decode step (it finishes with finish_reason "abort"). */
  interrupt(): void {
    if (this.running) this.running.cancelled = true;
  }

  stats(): EngineStats {
    const model = this.loaded();
    return {
      kvSequences: model.sequenceCount, kvAvailablePages: model.availablePages(), kvTotalPages: model.totalPages,
      cachedTokens: this.kvTokens.length, queued: this.queued, library: this.library,
      peakGpuBytes: model.peakGpuBytes, adapter: this.adapter, requests: { ...this.counts },
      grammarCache: { entries: this.grammarsReady?.entries ?? 0, hits: this.grammarsReady?.hits ?? 0 },
    };
  }

  async unload(): Promise<void> {
    this.interrupt();
    await this.tail;
    this.model?.dispose();
    this.model = null;
  }
}

export type { LoadProgress };
