// createEngine: the engine in a Web Worker (default) or in the page.
import { WorkerEngine } from "./client";
import { Engine } from "./engine";
import type { EngineOptions } from "./protocol";

export type LanternEngine = Engine | WorkerEngine;

export async function createEngine(options: EngineOptions): Promise<LanternEngine> {
  if (options.worker === false) return Engine.load(options);
  // The worker bundle sits next to this module (/runtime/worker.js beside /runtime/lantern.js).
  const model = new URL(options.model, location.href).href;
  return WorkerEngine.start({ ...options, model }, new URL("./worker.js", import.meta.url));
}
