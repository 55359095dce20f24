// Lantern's browser runtime: `createEngine` loads an artifact and answers OpenAI-style chat
// requests on WebGPU or, without a usable GPU, on the CPU (llama.cpp in wasm), in a Web Worker by
// default; `createRouter` adds the cloud fallback.
export { WorkerEngine } from "./client";
export { createEngine, type CreateEngineOptions, type LanternEngine } from "./create";
export { checkLibraryPipelines, type PipelineCheck } from "./checks";
export { autoDevice, chooseLibrary, deviceLabel, isSoftwareAdapter, SCHEDULES } from "./library";
export { Engine } from "./engine";
export { wasmLabel } from "./wasm";
export { wasmThreads } from "./threads";
export { chooseLlamaBuild, wasmFeatures, type LlamaBuild, type WasmFeatures } from "./llama-builds";
export * from "./errors";
export type * from "./protocol";
export { CloudError, createRouter, Router, type Policy, type RouterEvent, type RouterOptions } from "./router";
// The sampler and its seeded generator, the contract the Python server's sampler follows.
export { GENERATION_FIELDS, Rng, Sampler, samplingParams } from "./sampler";
export { deleteModelFromCache, listCachedModels } from "./storage";
// Retrieval in the page: chunks, their vectors in IndexedDB, the nearest by cosine.
export { chunkText, openIndex, VectorIndex, type Chunk, type Document, type Embedder, type Hit } from "./retrieval";
export { MAX_EMBEDDING_INPUTS } from "./embeddings";
