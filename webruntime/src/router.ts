// The hybrid router: one chat.completions.create that runs on the local engine when the device
// can, and on any OpenAI-compatible endpoint otherwise, or when the local path fails. A stream
// that fails locally is continued on the cloud from the text already streamed. `embeddings.create` routes
// the same way, and never mixes two models' vectors: with a local model loaded, the cloud is used only
// when it names the same model.
import type { CreateOptions, PromptPlan } from "./engine";
import { LanternError, ModelMismatchError, NetworkError, WebGPUUnavailableError } from "./errors";
import { type CreateEngineOptions, createEngine, type LanternEngine } from "./create";
import { ReasoningSplitter } from "./reasoning";
import { tokenLimit } from "./request_rules";
import { callsTools } from "./structured";
import { chatNamespace } from "./protocol";
import type {
  ChatCompletion,
  ChatCompletionChunk,
  ChatCompletionRequest,
  EmbeddingList,
  EmbeddingRequest,
  FinishReason,
  ModelInfo,
  Route,
} from "./protocol";

export type Policy = "auto" | "local" | "cloud";

export interface CloudOptions {
  baseURL: string; // e.g. "https://api.example.com/v1"
  apiKey?: string;
  model: string;
}

export type RouterEvent =
  | { type: "route"; route: Route; reason: string }
  | { type: "fallback"; reason: string; error: string; midStream: boolean };

export interface RouterOptions {
  local: CreateEngineOptions;
  cloud: CloudOptions;
  policy?: Policy;
  // Task hook: return a route for this request (e.g. long prompts or tools to the cloud).
  choose?: (req: ChatCompletionRequest) => Route | undefined;
  // Give up on the local engine when it produces nothing for this long (ms); default 120000.
  localTimeoutMs?: number;
  onEvent?: (e: RouterEvent) => void;
}

export interface RouterCreateOptions extends CreateOptions {
  route?: Route;
}

/** An error from the cloud endpoint (HTTP status and OpenAI error body). */
export class CloudError extends LanternError {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(`cloud endpoint answered ${status}: ${message}`);
  }
}

class LocalTimeout extends LanternError {}

/**
 * The events of an OpenAI-style stream. A stream that breaks or closes before `data: [DONE]` (the
 * server died, the connection dropped) is a NetworkError, and an in-band `{"error": ...}` event a
 * CloudError (504 for a timeout): neither may pass for a complete answer.
 */
async function* sse(resp: Response, path: string): AsyncGenerator<unknown> {
  const reader = resp.body!.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  let events = 0;
  for (;;) {
    let piece: ReadableStreamReadResult<string>;
    try {
      piece = await reader.read();
    } catch (err) {
      if ((err as Error)?.name === "AbortError") throw err; // the caller's own abort
      throw new NetworkError(path, `the stream broke after ${events} events (${err})`);
    }
    if (piece.done) throw new NetworkError(path, `the stream closed before its end ([DONE]) after ${events} events`);
    buf += piece.value;
    let cut: number;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        const parsed = JSON.parse(data);
        if (parsed?.error)
          throw new CloudError(parsed.error.code === "timeout" ? 504 : 500, parsed.error.message ?? String(parsed.error));
        events++;
        yield parsed;
      }
    }
  }
}

/** Whether a request's output is grammar-constrained (a response_format or possible tool calls). */
function constrained(req: ChatCompletionRequest): boolean {
  return (req.response_format?.type ?? "text") !== "text" || callsTools(req);
}

class Cloud {
  constructor(private readonly opts: CloudOptions) {}

  async post(path: string, body: object, signal?: AbortSignal): Promise<Response> {
    let resp: Response;
    try {
      resp = await fetch(this.opts.baseURL.replace(/\/$/, "") + path, {
        method: "POST",
        signal,
        headers: {
          "content-type": "application/json",
          ...(this.opts.apiKey ? { authorization: `Bearer ${this.opts.apiKey}` } : {}),
        },
        body: JSON.stringify({ ...body, model: this.opts.model }),
      });
    } catch (err) {
      throw new NetworkError(path, String(err));
    }
    if (!resp.ok) {
      let message = resp.statusText;
      try {
        message = (await resp.json()).error?.message ?? message;
      } catch {
        /* keep the status text */
      }
      throw new CloudError(resp.status, message);
    }
    return resp;
  }

  async embed(req: EmbeddingRequest, signal?: AbortSignal): Promise<EmbeddingList> {
    const resp = await this.post("/embeddings", req, signal);
    return { ...(await resp.json()), lantern_route: "cloud" };
  }

  async chat(req: ChatCompletionRequest, signal?: AbortSignal): Promise<ChatCompletion> {
    const resp = await this.post("/chat/completions", { ...req, stream: false }, signal);
    return { ...(await resp.json()), lantern_route: "cloud" };
  }

  async *chatStream(req: ChatCompletionRequest, signal?: AbortSignal): AsyncGenerator<ChatCompletionChunk> {
    const resp = await this.post("/chat/completions", { ...req, stream: true }, signal);
    for await (const c of sse(resp, "/chat/completions")) yield { ...(c as ChatCompletionChunk), lantern_route: "cloud" };
  }

  /** Continue ``prompt`` (a rendered chat plus the text streamed so far) with the legacy endpoint. */
  async *continueText(
    prompt: string,
    req: ChatCompletionRequest,
    maxTokens: number | undefined,
    signal?: AbortSignal,
  ): AsyncGenerator<{ text: string; finish: FinishReason | null }> {
    const {
      messages: _m,
      stream_options: _s,
      logprobs: _l,
      top_logprobs: _t,
      chat_template_kwargs: _k,
      max_completion_tokens: _c,
      schema_defaults: _d,
      ...sampling
    } = req;
    const resp = await this.post("/completions", { ...sampling, prompt, max_tokens: maxTokens, stream: true }, signal);
    for await (const c of sse(resp, "/completions")) {
      const choice = (c as { choices: { text: string; finish_reason: FinishReason | null }[] }).choices[0];
      if (choice) yield { text: choice.text, finish: choice.finish_reason };
    }
  }
}

export class Router {
  readonly chat = chatNamespace<RouterCreateOptions>((req, opts) => this.create(req, opts));
  /** An embedding model's vectors, from the local engine or the cloud (the same model on both). */
  readonly embeddings = { create: (req: EmbeddingRequest, opts?: RouterCreateOptions) => this.embed(req, opts) };

  private readonly cloud: Cloud;
  /** Why the local engine is not used, or null when it is loaded. */
  localUnavailable: string | null = "not loaded";
  /** The local model once it has loaded (kept after a fallback drops the engine). */
  private localModel: ModelInfo | null = null;

  private constructor(
    private readonly opts: RouterOptions,
    public local: LanternEngine | null,
  ) {
    this.cloud = new Cloud(opts.cloud);
  }

  static async create(opts: RouterOptions): Promise<Router> {
    const router = new Router(opts, null);
    const policy = opts.policy ?? "auto";
    if (policy === "cloud") {
      router.localUnavailable = "policy is cloud";
      return router;
    }
    // The engine picks its device (WebGPU, or the CPU when the artifact has a GGUF) or says why none runs.
    try {
      router.local = await createEngine(opts.local);
      router.localUnavailable = null;
      router.localModel = router.local.model;
    } catch (err) {
      if (policy === "local") throw err;
      router.localUnavailable =
        err instanceof WebGPUUnavailableError
          ? `no-webgpu: ${err.message}`
          : `load-failed:${(err as Error).name}: ${(err as Error).message}`;
    }
    return router;
  }

  /** The local model (its name, kind and embedding facts), or null where it never loaded. */
  get model(): ModelInfo | null {
    return this.localModel;
  }

  private emit(e: RouterEvent): void {
    this.opts.onEvent?.(e);
  }

  private pick(req: ChatCompletionRequest, opts: RouterCreateOptions): { route: Route; reason: string } {
    if (opts.route) return { route: opts.route, reason: "request override" };
    const hook = this.opts.choose?.(req);
    if (hook) return { route: hook, reason: "choose hook" };
    if (this.local) return { route: "local", reason: "local engine ready" };
    return { route: "cloud", reason: this.localUnavailable ?? "local engine unavailable" };
  }

  private async create(
    req: ChatCompletionRequest,
    opts: RouterCreateOptions = {},
  ): Promise<ChatCompletion | AsyncIterable<ChatCompletionChunk>> {
    let { route, reason } = this.pick(req, opts);
    if (route === "local" && !this.local) {
      route = "cloud";
      reason = this.localUnavailable ?? "local engine unavailable";
    }
    this.emit({ type: "route", route, reason });
    if (route === "cloud") {
      return req.stream ? this.cloud.chatStream(req, opts.signal) : this.cloud.chat(req, opts.signal);
    }
    if (req.stream) return this.localStream(req, opts);
    try {
      const reply = await this.withTimeout(
        (signal) => this.local!.chat.completions.create({ ...req, stream: false }, { signal }),
        opts.signal,
      );
      return { ...reply, lantern_route: "local" };
    } catch (err) {
      if (!this.fallbackWorthy(err) || opts.signal?.aborted) throw err;
      this.fallback(err, false);
      return this.cloud.chat(req, opts.signal);
    }
  }

  private async embed(req: EmbeddingRequest, opts: RouterCreateOptions = {}): Promise<EmbeddingList> {
    opts.signal?.throwIfAborted();
    let route: Route = opts.route ?? "local";
    let reason = opts.route ? "request override" : "local engine ready";
    if (route === "local" && !this.local) {
      route = "cloud";
      reason = this.localUnavailable ?? "local engine unavailable";
    }
    this.emit({ type: "route", route, reason });
    if (route === "local") {
      try {
        const reply = await this.withTimeout((signal) => this.local!.embeddings.create(req, { signal }), opts.signal);
        return { ...reply, lantern_route: "local" };
      } catch (err) {
        if (!this.fallbackWorthy(err) || opts.signal?.aborted) throw err;
        this.sameModelOnCloud(`the local engine failed (${(err as Error)?.name}: ${(err as Error)?.message})`);
        this.fallback(err, false);
      }
    } else {
      this.sameModelOnCloud("the request goes to the cloud");
    }
    return this.cloud.embed(req, opts.signal);
  }

  /** Vectors of the cloud's model may join the local model's only where both are the same model. */
  private sameModelOnCloud(why: string): void {
    const cloud = this.opts.cloud.model;
    const local = this.localModel?.name;
    if (local !== undefined && local !== cloud) {
      throw new ModelMismatchError(
        `${why}, but the cloud model ${JSON.stringify(cloud)} is not the local model ${JSON.stringify(local)}: ` +
          "vectors of two models cannot share an index (serve the same artifact under that name and set cloud.model to it)",
      );
    }
  }

  /** Run ``work`` with an abort signal that fires on the caller's abort or on the local timeout. */
  private async withTimeout<T>(work: (signal: AbortSignal) => Promise<T>, outer?: AbortSignal): Promise<T> {
    outer?.throwIfAborted(); // a listener added now would never fire
    const ctrl = new AbortController();
    outer?.addEventListener("abort", () => ctrl.abort());
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        ctrl.abort();
        reject(new LocalTimeout(`the local engine took longer than ${this.opts.localTimeoutMs ?? 120000} ms`));
      }, this.opts.localTimeoutMs ?? 120000);
    });
    try {
      return await Promise.race([work(ctrl.signal), timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  private fallbackWorthy(err: unknown): boolean {
    const name = (err as Error)?.name;
    // Request errors would fail on the cloud too; everything about the device or engine falls back.
    return name !== "InvalidRequestError";
  }

  private fallback(err: unknown, midStream: boolean): void {
    const e = err as Error;
    this.emit({ type: "fallback", reason: e?.name ?? "Error", error: e?.message ?? String(err), midStream });
    if (["DeviceLostError", "OutOfMemoryError", "LocalTimeout", "WorkerCrashedError"].includes(e?.name)) {
      // The engine is not coming back on this page; later requests go straight to the cloud.
      this.localUnavailable = e.name;
      const engine = this.local;
      this.local = null;
      engine?.unload().catch(() => {});
    }
  }

  private localStream(req: ChatCompletionRequest, opts: RouterCreateOptions): AsyncIterable<ChatCompletionChunk> {
    const self = this;
    return {
      [Symbol.asyncIterator]: async function* () {
        opts.signal?.throwIfAborted(); // aborted before the first chunk was asked for: neither engine runs
        const local = self.local!;
        let text = ""; // the raw answer so far (reasoning and content)
        let tokens = 0;
        let last: ChatCompletionChunk | null = null;
        let plan: PromptPlan | null = null;
        const ctrl = new AbortController();
        opts.signal?.addEventListener("abort", () => ctrl.abort());
        const timeoutMs = self.opts.localTimeoutMs ?? 120000;
        // The prompt a cloud continuation needs, rendered now: a crashed worker cannot render it later.
        const planned = self.promptFor(req, local);
        planned.catch(() => {}); // read only on a fallback
        try {
          const stream = await local.chat.completions.create({ ...req, stream: true }, { signal: ctrl.signal });
          const it = stream[Symbol.asyncIterator]();
          for (;;) {
            let timer: ReturnType<typeof setTimeout> | undefined;
            const next = await Promise.race([
              it.next(),
              new Promise<never>((_, reject) => {
                timer = setTimeout(() => {
                  ctrl.abort();
                  reject(new LocalTimeout(`no token for ${timeoutMs} ms`));
                }, timeoutMs);
              }),
            ]).finally(() => clearTimeout(timer));
            if (next.done) return;
            const chunk = next.value;
            text += chunk.lantern_text ?? chunk.choices[0]?.delta.content ?? "";
            tokens = chunk.lantern_completion_tokens ?? tokens;
            last = chunk;
            yield { ...chunk, lantern_route: "local" as Route };
          }
        } catch (err) {
          if (!self.fallbackWorthy(err) || opts.signal?.aborted) throw err;
          // Continue on the cloud from what was already streamed: no duplicates, no gaps.
          plan = await planned;
          self.fallback(err, true);
        }
        if (constrained(req)) {
          yield* self.replayOnCloud(req, text, opts.signal);
          return;
        }
        const limit = tokenLimit(req);
        const budget = limit !== undefined ? Math.max(1, limit - tokens) : undefined;
        const base = last ?? {
          id: `chatcmpl-${crypto.randomUUID()}`,
          object: "chat.completion.chunk" as const,
          created: Math.floor(Date.now() / 1000),
          model: self.opts.cloud.model,
          choices: [],
        };
        // A reasoning answer splits on as the engine split it: the same rule over the whole raw text.
        const split = plan!.reasoning ? new ReasoningSplitter(plan!.reasoning.tags, plan!.reasoning.inReasoning) : null;
        split?.push(text); // what the engine already sent, or still held back
        for await (const piece of self.cloud.continueText(plan!.text + text, req, budget, opts.signal)) {
          let parts = split ? split.push(piece.text) : { reasoning: "", content: piece.text };
          if (split && piece.finish) {
            const rest = split.finish();
            parts = { reasoning: parts.reasoning + rest.reasoning, content: parts.content + rest.content };
          }
          yield {
            id: base.id,
            object: "chat.completion.chunk",
            created: base.created,
            model: base.model,
            choices: [
              {
                index: 0,
                delta: { content: parts.content, ...(parts.reasoning ? { reasoning_content: parts.reasoning } : {}) },
                finish_reason: piece.finish,
                logprobs: null,
              },
            ],
            lantern_route: "cloud",
          };
        }
      },
    };
  }

  /**
   * A grammar cannot be resumed through /v1/completions, so a constrained stream that failed
   * midway is answered whole by the cloud under the same constraint, and the text the caller
   * already has is skipped. Same artifact and seed give the same tokens; if the cloud's answer
   * starts differently, the stream fails rather than splice two answers.
   */
  private async *replayOnCloud(
    req: ChatCompletionRequest,
    streamed: string,
    signal?: AbortSignal,
  ): AsyncGenerator<ChatCompletionChunk> {
    let skip = streamed;
    for await (const chunk of this.cloud.chatStream(req, signal)) {
      const choice = chunk.choices[0];
      let content = choice?.delta.content ?? "";
      if (skip && content) {
        const n = Math.min(skip.length, content.length);
        if (content.slice(0, n) !== skip.slice(0, n)) {
          throw new LanternError(
            "the local engine failed mid-answer and the cloud's answer to this constrained " +
              "request starts differently; it cannot be continued without mixing two answers",
          );
        }
        skip = skip.slice(n);
        content = content.slice(n);
        choice.delta = { ...choice.delta, content };
      }
      yield { ...chunk, lantern_route: "cloud" };
    }
  }

  private async promptFor(req: ChatCompletionRequest, local: LanternEngine): Promise<PromptPlan> {
    try {
      return await local.renderPrompt(req);
    } catch (err) {
      throw new LanternError(`cannot continue on the cloud: the chat template could not be rendered (${err})`);
    }
  }
}

export function createRouter(opts: RouterOptions): Promise<Router> {
  return Router.create(opts);
}
