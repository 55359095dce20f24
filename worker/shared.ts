// The origin's SharedWorker: one engine per model for every tab that asks for it. Each page's
// createEngine connects a port (a PageSession, as in the dedicated worker); pages that load the same
// model with the same options share one loaded Engine, whose requests are taken in turn, one page after
// another (FairQueue). A page that leaves (unload, or its Web Lock released: closed, navigated away,
// crashed) has its requests cancelled; a model whose last page has left stays loaded for a grace period,
// so a navigation or a reload finds it, and is then unloaded.
import { Engine } from "../webruntime/src/engine";
import { EngineNotLoadedError } from "../webruntime/src/errors";
import type { EngineOptions, LoadProgress, WorkerRequest, WorkerResponse } from "../webruntime/src/protocol";
import { type Attachment, PageSession } from "./host";

declare const self: SharedWorkerGlobalScope;

type LoadOptions = Omit<EngineOptions, "onProgress" | "worker">;

const GRACE_MS = 20000;

/**
 * Requests in turn across pages: each page has its own line, and the engine takes the first request of
 * the page served least recently, so a page that sends many requests does not hold the others back.
 */
export class FairQueue<K> {
  private readonly lines = new Map<K, (() => void)[]>();
  private readonly lastServed = new Map<K, number>();
  private served = 0;
  private busy = false;

  get waiting(): number {
    let n = 0;
    for (const line of this.lines.values()) n += line.length;
    return n;
  }

  turn(key: K, signal: AbortSignal): Promise<() => void> {
    return new Promise((resolve) => {
      let released = false;
      const release = () => {
        if (released) return;
        released = true;
        this.next();
      };
      const go = () => {
        signal.removeEventListener("abort", skip);
        resolve(release);
      };
      // Aborted while waiting: leave the line, and let the engine end it at once as "abort".
      const skip = () => {
        const line = this.lines.get(key);
        const at = line?.indexOf(go) ?? -1;
        if (at < 0) return;
        line!.splice(at, 1);
        if (!line!.length) this.lines.delete(key);
        resolve(() => {});
      };
      signal.addEventListener("abort", skip, { once: true });
      const line = this.lines.get(key);
      if (line) line.push(go);
      else this.lines.set(key, [go]);
      if (!this.busy) this.next();
    });
  }

  /** Forget a page that has left. */
  drop(key: K): void {
    this.lastServed.delete(key);
  }

  private next(): void {
    let pick: K | undefined;
    for (const key of this.lines.keys()) {
      if (pick === undefined || (this.lastServed.get(key) ?? -1) < (this.lastServed.get(pick) ?? -1)) pick = key;
    }
    if (pick === undefined) {
      this.busy = false;
      return;
    }
    const line = this.lines.get(pick)!;
    const go = line.shift()!;
    if (!line.length) this.lines.delete(pick);
    this.lastServed.set(pick, this.served++);
    this.busy = true;
    go();
  }
}

/** One loaded model and the pages attached to it. */
class Model {
  readonly pages = new Set<Page>();
  readonly queue = new FairQueue<Page>();
  readonly listeners = new Set<(p: LoadProgress) => void>();
  readonly engine: Promise<Engine>;
  loaded: Engine | null = null;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private graceMs = GRACE_MS;

  constructor(private readonly key: string, options: LoadOptions) {
    this.engine = Engine.load({ ...options, onProgress: (p) => this.listeners.forEach((tell) => tell(p)) });
    this.engine.then((engine) => { this.loaded = engine; }, () => MODELS.delete(this.key));
  }

  join(page: Page, options: LoadOptions): void {
    clearTimeout(this.timer);
    if (options.sharedGraceMs !== undefined) this.graceMs = options.sharedGraceMs;
    this.pages.add(page);
  }

  leave(page: Page): void {
    if (!this.pages.delete(page)) return;
    this.queue.drop(page);
    if (this.pages.size) return;
    this.timer = setTimeout(() => {
      MODELS.delete(this.key);
      this.engine.then((engine) => engine.unload(), () => {});
    }, this.graceMs);
  }
}

const MODELS = new Map<string, Model>();
const PAGES = new Set<Page>();

/** One page's createEngine: its port, its session and the model it is attached to. */
class Page implements Attachment {
  private model: Model | null = null;
  readonly session: PageSession;

  constructor(readonly port: MessagePort) {
    this.session = new PageSession((msg) => port.postMessage(msg), this);
    port.onmessage = (ev: MessageEvent<WorkerRequest>) => this.session.handle(ev.data);
    PAGES.add(this);
  }

  hello(tab: string): void {
    // Granted once the page's own hold on the lock ends: it closed, navigated away or crashed.
    navigator.locks?.request(tab, () => this.leave());
  }

  async load(options: LoadOptions, progress: (p: LoadProgress) => void): Promise<Engine> {
    if (this.model) throw new EngineNotLoadedError("this engine has a model already; create another engine for another model");
    const key = JSON.stringify([options.model, options.device ?? "auto", options.threads ?? null, options.contextWindow ?? null, options.cache ?? "cache-api", options.requireThreads ?? false]);
    let model = MODELS.get(key);
    if (!model) MODELS.set(key, model = new Model(key, options));
    model.join(this, options);
    this.model = model;
    if (model.loaded) {
      progress({ phase: "ready", loadedBytes: 0, totalBytes: 0, progress: 1, fromCache: true });
      return model.loaded;
    }
    model.listeners.add(progress);
    try {
      return await model.engine;
    } catch (err) {
      this.leave();
      throw err;
    } finally {
      model.listeners.delete(progress);
    }
  }

  turn(signal: AbortSignal): Promise<() => void> {
    return this.model!.queue.turn(this, signal);
  }

  interrupt(): void {
    this.session.cancelAll();
  }

  host() {
    const model = this.model!;
    return { kind: "shared" as const, tabs: model.pages.size, models: [...MODELS.values()].filter((m) => m.loaded).length };
  }

  waiting(): number {
    return this.model?.queue.waiting ?? 0;
  }

  async unload(): Promise<void> {
    this.leave();
  }

  /** The page is gone or done: its requests are cancelled (their KV entries freed), the model kept for the others. */
  leave(): void {
    this.session.cancelAll();
    this.model?.leave(this);
    this.model = null;
    PAGES.delete(this);
  }
}

self.onconnect = (ev: MessageEvent) => {
  const port = ev.ports[0];
  new Page(port);
};

// An uncaught error leaves every engine here in an unknown state: every page hears of it (its calls
// fail with WorkerCrashedError, as a dedicated worker's would) and the worker ends.
self.addEventListener("error", (ev: ErrorEvent) => {
  const msg: WorkerResponse = { kind: "crash", id: 0, message: ev.message || "an uncaught error" };
  for (const page of PAGES) page.port.postMessage(msg);
  self.close();
});
