// The `webgpu` device: the artifact's TVM library on a WebGPU adapter (model.ts), Lantern's own
// sampler (sampler.ts) and xgrammar token masks (structured.ts), one KV sequence reused across turns;
// for an embedding model, the library's pooled vectors of batches of texts.
import type { CompiledGrammar } from "@mlc-ai/web-xgrammar";
import { checkFits, type Gpu } from "./device";
import type { Device, DeviceStats, DeviceStep, Generation, GenerationRequest } from "./devices";
import { embeddingBatches } from "./embeddings";
import { EngineNotLoadedError } from "./errors";
import { chooseLibrary, deviceLabel } from "./library";
import { fetchEach, fetchFiles, type Manifest } from "./loader";
import { largestTensorBytes, TvmModel, type TensorCacheIndex } from "./model";
import type { DebugOp, DebugResult, EngineOptions, EngineStats, LoadProgress, TokenLogprob } from "./protocol";
import { Sampler, type Sampled } from "./sampler";
import type { FileStore } from "./storage";
import type { GrammarCompiler, LazyGrammars, TokenMask } from "./grammars";
import type { GrammarSpec } from "./structured";
import { StreamingDetokenizer, type TextCodec } from "./text";

// The one sequence the device keeps: the last finished conversation, for reuse by the next turn.
const SEQ = 0;
// An embedding call's padded tokens (texts x longest): a few MB of activations, as lantern serve's tvm engine.
const EMBED_BATCH_TOKENS = 8192;

function commonPrefix(a: number[], b: number[]): number {
  let n = 0;
  while (n < a.length && n < b.length && a[n] === b[n]) n++;
  return n;
}

export interface WebGpuLoad {
  modelUrl: string;
  manifest: Manifest;
  gpu: Gpu;
  store: FileStore;
  options: EngineOptions;
  codec: TextCodec;
  grammars: LazyGrammars;
  stopTokenIds: Set<number>;
  report: (p: LoadProgress) => void;
}

export class WebGpuDevice implements Device {
  readonly kind = "webgpu" as const;
  readonly label: string;
  private model: TvmModel | null;
  private kvTokens: number[] = [];

  private constructor(
    model: TvmModel,
    readonly library: string,
    private readonly adapter: EngineStats["adapter"],
    private readonly load: WebGpuLoad,
  ) {
    this.model = model;
    this.label = deviceLabel(adapter);
  }

  /** Pick the adapter's library, download it and the weights (verified), upload and compile. */
  static async open(load: WebGpuLoad): Promise<WebGpuDevice> {
    const { modelUrl, manifest, gpu, store, options } = load;
    const lib = chooseLibrary(manifest, gpu);
    const adapter = {
      vendor: gpu.adapterInfo.vendor,
      architecture: gpu.adapterInfo.architecture,
      features: [...gpu.features].sort(),
      fallback: gpu.emulated,
    };
    const report = (p: LoadProgress) => load.report({ ...p, library: lib.file, device: deviceLabel(adapter) });
    const [indexBytes] = (
      await fetchFiles(modelUrl, manifest, ["tensor-cache.json"], {
        store,
        parallel: 1,
        retries: options.retries ?? 3,
        onProgress: () => {},
      })
    ).values();
    const index: TensorCacheIndex = JSON.parse(new TextDecoder().decode(indexBytes));
    const upcast = lib.param_upcast === "float16->float32";
    checkFits(manifest, largestTensorBytes(index, upcast), gpu.device);

    // Downloads (the library, then the shards) are 90% of the bar; upload and pipeline compile share the
    // rest. Each shard goes to the GPU as soon as it is verified, while the others download (fetchEach).
    const shardNames = index.records.map((r) => r.dataPath);
    const libBytes = manifest.files[lib.file]?.size ?? 0;
    const all = [lib.file, ...shardNames].reduce((s, n) => s + (manifest.files[n]?.size ?? 0), 0);
    const fetchOpts = (before: number) => ({
      store,
      parallel: options.parallelDownloads ?? 3,
      retries: options.retries ?? 3,
      onProgress: (p: LoadProgress) =>
        report({
          ...p,
          loadedBytes: before + p.loadedBytes,
          totalBytes: all,
          progress: all ? (0.9 * (before + p.loadedBytes)) / all : 0.9,
        }),
    });
    const [wasm] = (await fetchFiles(modelUrl, manifest, [lib.file], fetchOpts(0))).values();
    const total = manifest.weights.bytes;
    const model = await TvmModel.load(
      wasm,
      gpu,
      index,
      async (upload) => {
        await fetchEach(modelUrl, manifest, shardNames, fetchOpts(libBytes), upload);
        report({ phase: "gpu-upload", loadedBytes: total, totalBytes: total, progress: 0.95 }); // all uploaded
      },
      {
        upcast,
        contextWindow: options.contextWindow,
        embedding: manifest.model.kind === "embedding",
        onCompile: (done, n) =>
          report({ phase: "pipeline-compile", loadedBytes: done, totalBytes: n, progress: 0.95 + (0.05 * done) / n }),
      },
    );
    report({ phase: "ready", loadedBytes: total, totalBytes: total, progress: 1 });
    return new WebGpuDevice(model, lib.file, adapter, load);
  }

  get contextWindow(): number {
    return this.loaded().contextWindow;
  }

  private loaded(): TvmModel {
    if (!this.model) throw new EngineNotLoadedError("the engine was unloaded");
    return this.model;
  }

  private grammarCompiler(): Promise<GrammarCompiler> {
    return this.load.grammars.compiler();
  }

  /** Pooled vectors of token lists, computed in padded batches of similar lengths. */
  async embed(lists: number[][], signal?: AbortSignal): Promise<number[][]> {
    const model = this.loaded();
    const vectors: number[][] = new Array(lists.length);
    for (const part of embeddingBatches(lists, EMBED_BATCH_TOKENS)) {
      signal?.throwIfAborted();
      const pooled = await model.encode(part.map((i) => lists[i]));
      for (const [j, i] of part.entries()) vectors[i] = Array.from(pooled[j]);
    }
    return vectors;
  }

  async prepare(spec: GrammarSpec): Promise<CompiledGrammar> {
    return (await this.grammarCompiler()).compile(spec);
  }

  async start(req: GenerationRequest): Promise<Generation> {
    const model = this.loaded();
    const mask: TokenMask | null = req.grammar
      ? await (await this.grammarCompiler()).matcher(req.grammar as CompiledGrammar)
      : null;
    const { prompt, params } = req;
    // Reuse the previous turn's KV entries for the shared prefix. The last token always runs, as a
    // decode step of its own: TVM's KV cache gives a chunk's rows other bits than a step's, so a
    // repeated prompt (only its last token runs) gets the logits it got the first time (runner.py's
    // prefill_reusing does the same for the tvm engine).
    let reuse = Math.min(commonPrefix(this.kvTokens, prompt), prompt.length - 1);
    if (model.sequenceCount && reuse > 0) {
      model.popTokens(SEQ, this.kvTokens.length - reuse);
    } else {
      model.removeSequence(SEQ);
      model.addSequence(SEQ);
      reuse = 0;
    }
    this.kvTokens = prompt.slice(0, reuse);
    let logits: Float32Array;
    try {
      if (prompt.length - reuse > 1) await model.forward(SEQ, prompt.slice(reuse, -1), false);
      logits = await model.forward(SEQ, prompt.slice(-1));
    } catch (err) {
      mask?.dispose();
      this.release();
      throw err;
    }
    this.kvTokens = prompt.slice();
    const sampler = new Sampler(params, prompt);
    const detok = new StreamingDetokenizer(this.load.codec);
    let last = -1; // the token handed out last, not yet run through the model
    return {
      cachedTokens: reuse,
      next: async (): Promise<DeviceStep | null> => {
        if (last >= 0) {
          logits = await model.forward(SEQ, [last]);
          this.kvTokens.push(last);
          last = -1;
        }
        const s = sampler.sample(logits, mask ? await mask.allowed() : undefined);
        if (req.stopTokenIds.has(s.token)) return null;
        sampler.accept(s.token);
        mask?.accept(s.token);
        last = s.token;
        return { token: s.token, text: detok.push(s.token), logprob: params.topLogprobs >= 0 ? this.logprobEntry(s) : null };
      },
      close: async (how) => {
        mask?.dispose();
        if (how !== "done") this.release();
      },
    };
  }

  /** Free the conversation's KV pages (after a cancelled or failed request). */
  private release(): void {
    this.model?.removeSequence(SEQ);
    this.kvTokens = [];
  }

  private logprobEntry(s: Sampled): TokenLogprob {
    const entry = (id: number, lp: number) => {
      const token = this.load.codec.decode([id]);
      return { token, logprob: lp, bytes: Array.from(new TextEncoder().encode(token)) };
    };
    return { ...entry(s.token, s.logprob), top_logprobs: s.top.map(([id, lp]) => entry(id, lp)) };
  }

  /** Measurements on raw token ids for `lantern validate`; they use the KV sequence afresh. */
  async debug(req: DebugOp): Promise<DebugResult> {
    const model = this.loaded();
    this.release();
    model.addSequence(SEQ);
    try {
      if (req.op === "nll") return { nll: await model.tokenNll(SEQ, req.tokens) };
      if (req.op === "logits") return { logits: Array.from(await model.forward(SEQ, req.tokens)) };
      const out: number[] = [];
      const t0 = performance.now();
      let logits = await model.forward(SEQ, req.prompt);
      const t1 = performance.now();
      let steps = 0;
      while (out.length < req.maxTokens) {
        let best = 0;
        for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
        if (this.load.stopTokenIds.has(best)) break;
        out.push(best);
        if (out.length < req.maxTokens) {
          logits = await model.forward(SEQ, [best]);
          steps++;
        }
      }
      return { tokens: out, prefillMs: t1 - t0, decodeMs: performance.now() - t1, decodeSteps: steps };
    } finally {
      model.removeSequence(SEQ);
    }
  }

  /** Test hook: destroy the GPU device, as a driver reset would; the next step fails with DeviceLostError. */
  loseDevice(): void {
    this.loaded().loseDevice("destroyed by debugLoseDevice()");
  }

  stats(): DeviceStats {
    const model = this.loaded();
    return {
      kvSequences: model.sequenceCount,
      kvAvailablePages: model.availablePages(),
      kvTotalPages: model.totalPages,
      cachedTokens: this.kvTokens.length,
      peakGpuBytes: model.peakGpuBytes,
      adapter: this.adapter,
      grammarCache: { entries: this.load.grammars.ready?.entries ?? 0, hits: this.load.grammars.ready?.hits ?? 0 },
      wasm: null,
    };
  }

  async dispose(): Promise<void> {
    this.model?.dispose();
    this.model = null;
  }
}
