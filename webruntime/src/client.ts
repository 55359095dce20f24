// The page side of an engine that runs in a Web Worker: same API as Engine, every call is a
// message (protocol.ts). Streamed chunks arrive as they are made, without acknowledgements.
import type { CreateOptions, PromptPlan } from "./engine";
import { deserializeError, WorkerCrashedError } from "./errors";
import { holdCache } from "./storage";
import { PushStream } from "./stream";
import type {
  ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, CreateChatCompletion, DebugOp, DebugResult, EngineOptions, EngineStats,
  WorkerRequest, WorkerResponse,
} from "./protocol";

interface Pending {
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
  onChunk?: (c: ChatCompletionChunk) => void;
}

type Outgoing = WorkerRequest extends infer R ? R extends { id: number } ? Omit<R, "id"> : never : never;

/** The engine's end of the line: a dedicated Worker, or this page's port of the SharedWorker. */
interface Channel {
  post(msg: WorkerRequest): void;
  close(): void;
}

declare const __LANTERN_VERSION__: string;

/** The SharedWorker's name: one per runtime version, so two versions of the runtime never share an engine. */
const SHARED_NAME = `lantern-engine-${__LANTERN_VERSION__}`;

export class WorkerEngine {
  readonly chat = {
    completions: {
      create: ((req: ChatCompletionRequest, opts?: CreateOptions) => this.create(req, opts)) as CreateChatCompletion<CreateOptions>,
    },
  };

  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private crashed: WorkerCrashedError | null = null;
  private channel!: Channel;
  /** Why this page asked for a shared engine and runs a dedicated one (stats().host.fallback). */
  fallback: string | undefined;

  private constructor(private readonly onProgress: EngineOptions["onProgress"]) {}

  /** An uncaught error in the worker leaves its engine in an unknown state: every call in flight
   * fails with WorkerCrashedError (a stream mid-way too, so the router continues it on the cloud),
   * the worker is stopped, and later calls fail at once. */
  private crash(err: WorkerCrashedError): void {
    if (this.crashed) return;
    this.crashed = err;
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
    this.channel.close();
  }

  /** The engine in a dedicated module worker of this page. */
  static async start(options: EngineOptions, workerUrl: URL): Promise<WorkerEngine> {
    const engine = new WorkerEngine(options.onProgress);
    const worker = new Worker(workerUrl, { type: "module" });
    engine.channel = { post: (msg) => worker.postMessage(msg), close: () => worker.terminate() };
    worker.onmessage = (ev: MessageEvent<WorkerResponse>) => engine.receive(ev.data);
    worker.onerror = (ev) => {
      ev.preventDefault();
      engine.crash(new WorkerCrashedError(`the engine worker crashed: ${ev.message || "an uncaught error"}`));
    };
    await engine.load(options);
    return engine;
  }

  /**
   * The engine in the origin's SharedWorker: a model another tab has loaded (or is loading) is used as
   * it is. While this page lives it holds a Web Lock named for it; the SharedWorker waits on that lock,
   * so a tab that closes, navigates or crashes is noticed, and its requests are cancelled.
   */
  static async startShared(options: EngineOptions, workerUrl: URL): Promise<WorkerEngine> {
    const engine = new WorkerEngine(options.onProgress);
    const tab = `lantern-tab-${crypto.randomUUID()}`;
    const release = await holdLock(tab);
    // extendedLifetime (Chromium): the worker outlives a navigation between two pages of the origin
    const worker = new SharedWorker(workerUrl, { type: "module", name: SHARED_NAME, extendedLifetime: true } as WorkerOptions);
    const port = worker.port;
    engine.channel = {
      post: (msg) => port.postMessage(msg),
      close: () => { port.close(); release(); },
    };
    port.onmessage = (ev: MessageEvent<WorkerResponse>) => engine.receive(ev.data);
    worker.onerror = (ev) => {  // the script itself failed to load or start
      ev.preventDefault();
      engine.crash(new WorkerCrashedError(`the shared engine worker failed to start: ${(ev as ErrorEvent).message || "an error"}`));
    };
    try {
      await engine.call({ kind: "hello", tab });
      await engine.load(options);
    } catch (err) {
      engine.channel.close();
      throw err;
    }
    return engine;
  }

  private async load(options: EngineOptions): Promise<void> {
    holdCache(options.cache);
    const { onProgress: _p, worker: _w, ...plain } = options;
    await this.call({ kind: "load", options: plain });
  }

  private receive(msg: WorkerResponse): void {
    if (msg.kind === "crash") {
      this.crash(new WorkerCrashedError(`the shared engine worker crashed: ${msg.message}`));
      return;
    }
    const p = this.pending.get(msg.id);
    if (msg.kind === "progress") {
      this.onProgress?.(msg.progress);
      return;
    }
    if (!p) return;
    if (msg.kind === "chunk") {
      p.onChunk?.(msg.chunk);
    } else if (msg.kind === "result") {
      this.pending.delete(msg.id);
      p.resolve(msg.value);
    } else {
      this.pending.delete(msg.id);
      p.reject(deserializeError(msg.error));
    }
  }

  private call(msg: Outgoing, onChunk?: (c: ChatCompletionChunk) => void): Promise<unknown> & { id: number } {
    const id = this.nextId++;
    const crashed = this.crashed;
    const promise = new Promise((resolve, reject) => {
      if (crashed) reject(crashed);
      else this.pending.set(id, { resolve, reject, onChunk });
    }) as Promise<unknown> & { id: number };
    promise.id = id;
    if (!crashed) this.channel.post({ ...msg, id } as WorkerRequest);
    return promise;
  }

  private async create(request: ChatCompletionRequest, opts: CreateOptions = {}):
    Promise<ChatCompletion | AsyncIterable<ChatCompletionChunk>> {
    const chunks = new PushStream<ChatCompletionChunk>();
    const call = this.call({ kind: "create", request }, request.stream ? (c) => chunks.push(c) : undefined);
    const onAbort = () => { if (!this.crashed) this.channel.post({ kind: "abort", id: this.nextId++, target: call.id }); };
    if (opts.signal?.aborted) onAbort();
    opts.signal?.addEventListener("abort", onAbort);
    const finished = call.finally(() => opts.signal?.removeEventListener("abort", onAbort));
    if (!request.stream) return (await finished) as ChatCompletion;
    finished.then(() => chunks.end(), (e) => chunks.fail(e));
    return chunks;
  }

  renderPrompt(request: ChatCompletionRequest): Promise<PromptPlan> {
    return this.call({ kind: "render", request }) as Promise<PromptPlan>;
  }

  debug(request: DebugOp): Promise<DebugResult> {
    return this.call({ kind: "debug", request }) as Promise<DebugResult>;
  }

  async debugLoseDevice(): Promise<void> {
    await this.call({ kind: "debug-lose-device" });
  }

  /** Make the worker throw an uncaught error (tests: a crash mid-stream). */
  async debugCrash(): Promise<void> {
    await this.call({ kind: "debug-crash" });
  }

  async interrupt(): Promise<void> {
    await this.call({ kind: "interrupt" });
  }

  async stats(): Promise<EngineStats> {
    const stats = await this.call({ kind: "stats" }) as EngineStats;
    if (this.fallback) stats.host.fallback = this.fallback;
    return stats;
  }

  /** Unload the model (shared: leave it; the SharedWorker unloads it after its last tab and a grace period). */
  async unload(): Promise<void> {
    await this.call({ kind: "unload" });
    this.channel.close();
  }
}

/** Hold the Web Lock ``name`` until the returned function is called or the page goes away. */
function holdLock(name: string): Promise<() => void> {
  if (!navigator.locks) return Promise.resolve(() => {});  // no lock: a closed tab is noticed only by its unload
  return new Promise((held) => {
    navigator.locks.request(name, () => new Promise<void>((release) => held(release)));
  });
}
