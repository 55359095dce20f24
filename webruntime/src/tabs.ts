// One engine on the `wasm` device for every tab of an origin, where the SharedWorker cannot run it:
// Chromium's SharedWorker cannot start the Workers llama.cpp needs, and Firefox's is not cross-origin
// isolated, so llama.cpp would get one thread there. One tab's dedicated worker runs the engine and
// serves the other tabs (worker/worker.ts):
// - a Web Lock per engine (engineKey) elects that tab, the host: the first tab to ask gets it;
// - the origin's SharedWorker brokers a MessagePort from each other tab to the host's worker
//   (worker/shared.ts; a BroadcastChannel cannot carry a port);
// - when the host tab closes, navigates away, unloads or crashes, its lock passes to a waiting tab,
//   which loads the model in a worker of its own (from the cache) and becomes the host. The
//   SharedWorker tells the other tabs, which reconnect to it. Their calls in flight fail with
//   WorkerCrashedError (the router continues a stream on the cloud); later calls wait for the new host.
import { type Channel, dedicatedWorker, holdLock, SHARED_NAME, WorkerEngine } from "./client";
import { deserializeError, WorkerCrashedError } from "./errors";
import { type EngineOptions, engineKey, type LoadOptions, type WorkerRequest, type WorkerResponse } from "./protocol";

/** Whether this browser can share an engine across tabs this way. */
export function canShareAcrossTabs(): boolean {
  return typeof SharedWorker !== "undefined" && typeof navigator.locks?.request === "function";
}

/** This tab's engine, run by whichever tab hosts it (see above). Rejects as a dedicated worker's load would. */
export async function startAcrossTabs(options: EngineOptions, workerUrl: URL, sharedUrl: URL): Promise<WorkerEngine> {
  const { onProgress, worker: _w, ...load } = options;
  const tab = `lantern-tab-${crypto.randomUUID()}`;
  const releaseTab = await holdLock(tab); // the SharedWorker and the host's worker notice this tab leave by it
  const broker = new Broker(sharedUrl);
  const engine = WorkerEngine.unlinked(onProgress);
  const share = new TabShare(engine, broker, load, tab, workerUrl);
  engine.onEnd(() => {
    share.end();
    releaseTab();
    broker.close();
  });
  try {
    await broker.ask({ kind: "hello", tab });
    await share.start();
  } catch (err) {
    engine.end();
    throw err;
  }
  return engine;
}

class TabShare {
  private readonly key: string;
  private readonly lock: string;
  private leading = false;
  private line: Channel | null = null; // to this tab's worker, while it hosts
  private releaseHost: (() => void) | null = null;
  private readonly waiting = new AbortController(); // the queued request for the host lock

  constructor(
    private readonly engine: WorkerEngine,
    private readonly broker: Broker,
    private readonly options: LoadOptions,
    private readonly tab: string,
    private readonly workerUrl: URL,
  ) {
    this.key = engineKey(options);
    this.lock = `lantern-host-${SHARED_NAME}-${this.key}`;
    broker.onConnect = (port) => {
      if (this.line) this.engine.attach(port, this.line).catch(() => {});
      else port.close();
    };
    broker.onHostGone = () => {
      if (this.leading) return;
      this.follow(new WorkerCrashedError("the tab that ran this engine has gone; another tab runs it next")).catch((err) =>
        this.engine.workerFailed(`no other tab could run the engine: ${(err as Error).message}`),
      );
    };
  }

  async start(): Promise<void> {
    const release = await tryLock(this.lock);
    if (release) return this.lead(release);
    this.queueForHost();
    return this.follow();
  }

  /** This tab hosts: its own worker runs the engine, and the SharedWorker sends it the other tabs. */
  private async lead(release: () => void, lost?: WorkerCrashedError): Promise<void> {
    this.leading = true;
    this.releaseHost = release;
    const line = (this.line = dedicatedWorker(this.workerUrl, this.engine));
    // tabs that come while this one loads wait on its load, not on one of their own
    await Promise.all([
      this.engine.link(Promise.resolve(line), this.options, this.tab, "dedicated", lost),
      this.broker.ask({ kind: "host", key: this.key }),
    ]);
  }

  /** Another tab hosts: reach its worker through a port the SharedWorker brokers (once a tab hosts). */
  private follow(lost?: WorkerCrashedError): Promise<void> {
    const line = this.broker.ask({ kind: "join", key: this.key }).then((port): Channel => {
      if (!port) throw new WorkerCrashedError("the SharedWorker answered without a port to the host tab");
      port.onmessage = (ev: MessageEvent<WorkerResponse>) => this.engine.receive(ev.data);
      return { post: (msg, transfer = []) => port.postMessage(msg, transfer), close: () => port.close() };
    });
    return this.engine.link(line, this.options, this.tab, "tab", lost);
  }

  /** Wait for the host lock: granted when the host tab has gone, and this tab is next. */
  private queueForHost(): void {
    navigator.locks
      .request(
        this.lock,
        { signal: this.waiting.signal },
        () =>
          new Promise<void>((release) => {
            this.lead(release, new WorkerCrashedError("the tab that ran this engine has gone; this tab runs it now")).catch(
              (err) => this.engine.workerFailed(`this tab could not take over the engine: ${(err as Error).message}`),
            );
          }),
      )
      .catch(() => {}); // aborted: this engine has ended
  }

  /** The engine has ended here: stop waiting to host, and let another tab host. */
  end(): void {
    this.waiting.abort();
    this.line = null;
    this.releaseHost?.();
  }
}

/** The Web Lock ``name`` if no one holds it: a function that releases it; else null. */
function tryLock(name: string): Promise<(() => void) | null> {
  return new Promise((resolve) => {
    navigator.locks
      .request(name, { ifAvailable: true }, (lock) => {
        if (!lock) {
          resolve(null);
          return undefined;
        }
        return new Promise<void>((release) => resolve(release));
      })
      .catch(() => resolve(null));
  });
}

/** This tab's line to the origin's SharedWorker, for the requests about tabs (protocol.ts). */
class Broker {
  private nextId = 1;
  private readonly replies = new Map<number, { resolve: (port: MessagePort | undefined) => void; reject: (e: Error) => void }>();
  private readonly port: MessagePort;
  private failed: Error | null = null;
  onConnect: (port: MessagePort) => void = () => {};
  onHostGone: () => void = () => {};

  constructor(url: URL) {
    const worker = new SharedWorker(url, { type: "module", name: SHARED_NAME, extendedLifetime: true } as WorkerOptions);
    worker.onerror = (ev) => {
      ev.preventDefault();
      this.fail(new WorkerCrashedError(`the shared engine worker failed to start: ${(ev as ErrorEvent).message || "an error"}`));
    };
    this.port = worker.port;
    this.port.onmessage = (ev: MessageEvent<WorkerResponse>) => this.receive(ev.data, ev.ports);
  }

  ask(msg: { kind: "hello"; tab: string } | { kind: "host" | "join"; key: string }): Promise<MessagePort | undefined> {
    if (this.failed) return Promise.reject(this.failed);
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.replies.set(id, { resolve, reject });
      this.port.postMessage({ ...msg, id } as WorkerRequest);
    });
  }

  close(): void {
    this.port.close();
  }

  private receive(msg: WorkerResponse, ports: readonly MessagePort[]): void {
    if (msg.kind === "connect") {
      this.onConnect(ports[0]);
      return;
    }
    if (msg.kind === "host-gone") {
      this.onHostGone();
      return;
    }
    if (msg.kind === "crash") {
      this.fail(new WorkerCrashedError(`the shared engine worker crashed: ${msg.message}`));
      return;
    }
    const reply = this.replies.get(msg.id);
    if (!reply) return;
    this.replies.delete(msg.id);
    if (msg.kind === "error") reply.reject(deserializeError(msg.error));
    else reply.resolve(ports[0]);
  }

  private fail(err: Error): void {
    this.failed = err;
    for (const reply of this.replies.values()) reply.reject(err);
    this.replies.clear();
  }
}
