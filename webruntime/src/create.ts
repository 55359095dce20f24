// createEngine: the engine in the origin's SharedWorker (default where it exists), in one tab's
// dedicated worker for every tab (where the SharedWorker cannot run it: tabs.ts), in a dedicated Web
// Worker of this page, or in the page; with ``alongside``, in the worker of an engine already made.
import { WorkerEngine } from "./client";
import { Engine } from "./engine";
import { InvalidRequestError } from "./errors";
import { wasmFeatures } from "./llama-builds";
import type { EngineOptions } from "./protocol";
import { canShareAcrossTabs, startAcrossTabs } from "./tabs";

export type LanternEngine = Engine | WorkerEngine;

export interface CreateEngineOptions extends EngineOptions {
  /** Load this model in the worker that runs ``alongside`` (a chat model and an embedding model in one
   * worker): a second engine with its own requests, sharing the worker, its cache and its host. */
  alongside?: LanternEngine;
}

export async function createEngine(options: CreateEngineOptions): Promise<LanternEngine> {
  const { alongside, ...engineOptions } = options;
  if (alongside) {
    if (!(alongside instanceof WorkerEngine)) {
      throw new InvalidRequestError("alongside: that engine runs in the page (worker: false), not in a worker to share");
    }
    const model = new URL(options.model, location.href).href;
    return alongside.startAlongside({ ...engineOptions, model }, new URL("./shared-worker.js", import.meta.url));
  }
  return createOwnEngine(engineOptions);
}

async function createOwnEngine(options: EngineOptions): Promise<LanternEngine> {
  if (options.worker === false) return Engine.load(options);
  // The worker bundles sit next to this module (/runtime/worker.js beside /runtime/lantern.js).
  const model = new URL(options.model, location.href).href;
  let fallback: string | undefined;
  if (options.shared ?? true) {
    if (typeof SharedWorker === "undefined") {
      if (options.shared) fallback = "this browser has no SharedWorker";
    } else {
      try {
        // on the wasm device, threads decide between a shared engine and a faster dedicated one
        const requireThreads = options.requireThreads ?? (options.threads !== 1 && wasmFeatures().threads);
        return await WorkerEngine.startShared(
          { ...options, model, requireThreads },
          new URL("./shared-worker.js", import.meta.url),
        );
      } catch (err) {
        if ((err as Error)?.name !== "SharedEngineUnavailableError") throw err;
        fallback = (err as Error).message;
        console.info(`lantern: a dedicated worker runs this engine: ${fallback}`);
      }
    }
  }
  const workerUrl = new URL("./worker.js", import.meta.url);
  // the SharedWorker could not run it: one tab's dedicated worker runs it for every tab (tabs.ts)
  const engine =
    fallback && canShareAcrossTabs()
      ? await startAcrossTabs({ ...options, model }, workerUrl, new URL("./shared-worker.js", import.meta.url))
      : await WorkerEngine.start({ ...options, model }, workerUrl);
  engine.fallback = fallback;
  return engine;
}
