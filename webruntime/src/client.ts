// The page side of an engine that runs in a Web Worker: same API as Engine, every call is a
// message (protocol.ts). Streamed chunks arrive as they are made, without acknowledgements.
import type { CreateOptions, PromptPlan } from "./engine";
import { deserializeError, EngineNotLoadedError, WorkerCrashedError } from "./errors";
import { holdCache } from "./storage";
import { PushStream } from "./stream";
import { chatNamespace } from "./protocol";
import type {
  ChatCompletion,
  ChatCompletionChunk,
  ChatCompletionRequest,
  EmbeddingList,
  EmbeddingRequest,
  DebugOp,
  DebugResult,
  EngineOptions,
  EngineStats,
  LoadOptions,
  ModelInfo,
  WorkerRequest,
  WorkerResponse,
} from "./protocol";

interface Pending {
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
  onChunk?: (c: ChatCompletionChunk) => void;
}

type Outgoing = WorkerRequest extends infer R ? (R extends { id: number } ? Omit<R, "id"> : never) : never;

/** The engine's end of the line: a dedicated Worker, this page's port of the SharedWorker, or a port to
 * another tab's dedicated worker (tabs.ts). */
export interface Channel {
  post(msg: WorkerRequest, transfer?: Transferable[]): void;
  close(): void;
}

declare const __LANTERN_VERSION__: string;

/** The SharedWorker's name: one per runtime version, so two versions of the runtime never share an engine. */
export const SHARED_NAME = `lantern-engine-${__LANTERN_VERSION__}`;

export class WorkerEngine {
  readonly chat = chatNamespace<CreateOptions>((req, opts) => this.create(req, opts));
  /** An embedding model's vectors (Engine.embeddings.create, in the worker). */
  readonly embeddings = { create: (req: EmbeddingRequest, opts?: CreateOptions) => this.embed(req, opts) };

  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private crashed: WorkerCrashedError | null = null;
  private channel: Channel | null = null;
  /** While the engine moves to another worker (link): messages wait for it, in order. */
  private gate: Promise<void> | null = null;
  /** Calls made while the engine moves (gate): posted on the line of the link that completes last. */
  private deferred: { msg: WorkerRequest; transfer?: Transferable[] }[] = [];
  private linked = 0;
  private readonly ends: (() => void)[] = [];
  /** The model the engine runs (Engine.model), known once it has loaded. */
  model: ModelInfo | null = null;
  /** Why this page asked for a shared engine and runs a dedicated one (stats().host.fallback). */
  fallback: string | undefined;
  /** Across tabs (tabs.ts): whose worker runs the engine now, and how often it has moved. */
  private across: { kind: "dedicated" | "tab"; handovers: number } | null = null;
  /** Whether the origin's SharedWorker runs this engine (startShared). */
  private shared = false;

  private constructor(private readonly onProgress: EngineOptions["onProgress"]) {}

  /** An engine with no worker yet: tabs.ts links it to one. */
  static unlinked(onProgress: EngineOptions["onProgress"]): WorkerEngine {
    return new WorkerEngine(onProgress);
  }

  /** An uncaught error in the worker leaves its engine in an unknown state: every call in flight
   * fails with WorkerCrashedError (a stream mid-way too, so the router continues it on the cloud),
   * the worker is stopped, and later calls fail at once. */
  private crash(err: WorkerCrashedError): void {
    if (this.crashed) return;
    this.crashed = err;
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
    this.deferred = [];
    this.end();
  }

  /** The engine is done with (unloaded, crashed, or its start failed): close its line and run what
   * onEnd left to do. */
  end(): void {
    this.channel?.close();
    this.channel = null;
    for (const fn of this.ends.splice(0)) fn();
  }

  /** Run ``fn`` when the engine ends (unload or crash). */
  onEnd(fn: () => void): void {
    this.ends.push(fn);
  }

  /** An uncaught error in the worker that runs this engine (tabs.ts: the worker of this tab). */
  workerFailed(message: string): void {
    this.crash(new WorkerCrashedError(`the engine worker crashed: ${message || "an uncaught error"}`));
  }

  /**
   * Talk to the engine through ``channel`` from now on: say hello as ``tab`` (so a worker that serves
   * several tabs notices this one leave), then load. Calls in flight on the old line fail with ``lost``
   * (its worker has gone; the router continues a stream on the cloud); calls made until the load ends
   * wait for it, and for a later link's, never failed by its ``lost`` (they were sent on no line: a
   * tab that follows a new host, then becomes the host itself, links twice in a row). Rejects where
   * ``channel`` or the load fails; a later link supersedes this one.
   * ``kind``: whose worker is at the other end (stats().host.kind: this tab's, or another's).
   */
  link(
    channel: Promise<Channel>,
    options: LoadOptions,
    tab: string,
    kind: "dedicated" | "tab",
    lost?: WorkerCrashedError,
  ): Promise<void> {
    if (lost) {
      const unsent = new Set(this.deferred.map((d) => d.msg.id));
      for (const [id, p] of this.pending) {
        if (unsent.has(id)) continue;
        p.reject(lost);
        this.pending.delete(id);
      }
    }
    this.channel?.close();
    this.channel = null;
    const turn = ++this.linked;
    const superseded = () => turn !== this.linked || this.crashed !== null;
    const gate = (async () => {
      try {
        const line = await channel;
        if (superseded()) {
          line.close();
          return;
        }
        this.channel = line;
        holdCache(options.cache);
        await this.call({ kind: "hello", tab }, undefined, line);
        const model = (await this.call({ kind: "load", options }, undefined, line)) as ModelInfo;
        if (!superseded()) {
          this.model = model;
          this.across = { kind, handovers: this.across ? this.across.handovers + 1 : 0 };
        }
      } catch (err) {
        if (!superseded()) throw err; // a later link has taken over, and its outcome counts
      }
    })();
    this.gate = gate;
    gate.then(
      () => {
        if (this.gate !== gate) return;
        this.gate = null;
        for (const d of this.deferred.splice(0)) this.channel?.post(d.msg, d.transfer);
      },
      () => {},
    );
    return gate;
  }

  /** The engine in a dedicated module worker of this page. */
  static async start(options: EngineOptions, workerUrl: URL): Promise<WorkerEngine> {
    const engine = new WorkerEngine(options.onProgress);
    engine.channel = dedicatedWorker(workerUrl, engine);
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
    engine.shared = true;
    const tab = `lantern-tab-${crypto.randomUUID()}`;
    const release = await holdLock(tab);
    // extendedLifetime (Chromium): the worker outlives a navigation between two pages of the origin
    const worker = new SharedWorker(workerUrl, { type: "module", name: SHARED_NAME, extendedLifetime: true } as WorkerOptions);
    const port = worker.port;
    engine.channel = {
      post: (msg) => port.postMessage(msg),
      close: () => {
        port.close();
        release();
      },
    };
    port.onmessage = (ev: MessageEvent<WorkerResponse>) => engine.receive(ev.data);
    worker.onerror = (ev) => {
      // the script itself failed to load or start
      ev.preventDefault();
      engine.crash(
        new WorkerCrashedError(`the shared engine worker failed to start: ${(ev as ErrorEvent).message || "an error"}`),
      );
    };
    try {
      await engine.call({ kind: "hello", tab });
      await engine.load(options);
    } catch (err) {
      engine.end();
      throw err;
    }
    return engine;
  }

  private async load(options: EngineOptions): Promise<void> {
    holdCache(options.cache);
    const { onProgress: _p, worker: _w, ...plain } = options;
    this.model = (await this.call({ kind: "load", options: plain })) as ModelInfo;
  }

  /** A message from the engine's worker. */
  receive(msg: WorkerResponse): void {
    if (msg.kind === "crash") {
      this.workerFailed(msg.message);
      return;
    }
    if (msg.kind === "connect" || msg.kind === "host-gone" || msg.kind === "port") return; // the SharedWorker's, to tabs.ts
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

  /** Send ``msg`` (on ``via``: at once, on that line; else on the engine's line, after any move). */
  private call(
    msg: Outgoing,
    onChunk?: (c: ChatCompletionChunk) => void,
    via?: Channel,
    transfer?: Transferable[],
  ): Promise<unknown> & { id: number } {
    const id = this.nextId++;
    const crashed = this.crashed;
    const promise = new Promise((resolve, reject) => {
      if (crashed) reject(crashed);
      else this.pending.set(id, { resolve, reject, onChunk });
    }) as Promise<unknown> & { id: number };
    promise.id = id;
    if (crashed) return promise;
    const full = { ...msg, id } as WorkerRequest;
    if (via) via.post(full, transfer);
    else this.post(full, transfer);
    return promise;
  }

  /** On the engine's line, in order; while it moves (link), once it has (the last link's line). */
  private post(msg: WorkerRequest, transfer?: Transferable[]): void {
    if (this.gate) this.deferred.push({ msg, transfer });
    else this.channel?.post(msg, transfer);
  }

  /**
   * Another model in the worker that runs this engine (createEngine's ``alongside``): a line of its own
   * (a MessagePort the worker serves as it serves another tab), so the two share the worker, its weights
   * cache and, across tabs, its host. In the SharedWorker every engine of the origin is in one worker
   * already: there it is loaded as any shared engine is.
   */
  async startAlongside(options: EngineOptions, sharedWorkerUrl: URL): Promise<WorkerEngine> {
    if (this.shared) return WorkerEngine.startShared(options, sharedWorkerUrl);
    await this.gate;
    if (!this.channel || this.crashed) throw new EngineNotLoadedError("the engine to load alongside has no worker any more");
    const { port1, port2 } = new MessageChannel();
    await this.attach(port2, this.channel);
    const engine = new WorkerEngine(options.onProgress);
    engine.channel = {
      post: (msg, transfer) => port1.postMessage(msg, transfer ?? []),
      close: () => port1.close(),
    };
    port1.onmessage = (ev: MessageEvent<WorkerResponse>) => engine.receive(ev.data);
    try {
      await engine.load(options);
    } catch (err) {
      engine.end();
      throw err;
    }
    return engine;
  }

  /** The worker on ``line`` (this tab's, which runs the engine) serves another tab too, through ``port`` (tabs.ts). */
  attach(port: MessagePort, line: Channel): Promise<unknown> {
    return this.call({ kind: "attach" }, undefined, line, [port]);
  }

  private async embed(request: EmbeddingRequest, opts: CreateOptions = {}): Promise<EmbeddingList> {
    opts.signal?.throwIfAborted();
    const call = this.call({ kind: "embed", request });
    const onAbort = () => {
      if (!this.crashed) this.post({ kind: "abort", id: this.nextId++, target: call.id });
    };
    opts.signal?.addEventListener("abort", onAbort);
    try {
      return (await call) as EmbeddingList;
    } finally {
      opts.signal?.removeEventListener("abort", onAbort);
    }
  }

  private async create(
    request: ChatCompletionRequest,
    opts: CreateOptions = {},
  ): Promise<ChatCompletion | AsyncIterable<ChatCompletionChunk>> {
    const chunks = new PushStream<ChatCompletionChunk>();
    const call = this.call({ kind: "create", request }, request.stream ? (c) => chunks.push(c) : undefined);
    const onAbort = () => {
      if (!this.crashed) this.post({ kind: "abort", id: this.nextId++, target: call.id });
    };
    if (opts.signal?.aborted) onAbort();
    opts.signal?.addEventListener("abort", onAbort);
    const finished = call.finally(() => opts.signal?.removeEventListener("abort", onAbort));
    if (!request.stream) return (await finished) as ChatCompletion;
    finished.then(
      () => chunks.end(),
      (e) => chunks.fail(e),
    );
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
    const stats = (await this.call({ kind: "stats" })) as EngineStats;
    if (this.fallback) stats.host.fallback = this.fallback;
    if (this.across) stats.host = { ...stats.host, kind: this.across.kind, handovers: this.across.handovers };
    return stats;
  }

  /** Unload the model (shared: leave it; the SharedWorker unloads it after its last tab and a grace
   * period. Across tabs, in the host tab: another tab's worker runs it next). */
  async unload(): Promise<void> {
    await this.call({ kind: "unload" });
    this.end();
  }
}

/** ``engine``'s line to a new dedicated module worker of this page. */
export function dedicatedWorker(workerUrl: URL, engine: WorkerEngine): Channel {
  const worker = new Worker(workerUrl, { type: "module" });
  worker.onmessage = (ev: MessageEvent<WorkerResponse>) => engine.receive(ev.data);
  worker.onerror = (ev) => {
    ev.preventDefault();
    engine.workerFailed(ev.message);
  };
  return { post: (msg, transfer = []) => worker.postMessage(msg, transfer), close: () => worker.terminate() };
}

/** Hold the Web Lock ``name`` until the returned function is called or the page goes away. */
export function holdLock(name: string): Promise<() => void> {
  if (!navigator.locks) return Promise.resolve(() => {}); // no lock: a closed tab is noticed only by its unload
  return new Promise((held) => {
    navigator.locks.request(name, () => new Promise<void>((release) => held(release)));
  });
}
