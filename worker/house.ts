// A worker that serves engines to pages: the origin's SharedWorker (shared.ts), or a tab's dedicated
// worker (worker.ts), which serves its own page and, across tabs, the pages of other tabs that reach it
// through a MessagePort (webruntime/src/client.ts, startAcrossTabs). Pages that load the same model with
// the same options (engineKey) share one loaded Engine, whose requests are taken in turn, one page after
// another (FairQueue). A page that leaves (unload, or its Web Lock released: closed, navigated away,
// crashed) has its requests cancelled. In the SharedWorker, a model whose last page has left stays
// loaded for a grace period, so a navigation or a reload finds it, and is then unloaded; a tab's worker
// unloads it at once.
import { Engine } from "../webruntime/src/engine";
import { EngineNotLoadedError } from "../webruntime/src/errors";
import {
  type EngineHost,
  engineKey,
  type LoadOptions,
  type LoadProgress,
  type WorkerRequest,
  type WorkerResponse,
} from "../webruntime/src/protocol";
import { type Attachment, PageSession } from "./host";

const GRACE_MS = 20000;

/** The requests about tabs (protocol.ts): a house that brokers or hosts across tabs handles them. */
export type TabRequest = Extract<WorkerRequest, { kind: "host" | "join" | "attach" }>;

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
  private graceMs: number;

  /** ``progress``: the first page's, heard from the load's first report on. */
  constructor(
    private readonly house: House,
    private readonly key: string,
    options: LoadOptions,
    progress: (p: LoadProgress) => void,
  ) {
    this.graceMs = house.kind === "shared" ? GRACE_MS : 0;
    this.listeners.add(progress);
    this.engine = Engine.load({
      ...options,
      onProgress: (p) => {
        this.listeners.forEach((tell) => {
          tell(p);
        });
      },
    });
    this.engine.then(
      (engine) => {
        this.loaded = engine;
      },
      (err: Error) => {
        house.models.delete(this.key);
        if (err?.name === "SharedEngineUnavailableError") house.refused.set(this.key, err);
      },
    );
  }

  join(page: Page, options: LoadOptions): void {
    clearTimeout(this.timer);
    if (options.sharedGraceMs !== undefined && this.house.kind === "shared") this.graceMs = options.sharedGraceMs;
    this.pages.add(page);
  }

  /** Resolves once the model is unloaded, where ``page`` was the last and the house keeps no model
   * after its last page (a dedicated worker); else at once. */
  async leave(page: Page): Promise<void> {
    if (!this.pages.delete(page)) return;
    this.queue.drop(page);
    if (this.pages.size) return;
    const unload = () => {
      this.house.models.delete(this.key);
      return this.engine.then(
        (engine) => engine.unload(),
        () => {},
      );
    };
    if (!this.graceMs) return unload();
    this.timer = setTimeout(unload, this.graceMs);
  }
}

/** What a page's end of the line can do: post a response, with ports to transfer. */
export type Send = (msg: WorkerResponse, transfer?: Transferable[]) => void;

/** One page's engine in a house: its line, its session and the model it is attached to. */
export class Page implements Attachment {
  private model: Model | null = null;
  readonly session: PageSession;

  constructor(
    private readonly house: House,
    readonly send: Send,
  ) {
    this.session = new PageSession((msg) => send(msg), this);
    house.pages.add(this);
  }

  /** A message from this page: a request for the engine, or one about tabs (the house's onTabs). */
  receive(msg: WorkerRequest, ports: readonly MessagePort[]): void {
    if (msg.kind === "host" || msg.kind === "join" || msg.kind === "attach") this.house.onTabs(this, msg, ports);
    else this.session.handle(msg);
  }

  hello(tab: string): void {
    // Granted once the page's own hold on the lock ends: it closed, navigated away or crashed.
    navigator.locks?.request(tab, () => {
      this.leave();
    });
  }

  async load(options: LoadOptions, progress: (p: LoadProgress) => void): Promise<Engine> {
    if (this.model) throw new EngineNotLoadedError("this engine has a model already; create another engine for another model");
    const key = engineKey(options);
    const refused = this.house.refused.get(key);
    if (refused) throw refused;
    let model = this.house.models.get(key);
    if (!model) this.house.models.set(key, (model = new Model(this.house, key, options, progress)));
    model.join(this, options);
    this.model = model;
    this.house.pages.add(this);
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

  host(): EngineHost {
    const models = [...this.house.models.values()].filter((m) => m.loaded).length;
    return { kind: this.house.kind, tabs: this.model!.pages.size, models };
  }

  waiting(): number {
    return this.model?.queue.waiting ?? 0;
  }

  unload(): Promise<void> {
    return this.leave();
  }

  /** The page is gone or done: its requests are cancelled (their KV entries freed), the model kept for
   * the others (the last page's: see Model.leave). */
  leave(): Promise<void> {
    this.session.cancelAll();
    const left = this.model?.leave(this) ?? Promise.resolve();
    this.model = null;
    this.house.pages.delete(this);
    this.house.onLeave(this);
    return left;
  }
}

export class House {
  readonly models = new Map<string, Model>();
  /** Engines this worker cannot run (SharedEngineUnavailableError), and why: the next tab hears so at once. */
  readonly refused = new Map<string, Error>();
  readonly pages = new Set<Page>();
  /** Across tabs: the SharedWorker brokers ("host", "join"), a tab's dedicated worker attaches ("attach"). */
  onTabs: (page: Page, msg: TabRequest, ports: readonly MessagePort[]) => void = (page, msg) =>
    page.send({ kind: "error", id: msg.id, error: { name: "Error", message: `this worker does not take "${msg.kind}"` } });
  onLeave: (page: Page) => void = () => {};

  constructor(readonly kind: "shared" | "dedicated") {}

  /** A page that posts with ``send`` (its messages go to its receive). */
  open(send: Send): Page {
    return new Page(this, send);
  }

  /** A page whose messages arrive on ``port``. */
  serve(port: MessagePort): Page {
    const page = this.open((msg, transfer = []) => port.postMessage(msg, transfer));
    port.onmessage = (ev: MessageEvent<WorkerRequest>) => page.receive(ev.data, ev.ports);
    return page;
  }

  /** An uncaught error leaves every engine here in an unknown state: every page but ``except`` (which
   * hears of it from the worker's own error event) is told, and its calls fail with WorkerCrashedError. */
  crash(message: string, except?: Page): void {
    for (const page of this.pages) if (page !== except) page.send({ kind: "crash", id: 0, message });
  }
}
