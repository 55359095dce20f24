// The `wasm` device for an embedding model built with the wasm target (`lantern build --targets wasm`, the
// default for BERT encoders): the CPU library's kernels compiled to wasm with 128-bit SIMD, run by TVM's
// web runtime. That runtime has one thread, so the device's threads are workers of its own
// (encoder-worker.js, from worker/encoder.ts), each with a copy of the weights, each embedding whole
// batches of a call's texts. They share no memory: unlike llama.cpp's threads (wasm.ts, which runs an
// artifact without a wasm library), they need no cross-origin isolation, and none waits on another.
//
// Why not llama.cpp for encoders: its wasm build computes each output of a float32 linear as a dot
// product of its own and ran all-MiniLM-L6-v2 at 0.48x transformers.js's speed; the CPU library's
// tiles (compiler/cpu_schedule.py) keep 8 sums in registers (docs/benchmarks.md).
import type { Device, DeviceStats, Generation } from "./devices";
import { embeddingBatches } from "./embeddings";
import { ArtifactError, EngineNotLoadedError, InvalidRequestError, LanternError } from "./errors";
import { chooseLibrary } from "./library";
import { wasmFeatures } from "./llama-builds";
import { fetchEach, fetchFiles, type LibraryEntry, type Manifest } from "./loader";
import type { TensorCacheIndex } from "./model";
import type { DebugResult, EngineOptions, LoadProgress } from "./protocol";
import type { FileStore } from "./storage";
import { requireWorkers } from "./threads";

type EncoderAsk =
  | { op: "load"; wasm: ArrayBuffer; index: TensorCacheIndex; shards: Record<string, ArrayBuffer>; upcast: boolean }
  | { op: "embed"; batch: number[][] };
export type EncoderRequest = EncoderAsk & { id: number };
export type EncoderReply =
  | { op: "ready"; id: number }
  | { op: "vectors"; id: number; vectors: Float32Array[] }
  | { op: "error"; id: number; message: string };

// Padded tokens a worker embeds in one call: a few MB of activations besides the attention scores.
const BATCH_TOKENS = 4096;
// The weights of every worker together (each holds them as float32): beyond this, fewer workers.
const POOL_WEIGHT_BYTES = 2 ** 30;

/** Whether the artifact has a wasm library (an embedding model's). */
export function hasEncoderLibrary(manifest: Pick<Manifest, "libraries" | "model">): boolean {
  return manifest.model.kind === "embedding" && manifest.libraries.some((lib) => lib.target === "wasm");
}

/** The wasm library this engine runs best: relaxed SIMD's where it has it (chooseLibrary's rules). */
export function encoderLibrary(manifest: Pick<Manifest, "libraries">, features = wasmFeatures()): LibraryEntry {
  return chooseLibrary(manifest, { features: new Set(features.relaxedSimd ? [WASM_RELAXED] : []), emulated: false }, "wasm");
}

/** The feature the wasm target's relaxed-SIMD library requires (lower.WASM_RELAXED). */
export const WASM_RELAXED = "relaxed-simd";

/** Workers for ``weightBytes`` of float32 weights each: as asked, else one per core up to 4, within POOL_WEIGHT_BYTES. */
export function encoderWorkers(requested: number | undefined, weightBytes: number): { workers: number; why: string } {
  if (requested) return { workers: Math.max(1, Math.floor(requested)), why: "as asked" };
  const cores = globalThis.navigator?.hardwareConcurrency ?? 1;
  const byMemory = Math.max(1, Math.floor(POOL_WEIGHT_BYTES / Math.max(1, weightBytes)));
  const workers = Math.max(1, Math.min(4, cores, byMemory));
  return {
    workers,
    why: `navigator.hardwareConcurrency is ${cores}; each worker holds ${(weightBytes / 2 ** 20).toFixed(0)} MB of weights`,
  };
}

/** One encoder worker and its requests in flight. */
class EncoderWorker {
  private readonly worker: Worker;
  private readonly pending = new Map<number, { done: (r: EncoderReply) => void; fail: (e: Error) => void }>();
  private nextId = 0;

  constructor(url: URL) {
    this.worker = new Worker(url, { type: "module" });
    this.worker.onmessage = (ev: MessageEvent<EncoderReply>) => {
      const waiter = this.pending.get(ev.data.id);
      this.pending.delete(ev.data.id);
      if (!waiter) return;
      if (ev.data.op === "error") waiter.fail(new LanternError(`the wasm encoder failed: ${ev.data.message}`));
      else waiter.done(ev.data);
    };
    this.worker.onerror = (ev: ErrorEvent) => {
      ev.preventDefault();
      const err = new LanternError(`the wasm encoder's worker crashed: ${ev.message || "an uncaught error"}`);
      for (const waiter of this.pending.values()) waiter.fail(err);
      this.pending.clear();
    };
  }

  ask(msg: EncoderAsk, transfer: Transferable[] = []): Promise<EncoderReply> {
    const id = this.nextId++;
    return new Promise((done, fail) => {
      this.pending.set(id, { done, fail });
      this.worker.postMessage({ ...msg, id }, transfer);
    });
  }

  terminate(): void {
    this.worker.terminate();
    const err = new EngineNotLoadedError("the engine was unloaded");
    for (const waiter of this.pending.values()) waiter.fail(err);
    this.pending.clear();
  }
}

export class CpuEncoderDevice implements Device {
  readonly kind = "wasm" as const;
  readonly label: string;
  private pool: EncoderWorker[] | null;

  private constructor(
    pool: EncoderWorker[],
    readonly library: string,
    readonly contextWindow: number,
    private readonly workersWhy: string,
  ) {
    this.pool = pool;
    this.label = encoderLabel(pool.length);
  }

  /** Download the library and the weights (verified, cached) and load them into every worker. */
  static async open(
    modelUrl: string,
    manifest: Manifest,
    store: FileStore,
    options: EngineOptions,
    report: (p: LoadProgress) => void,
  ): Promise<CpuEncoderDevice> {
    const lib = encoderLibrary(manifest); // CapabilityError where none runs
    requireWorkers("the wasm device's encoder");
    const fetchOpts = {
      store,
      parallel: options.parallelDownloads ?? 3,
      retries: options.retries ?? 3,
    };
    const [indexBytes] = (
      await fetchFiles(modelUrl, manifest, ["tensor-cache.json"], { ...fetchOpts, onProgress: () => {} })
    ).values();
    const index: TensorCacheIndex = JSON.parse(new TextDecoder().decode(indexBytes));
    const upcast = lib.param_upcast === "float16->float32";
    const weightBytes = index.records
      .flatMap((s) => s.records)
      .reduce((sum, r) => sum + (r.dtype === "float16" && upcast ? 2 * r.nbytes : r.nbytes), 0);
    const { workers, why } = encoderWorkers(options.threads, weightBytes);
    const tell = (p: LoadProgress) => report({ ...p, library: lib.file, device: encoderLabel(workers) });
    const names = [lib.file, ...index.records.map((r) => r.dataPath)];
    const all = names.reduce((s, n) => s + (manifest.files[n]?.size ?? 0), 0);
    const files = new Map<string, ArrayBuffer>();
    await fetchEach(
      modelUrl,
      manifest,
      names,
      { ...fetchOpts, onProgress: (p) => tell({ ...p, totalBytes: all, progress: all ? (0.9 * p.loadedBytes) / all : 0.9 }) },
      (name, data) => files.set(name, data),
    );
    tell({ phase: "wasm-load", loadedBytes: 0, totalBytes: all, progress: 0.9 });
    const url = new URL("./encoder-worker.js", import.meta.url);
    const pool = Array.from({ length: workers }, () => new EncoderWorker(url));
    try {
      const wasm = files.get(lib.file)!;
      const shards = Object.fromEntries(index.records.map((r) => [r.dataPath, files.get(r.dataPath)!]));
      // each worker gets its own copy (structured clone); the last one takes the originals
      await Promise.all(
        pool.map((w, i) =>
          w.ask({ op: "load", wasm, index, shards, upcast }, i === pool.length - 1 ? [wasm, ...Object.values(shards)] : []),
        ),
      );
    } catch (err) {
      for (const w of pool) w.terminate();
      throw new ArtifactError(`the wasm encoder could not load ${lib.file}: ${err instanceof Error ? err.message : String(err)}`);
    }
    tell({ phase: "ready", loadedBytes: all, totalBytes: all, progress: 1 });
    const contextWindow = lib.context_window ?? manifest.model.context_window;
    return new CpuEncoderDevice(pool, lib.file, contextWindow, why);
  }

  private loaded(): EncoderWorker[] {
    if (!this.pool) throw new EngineNotLoadedError("the engine was unloaded");
    return this.pool;
  }

  /** Pooled vectors of token lists: batches of similar lengths, each worker taking the next one free. */
  async embed(lists: number[][], signal?: AbortSignal): Promise<number[][]> {
    const pool = this.loaded();
    const total = lists.reduce((s, t) => s + t.length, 0);
    // about one batch per worker, so that all of them work on a call of short texts
    const batches = embeddingBatches(lists, Math.min(BATCH_TOKENS, Math.ceil(total / pool.length)));
    const vectors: number[][] = new Array(lists.length);
    let next = 0;
    const work = async (w: EncoderWorker) => {
      while (next < batches.length) {
        signal?.throwIfAborted();
        const part = batches[next++];
        const reply = await w.ask({ op: "embed", batch: part.map((i) => lists[i]) });
        if (reply.op !== "vectors") throw new LanternError(`the wasm encoder answered ${reply.op}`);
        for (const [j, i] of part.entries()) vectors[i] = Array.from(reply.vectors[j]);
      }
    };
    await Promise.all(pool.map(work));
    signal?.throwIfAborted();
    return vectors;
  }

  async prepare(): Promise<unknown> {
    throw new InvalidRequestError("an embedding model has no grammars: it answers embeddings.create");
  }

  async start(): Promise<Generation> {
    throw new InvalidRequestError("an embedding model does not generate text: it answers embeddings.create");
  }

  async debug(): Promise<DebugResult> {
    throw new InvalidRequestError("the wasm device's encoder takes no debug measurements");
  }

  stats(): DeviceStats {
    const pool = this.loaded();
    return {
      kvSequences: 0,
      kvAvailablePages: null,
      kvTotalPages: null,
      cachedTokens: 0,
      peakGpuBytes: null,
      adapter: { vendor: "cpu", architecture: `wasm (${workerCount(pool.length)})`, features: [], fallback: false },
      wasm: {
        build: "encoder",
        why: `the artifact's wasm library ${this.library}`,
        threads: pool.length,
        threadsWhy: this.workersWhy,
        restarts: 0,
      },
      grammarCache: { entries: 0, hits: 0 },
    };
  }

  async dispose(): Promise<void> {
    for (const w of this.pool ?? []) w.terminate();
    this.pool = null;
  }
}

const workerCount = (n: number) => `${n} worker${n === 1 ? "" : "s"}`;

export function encoderLabel(workers: number): string {
  return `CPU (wasm encoder, ${workerCount(workers)})`;
}
