// The Web Worker that hosts a Lantern engine. The page talks to it through WorkerEngine
// (webruntime/src/client.ts) with the messages of webruntime/src/protocol.ts.
import { Engine } from "../webruntime/src/engine";
import { serializeError } from "../webruntime/src/errors";
import type { ChatCompletionChunk, WorkerRequest, WorkerResponse } from "../webruntime/src/protocol";

let engine: Engine | null = null;
const aborts = new Map<number, AbortController>();

function send(msg: WorkerResponse): void {
  postMessage(msg);
}

async function handle(msg: WorkerRequest): Promise<unknown> {
  switch (msg.kind) {
    case "load":
      engine = await Engine.load({ ...msg.options, onProgress: (progress) => send({ kind: "progress", id: msg.id, progress }) });
      return null;
    case "create": {
      if (!engine) throw new Error("load the engine first");
      const ctrl = new AbortController();
      aborts.set(msg.id, ctrl);
      try {
        if (!msg.request.stream) return await engine.chat.completions.create({ ...msg.request, stream: false }, { signal: ctrl.signal });
        const stream = await engine.chat.completions.create({ ...msg.request, stream: true }, { signal: ctrl.signal });
        for await (const chunk of stream as AsyncIterable<ChatCompletionChunk>) send({ kind: "chunk", id: msg.id, chunk });
        return null;
      } finally {
        aborts.delete(msg.id);
      }
    }
    case "abort":
      aborts.get(msg.target)?.abort();
      return null;
    case "interrupt":
      engine?.interrupt();
      return null;
    case "stats":
      if (!engine) throw new Error("load the engine first");
      return engine.stats();
    case "render":
      if (!engine) throw new Error("load the engine first");
      return engine.renderPrompt(msg.request);
    case "debug":
      if (!engine) throw new Error("load the engine first");
      return engine.debug(msg.request);
    case "debug-lose-device":
      engine?.debugLoseDevice();
      return null;
    case "debug-crash":  // an uncaught error, as a wasm abort in a callback throws one
      setTimeout(() => { throw new Error("debug-crash: an uncaught error in the engine worker"); });
      return null;
    case "unload":
      await engine?.unload();
      engine = null;
      return null;
  }
}

self.onmessage = (ev: MessageEvent<WorkerRequest>) => {
  const msg = ev.data;
  handle(msg).then(
    (value) => send({ kind: "result", id: msg.id, value }),
    (err) => send({ kind: "error", id: msg.id, error: serializeError(err) }),
  );
};
