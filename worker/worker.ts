// The dedicated Web Worker that hosts one page's Lantern engine. The page talks to it through
// WorkerEngine (webruntime/src/client.ts) with the messages of webruntime/src/protocol.ts.
import { Engine } from "../webruntime/src/engine";
import type { WorkerRequest } from "../webruntime/src/protocol";
import { PageSession } from "./host";

let engine: Engine | null = null;

const session = new PageSession((msg) => postMessage(msg), {
  load: async (options, progress) => (engine = await Engine.load({ ...options, onProgress: progress })),
  turn: async () => () => {},  // the engine queues this page's requests itself
  interrupt: () => engine?.interrupt(),
  host: () => ({ kind: "dedicated", tabs: 1, models: 1 }),
  waiting: () => 0,
  unload: async () => {
    await engine?.unload();
    engine = null;
  },
});

self.onmessage = (ev: MessageEvent<WorkerRequest>) => session.handle(ev.data);
