// Lantern's browser runtime: `createEngine` loads an artifact and answers OpenAI-style chat
// requests on WebGPU, in a Web Worker by default.
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

export { Engine, WorkerEngine };
export { chooseLibrary } from "./device";
export * from "./errors";
export type * from "./protocol";
export { deleteModelFromCache, listCachedModels } from "./storage";
// The sampler and its seeded generator, the contract the Python server's sampler follows.
export { Rng, Sampler, samplingParams } from "./sampler";
