// The dedicated Web Worker that hosts a page's Lantern engine. The page talks to it through
// WorkerEngine (webruntime/src/client.ts) with the messages of webruntime/src/protocol.ts. Across tabs
// (client.ts, startAcrossTabs), it serves other tabs too: each reaches it through a MessagePort that
// the origin's SharedWorker brokered and its page passed on ("attach"), and shares the loaded engine.
import type { WorkerRequest } from "../webruntime/src/protocol";
import { House } from "./house";

declare const self: DedicatedWorkerGlobalScope;

const house = new House("dedicated");
house.onTabs = (page, msg, ports) => {
  if (msg.kind === "attach" && ports[0]) {
    house.serve(ports[0]);
    page.send({ kind: "result", id: msg.id, value: null });
  } else {
    page.send({ kind: "error", id: msg.id, error: { name: "Error", message: `a tab's worker does not take "${msg.kind}"` } });
  }
};

const own = house.open((msg) => self.postMessage(msg));
self.onmessage = (ev: MessageEvent<WorkerRequest>) => own.receive(ev.data, ev.ports);

self.addEventListener("error", (ev: ErrorEvent) => house.crash(ev.message || "an uncaught error", own));
