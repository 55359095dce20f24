// The origin's SharedWorker. It runs one engine per model for every tab that asks for it (house.ts).
// For an engine it cannot run here (the wasm device: Chromium's SharedWorker cannot start the Workers
// llama.cpp needs, Firefox's would give it one thread), it is the broker that connects each tab to the
// one tab whose dedicated worker runs that engine (webruntime/src/client.ts, startAcrossTabs): a
// BroadcastChannel cannot carry a MessagePort, a SharedWorker can.
import { House, type Page, type TabRequest } from "./house";

declare const self: SharedWorkerGlobalScope;

/** Across tabs: for each engine (engineKey), the tab whose worker runs it, the tabs attached to that
 * tab, and the tabs waiting for a host. The host tab's Web Lock (client.ts) decides who hosts; this
 * only connects. */
class Broker {
  private readonly hosts = new Map<string, Page>();
  private readonly attached = new Map<Page, Set<Page>>();
  private readonly waiting = new Map<string, { page: Page; id: number }[]>();

  take(page: Page, msg: TabRequest): void {
    if (msg.kind === "host") this.host(page, msg.key, msg.id);
    else if (msg.kind === "join") this.join(page, msg.key, msg.id);
    else page.send({ kind: "error", id: msg.id, error: { name: "Error", message: "the SharedWorker runs no tab's engine" } });
  }

  /** ``page`` has won the host lock for ``key``: the tabs waiting, and those that come later, reach its worker. */
  private host(page: Page, key: string, id: number): void {
    this.forget(page);
    const before = this.hosts.get(key);
    if (before) this.gone(before); // its lock has passed on before its own leaving was noticed here
    this.hosts.set(key, page);
    this.attached.set(page, new Set());
    page.send({ kind: "result", id, value: null });
    for (const tab of this.waiting.get(key) ?? []) this.connect(page, tab.page, tab.id);
    this.waiting.delete(key);
  }

  private join(page: Page, key: string, id: number): void {
    const host = this.hosts.get(key);
    if (host) this.connect(host, page, id);
    else this.waiting.set(key, [...(this.waiting.get(key) ?? []), { page, id }]);
  }

  /** A channel from ``page`` to the host's worker: one end to each. */
  private connect(host: Page, page: Page, id: number): void {
    const { port1, port2 } = new MessageChannel();
    host.send({ kind: "connect", id: 0 }, [port1]);
    page.send({ kind: "port", id }, [port2]);
    this.attached.get(host)!.add(page);
  }

  /** A tab has left (closed, navigated away, crashed or unloaded): if it hosted, its tabs hear so. */
  leave(page: Page): void {
    this.forget(page);
    if (this.attached.has(page)) this.gone(page);
  }

  private gone(host: Page): void {
    for (const [key, page] of this.hosts) if (page === host) this.hosts.delete(key);
    for (const tab of this.attached.get(host) ?? []) tab.send({ kind: "host-gone", id: 0 });
    this.attached.delete(host);
  }

  /** ``page`` no longer waits for a host nor is attached to one. */
  private forget(page: Page): void {
    for (const [key, line] of this.waiting) {
      const rest = line.filter((tab) => tab.page !== page);
      if (rest.length) this.waiting.set(key, rest);
      else this.waiting.delete(key);
    }
    for (const tabs of this.attached.values()) tabs.delete(page);
  }
}

const house = new House("shared");
const broker = new Broker();
house.onTabs = (page, msg) => broker.take(page, msg);
house.onLeave = (page) => broker.leave(page);

self.onconnect = (ev: MessageEvent) => {
  house.serve(ev.ports[0]);
};

self.addEventListener("error", (ev: ErrorEvent) => {
  house.crash(ev.message || "an uncaught error");
  self.close();
});
