// One page's conversation with a worker that hosts an engine: the same messages (protocol.ts) whether the
// worker is the page's own (worker.ts) or the origin's SharedWorker (shared.ts), which differ only in
// how a page reaches its engine (an Attachment).
import type { Engine } from "../webruntime/src/engine";
import { EngineNotLoadedError, serializeError } from "../webruntime/src/errors";
import type {
  ChatCompletionChunk,
  EngineHost,
  LoadOptions,
  LoadProgress,
  WorkerRequest,
  WorkerResponse,
} from "../webruntime/src/protocol";

export interface Attachment {
  /** This page's engine for ``options``, loading it if needed. */
  load(options: LoadOptions, progress: (p: LoadProgress) => void): Promise<Engine>;
  /** Resolves when a request of this page may run; call the returned function when it has ended. */
  turn(signal: AbortSignal): Promise<() => void>;
  /** Stop this page's running request. */
  interrupt(): void;
  host(): EngineHost;
  /** Requests of any page waiting for their turn outside the engine's own queue. */
  waiting(): number;
  unload(): Promise<void>;
  /** shared: the Web Lock the page holds while it lives. */
  hello?(tab: string): void;
}

export class PageSession {
  private engine: Engine | null = null;
  private readonly aborts = new Map<number, AbortController>();

  constructor(
    private readonly send: (msg: WorkerResponse) => void,
    private readonly attachment: Attachment,
  ) {}

  handle(msg: WorkerRequest): void {
    this.run(msg).then(
      (value) => this.send({ kind: "result", id: msg.id, value }),
      (err) => this.send({ kind: "error", id: msg.id, error: serializeError(err) }),
    );
  }

  /** Cancel every request of this page (it left, or asked to interrupt). */
  cancelAll(): void {
    for (const ctrl of this.aborts.values()) ctrl.abort();
  }

  private loaded(): Engine {
    if (!this.engine) throw new EngineNotLoadedError("load the engine first");
    return this.engine;
  }

  private async run(msg: WorkerRequest): Promise<unknown> {
    switch (msg.kind) {
      case "hello":
        this.attachment.hello?.(msg.tab);
        return null;
      case "load":
        this.engine = await this.attachment.load(msg.options, (progress) =>
          this.send({ kind: "progress", id: msg.id, progress }),
        );
        return this.engine.model;
      case "create": {
        const engine = this.loaded();
        const ctrl = new AbortController();
        this.aborts.set(msg.id, ctrl);
        const done = await this.attachment.turn(ctrl.signal);
        try {
          if (!msg.request.stream)
            return await engine.chat.completions.create({ ...msg.request, stream: false }, { signal: ctrl.signal });
          const stream = await engine.chat.completions.create({ ...msg.request, stream: true }, { signal: ctrl.signal });
          for await (const chunk of stream as AsyncIterable<ChatCompletionChunk>) this.send({ kind: "chunk", id: msg.id, chunk });
          return null;
        } finally {
          done();
          this.aborts.delete(msg.id);
        }
      }
      case "embed": {
        const engine = this.loaded();
        const ctrl = new AbortController();
        this.aborts.set(msg.id, ctrl);
        const done = await this.attachment.turn(ctrl.signal);
        try {
          return await engine.embeddings.create(msg.request, { signal: ctrl.signal });
        } finally {
          done();
          this.aborts.delete(msg.id);
        }
      }
      case "abort":
        this.aborts.get(msg.target)?.abort();
        return null;
      case "interrupt":
        this.attachment.interrupt();
        return null;
      case "stats": {
        const stats = this.loaded().stats();
        return { ...stats, queued: stats.queued + this.attachment.waiting(), host: this.attachment.host() };
      }
      case "render":
        return this.loaded().renderPrompt(msg.request);
      case "debug":
        return this.loaded().debug(msg.request);
      case "debug-lose-device":
        this.engine?.debugLoseDevice();
        return null;
      case "debug-crash": // an uncaught error, as a wasm abort in a callback throws one
        setTimeout(() => {
          throw new Error("debug-crash: an uncaught error in the engine worker");
        });
        return null;
      case "host":
      case "join":
      case "attach": // taken by the house (house.ts) before a session sees them
        throw new Error(`"${msg.kind}" is a request about tabs, not for an engine`);
      case "unload":
        this.cancelAll();
        await this.attachment.unload();
        this.engine = null;
        return null;
    }
  }
}
