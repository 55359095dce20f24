// The page side of an engine that runs in a Web Worker: same API as Engine, every call is a
// message (protocol.ts). Streamed chunks arrive as they are made, without acknowledgements.
import type { CreateOptions, PromptPlan } from "./engine";
import { deserializeError, WorkerCrashedError } from "./errors";
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

export class WorkerEngine {
  readonly chat = {
    completions: {
      create: ((req: ChatCompletionRequest, opts?: CreateOptions) => this.create(req, opts)) as CreateChatCompletion<CreateOptions>,
    },
  };

  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private crashed: WorkerCrashedError | null = null;

  private constructor(private readonly worker: Worker, private readonly onProgress: EngineOptions["onProgress"]) {
    worker.onmessage = (ev: MessageEvent<WorkerResponse>) => this.receive(ev.data);
    worker.onerror = (ev) => {
      ev.preventDefault();
      this.crash(new WorkerCrashedError(`the engine worker crashed: ${ev.message || "an uncaught error"}`));
    };
  }

  /** An uncaught error in the worker leaves its engine in an unknown state: every call in flight
   * fails with WorkerCrashedError (a stream mid-way too, so the router continues it on the cloud),
   * the worker is stopped, and later calls fail at once. */
  private crash(err: WorkerCrashedError): void {
    if (this.crashed) return;
    this.crashed = err;
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
    this.worker.terminate();
  }

  static async start(options: EngineOptions, workerUrl: URL): Promise<WorkerEngine> {
    const engine = new WorkerEngine(new Worker(workerUrl, { type: "module" }), options.onProgress);
    const { onProgress: _p, worker: _w, ...plain } = options;
    await engine.call({ kind: "load", options: plain });
    return engine;
  }

  private receive(msg: WorkerResponse): void {
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
    if (!crashed) this.worker.postMessage({ ...msg, id } as WorkerRequest);
    return promise;
  }

  private async create(request: ChatCompletionRequest, opts: CreateOptions = {}):
    Promise<ChatCompletion | AsyncIterable<ChatCompletionChunk>> {
    const chunks = new PushStream<ChatCompletionChunk>();
    const call = this.call({ kind: "create", request }, request.stream ? (c) => chunks.push(c) : undefined);
    const onAbort = () => this.worker.postMessage({ kind: "abort", id: this.nextId++, target: call.id } as WorkerRequest);
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

  stats(): Promise<EngineStats> {
    return this.call({ kind: "stats" }) as Promise<EngineStats>;
  }

  async unload(): Promise<void> {
    await this.call({ kind: "unload" });
    this.worker.terminate();
  }
}
