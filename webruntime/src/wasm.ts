// The `wasm` device: the artifact's GGUF on llama.cpp compiled to wasm (npm @wllama/wllama), for
// browsers without a usable GPU. llama.cpp runs the model and samples (its SIMD128 integer kernels
// and threads are ~20x faster on a CPU than a software WebGPU adapter); Lantern keeps the rest.
//
// Why llama.cpp samples (and not Lantern's sampler): wllama 3.x exposes llama.cpp's server API,
// which returns sampled tokens, not logits. What Lantern needs is in that API: the sampling fields,
// a seed, logit_bias, logprobs with token ids, prefix reuse (cache_prompt), and a GBNF grammar,
// which Lantern translates from the same xgrammar grammar the webgpu device enforces (gbnf.ts), so
// both devices accept the same requests and produce the same language. Differences: see docs/runtime.md, "Devices".
import { CacheManager, Wllama } from "@wllama/wllama";
import type { Device, DeviceStats, DeviceStep, Generation, GenerationRequest } from "./devices";
import {
  ArtifactError,
  EngineNotLoadedError,
  InvalidRequestError,
  LanternError,
  OutOfMemoryError,
  SharedEngineUnavailableError,
} from "./errors";
import { toLlamaGrammar, type LlamaGrammar } from "./gbnf";
import { chooseLlamaBuild, fetchLlamaBuild, type LlamaBuild, type LlamaFiles, wasmFeatures } from "./llama-builds";
import { chooseThreads, requireWorkers } from "./threads";
import { fetchBlobs, type Manifest } from "./loader";
import type { DebugOp, DebugResult, EngineOptions, LoadProgress, TokenLogprob } from "./protocol";
import type { FileStore } from "./storage";
import { printGrammar } from "./grammars";
import type { GrammarSpec } from "./structured";

/** The wasm device's default context window (EngineOptions.contextWindow changes it). */
export const WASM_CONTEXT = 4096;

// wllama asks for a WebAssembly.Memory of at most 4 GiB (less where the browser refuses), and
// llama.cpp holds everything there: the GGUF's bytes, its KV cache and its compute buffers.
export const WASM_MEMORY_BYTES = 4 * 2 ** 30;
// An allowance for llama.cpp's compute buffers and wllama's own heap, beside weights and cache.
const WASM_WORKSPACE_BYTES = 256 * 2 ** 20;
// texts of an embeddings call llama.cpp runs in one micro-batch (its parallel slots), each as long as the
// model takes, within EMBED_BATCH_TOKENS (an encoder's attention scores grow with the micro-batch squared):
// 64 texts of 64 tokens ran 0.49x transformers.js's speed one text at a time, 0.59x four at a time
const EMBED_SEQUENCES = 4;
const EMBED_BATCH_TOKENS = 2048;

/** The model's shape as mlc-chat-config.json's model_config states it (what the KV cache needs). */
export interface KvShape {
  num_hidden_layers?: number;
  num_key_value_heads?: number;
  head_dim?: number;
}

/** What llama.cpp in wasm needs for ``manifest``'s GGUF at ``contextWindow`` tokens, by part. */
export function wasmMemoryNeed(
  manifest: Manifest,
  model: KvShape,
  contextWindow: number,
): { weights: number; kvCache: number; workspace: number; total: number } {
  const weights = (manifest.gguf?.files ?? []).reduce((sum, f) => sum + (manifest.files[f]?.size ?? 0), 0);
  // llama.cpp's default cache: K and V in float16, every layer, the whole window (an upper bound for
  // sliding-window layers, which llama.cpp keeps shorter)
  const kvCache =
    2 * (model.num_hidden_layers ?? 0) * (model.num_key_value_heads ?? 0) * (model.head_dim ?? 0) * 2 * contextWindow;
  return { weights, kvCache, workspace: WASM_WORKSPACE_BYTES, total: weights + kvCache + WASM_WORKSPACE_BYTES };
}

/** Throw OutOfMemoryError, before anything is downloaded, when the GGUF cannot fit in wasm memory. */
export function checkWasmFits(manifest: Manifest, model: KvShape, contextWindow: number): void {
  const need = wasmMemoryNeed(manifest, model, contextWindow);
  if (need.total <= WASM_MEMORY_BYTES) return;
  const gib = (n: number) => `${(n / 2 ** 30).toFixed(2)} GiB`;
  throw new OutOfMemoryError(
    `the wasm device needs about ${gib(need.total)} (GGUF ${gib(need.weights)}, KV cache of ` +
      `${contextWindow} tokens ${gib(need.kvCache)}, workspace ${gib(need.workspace)}) and llama.cpp in wasm has at most ` +
      `${gib(WASM_MEMORY_BYTES)}; a smaller contextWindow, a smaller model, or the webgpu device`,
  );
}

// llama.cpp's sampler chain in Lantern's order (sampler.ts): penalties, DRY, top_k, temperature, top_p.
const SAMPLERS = ["penalties", "dry", "top_k", "temperature", "top_p"];
// llama.cpp wants at least one DRY sequence breaker (a string that ends a repeat); Lantern's DRY has none
// (JSON's quotes and colons, llama.cpp's defaults, would end every repeat), so it names one no answer
// writes: a raw U+0001, which JSON escapes and a grammar never allows.
const DRY_NO_BREAKERS = ["\u0001"];

interface LlamaLogprob {
  id: number;
  token: string;
  bytes: number[];
  logprob: number;
  top_logprobs?: LlamaLogprob[];
}
interface LlamaChunk {
  choices: { text: string; finish_reason: string | null; logprobs: { content: LlamaLogprob[] } | null }[];
  usage?: { prompt_tokens_details?: { cached_tokens?: number } };
  timings?: { predicted_n: number };
}

/** llama.cpp's load options for an embedding model whose texts take up to ``tokens`` tokens. */
function embeddingContext(tokens: number) {
  const sequences = Math.max(1, Math.min(EMBED_SEQUENCES, Math.floor(EMBED_BATCH_TOKENS / tokens)));
  const batch = sequences * tokens;
  return { embeddings: true, n_parallel: sequences, n_ctx: batch, n_batch: batch, n_ubatch: batch };
}

const threadCount = (n: number) => `${n} thread${n === 1 ? "" : "s"}`;

export function wasmLabel(threads: number, build: LlamaBuild = "default"): string {
  return `CPU (wasm${build === "compat" ? " compat" : ""}, ${threadCount(threads)})`;
}

// wllama's own model cache (OPFS) is not used: Lantern keeps the verified files itself and hands
// llama.cpp Blobs. Without this, wllama's constructor throws where OPFS is missing or off.
type StorageBackend = NonNullable<ConstructorParameters<typeof CacheManager>[0]>[number];
const NO_CACHE: StorageBackend = {
  isSupported: () => true,
  read: async () => null,
  write: async (_key, stream) => {
    await stream.cancel();
  },
  getSize: async () => -1,
  list: async () => [],
  delete: async () => {},
};

// Firefox (153 ESR) can block a worker for good when it starts workers. On a busy 2-core machine,
// loads hung after 5 to 42 loads: mostly in `new Worker` as emscripten created wllama's second thread
// worker, right after wllama's worker said "Multithread enabled" (that step, like the worker's first
// moments, takes milliseconds: a start that stays there START_STALL_S[i] seconds is ended and begun
// again in a fresh worker, at most once per entry, each wait longer; measured: 4 such stalls in 159
// loads, all restarted); and, 3 times, in `new Worker` as this worker created wllama's, which blocks
// this worker, its timers too, so only the page can end it (docs/runtime.md, "Browsers"; ci/bench/bench_firefox_starts.py).
const START_STALL_S = [10, 20, 40];
const POOL_STARTING = /^Multithread enabled/;

/** A Wllama for ``code``, ended by exit() where its worker's start stalls (see START_STALL_S). */
function startLlama(
  code: LlamaFiles,
  build: LlamaBuild,
  stallS: number,
): { wllama: Wllama; stalled: () => boolean; disarm: () => void } {
  let timer: ReturnType<typeof setTimeout> | undefined;
  let stalled = false;
  const disarm = () => {
    clearTimeout(timer);
    timer = undefined;
  };
  const arm = () => {
    timer = setTimeout(() => {
      stalled = true;
      wllama.exit().catch(() => {});
    }, stallS * 1000);
  };
  // its worker's console lines are the only signs of where a start is; llama.cpp's own log lines come
  // the same way (wllama passes them on unless suppressNativeLog): its warnings and errors reach the
  // console, the rest is dropped
  const seen =
    (level: "debug" | "log" | "warn" | "error") =>
    (...args: unknown[]) => {
      disarm();
      if (POOL_STARTING.test(args.map(String).join(" "))) arm();
      if (level === "warn" || level === "error") console[level](...args);
    };
  const logger = { debug: seen("debug"), log: seen("log"), info: seen("log"), warn: seen("warn"), error: seen("error") };
  const wllama = new Wllama({ default: code.wasm }, { logger, cacheManager: new CacheManager([NO_CACHE]) });
  // the build chosen by features, whatever wllama would pick by the browser's name ("firefox_safari": by features)
  wllama.setCompat(build === "compat" ? { wasm: code.wasm, worker: { code: code.glue! } } : null, "firefox_safari");
  arm(); // until the worker's first line
  return { wllama, stalled: () => stalled, disarm };
}

export class WasmDevice implements Device {
  readonly kind = "wasm" as const;
  readonly label: string;
  private wllama: Wllama | null;
  private cached = 0; // tokens of the last conversation llama.cpp keeps for reuse

  private constructor(
    wllama: Wllama,
    readonly library: string,
    readonly contextWindow: number,
    private readonly threads: number,
    readonly build: LlamaBuild,
    readonly buildWhy: string,
    readonly threadsWhy: string,
    private readonly restarts: number,
  ) {
    this.wllama = wllama;
    this.label = wasmLabel(threads, build);
  }

  /** Download the GGUF parts (verified against lantern.json, cached) and load them into llama.cpp. */
  static async open(
    modelUrl: string,
    manifest: Manifest,
    store: FileStore,
    options: EngineOptions,
    report: (p: LoadProgress) => void,
    model: KvShape = {},
  ): Promise<WasmDevice> {
    const parts = manifest.gguf?.files ?? [];
    requireWorkers("the wasm device (llama.cpp)");
    if (!parts.length) {
      throw new ArtifactError(
        "this artifact has no GGUF for the wasm device: rebuild it with the gguf target " +
          "(`lantern build ... --targets webgpu,cpu,gguf`, the default)",
      );
    }
    const features = wasmFeatures();
    const { build, why } = chooseLlamaBuild(features); // CapabilityError before any download
    if (options.requireThreads && !features.threads) {
      throw new SharedEngineUnavailableError(
        "the SharedWorker has no SharedArrayBuffer (it is not cross-origin " +
          "isolated as the page is), so llama.cpp would run on one thread there; a dedicated worker gives it several",
      );
    }
    const { threads, why: threadsWhy } = await chooseThreads(options.threads, features.threads);
    const library = parts.length === 1 ? parts[0] : `${parts[0]} (+${parts.length - 1} parts)`;
    const tell = (p: LoadProgress) => report({ ...p, library, device: wasmLabel(threads, build) });
    // llama.cpp allocates the whole KV cache up front (memory and load time grow with it), and a CPU
    // prefills ~20 tokens/s: the default window is at most WASM_CONTEXT tokens
    const contextWindow = Math.min(
      options.contextWindow ?? WASM_CONTEXT,
      manifest.gguf?.context_window ?? manifest.model.context_window,
    );
    checkWasmFits(manifest, model, contextWindow);
    // llama.cpp itself (10-19 MB) comes while the GGUF does
    const llama = fetchLlamaBuild(build, new URL("./", import.meta.url).href, store);
    llama.catch(() => {}); // awaited below
    const files = await fetchBlobs(modelUrl, manifest, parts, {
      store,
      parallel: options.parallelDownloads ?? 3,
      retries: options.retries ?? 3,
      onProgress: (p) => tell({ ...p, progress: 0.9 * p.progress }),
    });
    const total = parts.reduce((s, f) => s + manifest.files[f].size, 0);
    tell({ phase: "wasm-load", loadedBytes: 0, totalBytes: total, progress: 0.9 });
    const code = await llama;
    const config = {
      // n_gpu_layers 0: llama.cpp's CPU kernels (wllama would otherwise offload to WebGPU)
      n_threads: threads,
      n_gpu_layers: 0,
      n_ctx: contextWindow,
      n_parallel: 1,
      // repeatable answers: llama.cpp's CPU flash attention (on by default) gives a prompt's last token,
      // computed alone on a cache hit, other logits than inside the prompt's chunk, and the same request
      // asked again then changed its answer (12 of 26 JSONSchemaBench answers); without it a row's logits
      // are the same bits alone or in any chunk (tests/test_wasm_device.py)
      flash_attn: false,
      // an embedding model: llama.cpp pools (the GGUF's pooling_type); an encoder runs a whole text in one
      // micro-batch (llama.cpp asserts n_ubatch >= its tokens), and EMBED_SEQUENCES texts share one
      ...(manifest.model.kind === "embedding" ? embeddingContext(contextWindow) : {}),
      kv_overrides: Object.fromEntries(
        Object.entries(manifest.gguf?.kv_overrides ?? {}).map(([key, value]) => [key, `int:${value}`]),
      ),
    };
    let wllama: Wllama;
    let restarts = 0;
    try {
      for (;;) {
        const start = startLlama(code, build, START_STALL_S[restarts]);
        try {
          await start.wllama.loadModel(
            parts.map((f) => files.get(f)!),
            config,
          );
          wllama = start.wllama;
          break;
        } catch (err) {
          if (start.stalled() && restarts < START_STALL_S.length - 1) {
            console.warn(
              `lantern: llama.cpp's worker stalled for ${START_STALL_S[restarts]} s while starting ` +
                "(Firefox can block a worker that starts workers): starting it again",
            );
            restarts += 1;
            continue;
          }
          const why = start.stalled()
            ? `its worker stalled while starting, ${restarts + 1} times (the last wait ${START_STALL_S[restarts]} s)`
            : err instanceof Error
              ? err.message
              : String(err);
          throw new ArtifactError(`llama.cpp (${build} build) could not load ${parts[0]}: ${why}`);
        } finally {
          start.disarm();
        }
      }
    } finally {
      code.release();
    }
    // wllama resolves a load that llama.cpp failed; the vocabulary size tells
    const vocab = wllama.isModelLoaded() ? wllama.getLoadedContextInfo().n_vocab : 0;
    if (vocab !== manifest.model.vocab_size) {
      await wllama.exit().catch(() => {});
      throw new ArtifactError(
        `llama.cpp did not load ${parts[0]} (vocabulary ${vocab}, lantern.json says ` + `${manifest.model.vocab_size})`,
      );
    }
    tell({ phase: "ready", loadedBytes: total, totalBytes: total, progress: 1 });
    return new WasmDevice(wllama, library, contextWindow, wllama.getNumThreads(), build, why, threadsWhy, restarts);
  }

  private loaded(): Wllama {
    if (!this.wllama) throw new EngineNotLoadedError("the engine was unloaded");
    return this.wllama;
  }

  async embed(lists: number[][], signal?: AbortSignal): Promise<number[][]> {
    const wllama = this.loaded();
    signal?.throwIfAborted(); // an AbortError, as fetch's
    // one request for every text (llama.cpp pools each as its own sequence): a request per text cost about
    // 0.1 s of round trips each, more than a short text's compute
    let res: Awaited<ReturnType<Wllama["createEmbedding"]>>;
    try {
      res = await wllama.createEmbedding({ input: lists, embd_normalize: -1 });
    } catch (err) {
      throw new LanternError(`llama.cpp could not embed the input: ${err instanceof Error ? err.message : String(err)}`);
    }
    signal?.throwIfAborted();
    const vectors: number[][] = new Array(lists.length);
    for (const item of res.data) vectors[item.index] = item.embedding as number[];
    return vectors;
  }

  async prepare(spec: GrammarSpec): Promise<LlamaGrammar> {
    const { text, root } = await printGrammar(spec);
    return toLlamaGrammar(text, root);
  }

  async start(req: GenerationRequest): Promise<Generation> {
    const wllama = this.loaded();
    const p = req.params;
    const grammar = req.grammar as LlamaGrammar | null;
    const ctrl = new AbortController();
    const body: Record<string, unknown> = {
      prompt: req.promptText,
      stream: true,
      abortSignal: ctrl.signal,
      max_tokens: req.maxTokens,
      cache_prompt: true,
      temperature: p.temperature,
      top_k: p.topK,
      top_p: p.topP,
      min_p: 0,
      typical_p: 1,
      samplers: SAMPLERS,
      repeat_penalty: p.repetitionPenalty,
      repeat_last_n: this.contextWindow, // the penalty window: everything
      presence_penalty: p.presencePenalty,
      frequency_penalty: p.frequencyPenalty,
      dry_multiplier: p.dryMultiplier,
      dry_base: p.dryBase,
      dry_allowed_length: p.dryAllowedLength,
      // -1 (all) as the window it is: llama.cpp in wasm fails a request that sends -1
      dry_penalty_last_n: p.dryPenaltyLastN < 0 ? this.contextWindow : p.dryPenaltyLastN,
      dry_sequence_breakers: DRY_NO_BREAKERS,
      logit_bias: [...p.logitBias],
    };
    // Token ids come only with logprobs, which cost llama.cpp a sort of the vocabulary per token: they
    // are asked for when the request needs ids (logprobs, extra stop tokens); otherwise the running
    // token count (timings_per_token) tells how many tokens each chunk's text holds.
    const extraStops = [...req.stopTokenIds].some((id) => !wllama.isTokenEOG(id));
    const wantIds = p.topLogprobs >= 0 || extraStops;
    if (wantIds) body.n_probs = Math.max(1, p.topLogprobs);
    else body.timings_per_token = true;
    if (p.seed !== null) body.seed = Number(BigInt.asUintN(32, BigInt(p.seed)));
    if (grammar) {
      body.grammar = grammar.grammar;
      if (grammar.triggers)
        Object.assign(body, { grammar_lazy: true, grammar_triggers: grammar.triggers.map((value) => ({ type: 1, value })) });
    }
    let chunks: AsyncIterable<LlamaChunk>;
    try {
      chunks = (await wllama.createCompletion(body as never)) as unknown as AsyncIterable<LlamaChunk>;
    } catch (err) {
      throw new LanternError(`llama.cpp did not start the request: ${err instanceof Error ? err.message : err}`);
    }
    const it = chunks[Symbol.asyncIterator]();
    const ready: DeviceStep[] = [];
    let done = false; // the stream ended
    let finished = false; // llama.cpp ended the answer (its last chunks carry only usage)
    let handedOut = 0;
    let counted = 0; // tokens llama.cpp reported so far (timings_per_token)
    let cached = 0; // llama.cpp reports it with the usage, after the last token
    const device = this;
    const wantLogprobs = p.topLogprobs >= 0;
    const read = async (): Promise<void> => {
      let step: IteratorResult<LlamaChunk>;
      try {
        step = await it.next();
      } catch (err) {
        if (ctrl.signal.aborted) throw err;
        throw new LanternError(`llama.cpp failed during the request: ${err instanceof Error ? err.message : err}`);
      }
      const { value, done: end } = step;
      if (end) {
        done = true;
        return;
      }
      const choice = value.choices[0];
      if (wantIds) {
        const tokens = choice?.logprobs?.content ?? [];
        tokens.forEach((t, i) => {
          ready.push({
            token: t.id,
            text: i === tokens.length - 1 ? choice.text : "",
            logprob: wantLogprobs ? logprobEntry(t, p.topLogprobs) : null,
          });
        });
      } else if (choice?.finish_reason) {
        // the last chunk's count includes a stop token, which has no text; text here is the last token's
        if (choice.text) ready.push({ token: -1, text: choice.text, logprob: null });
      } else if (value.timings) {
        const n = value.timings.predicted_n - counted;
        counted = value.timings.predicted_n;
        for (let i = 0; i < n; i++) ready.push({ token: -1, text: i === n - 1 ? (choice?.text ?? "") : "", logprob: null });
      }
      if (value.usage) cached = value.usage.prompt_tokens_details?.cached_tokens ?? 0;
      if (choice?.finish_reason) finished = true;
    };
    const gen: Generation = {
      get cachedTokens() {
        return cached;
      },
      async next(): Promise<DeviceStep | null> {
        while (!ready.length && !done) await read();
        const step = ready.shift();
        if (!step || req.stopTokenIds.has(step.token)) return null;
        handedOut++;
        return step;
      },
      async close(how): Promise<void> {
        // llama.cpp stops by itself after a stop token or max_tokens; anything else is cut short
        if (!finished && !(how === "done" && handedOut >= req.maxTokens)) ctrl.abort();
        try {
          while (!done) await read();
        } catch {
          // an aborted stream ends with an error
        }
        device.cached = how === "done" ? req.prompt.length : 0;
      },
    };
    return gen;
  }

  /** Greedy tokens after raw token ids, for `lantern validate`; logits and NLL need the webgpu device. */
  async debug(req: DebugOp): Promise<DebugResult> {
    if (req.op !== "greedy") throw new InvalidRequestError(`the wasm device does not measure ${req.op}; the webgpu device does`);
    const wllama = this.loaded();
    const t0 = performance.now();
    const chunks = (await wllama.createCompletion({
      prompt: req.text ?? "",
      max_tokens: req.maxTokens,
      temperature: 0,
      top_k: 1,
      samplers: ["top_k"],
      n_probs: 1,
      cache_prompt: false,
      stream: true,
    } as never)) as unknown as AsyncIterable<LlamaChunk>;
    const tokens: number[] = [];
    let first = 0;
    for await (const chunk of chunks) {
      for (const t of chunk.choices[0]?.logprobs?.content ?? []) {
        if (!first) first = performance.now();
        if (!wllama.isTokenEOG(t.id)) tokens.push(t.id);
      }
    }
    this.cached = 0;
    const end = performance.now();
    // the first token comes with the prompt's evaluation; each later one is a decode step
    return {
      tokens,
      prefillMs: (first || end) - t0,
      decodeMs: first ? end - first : 0,
      decodeSteps: Math.max(0, tokens.length - 1),
    };
  }

  stats(): DeviceStats {
    this.loaded();
    return {
      kvSequences: 1,
      kvAvailablePages: null,
      kvTotalPages: null,
      cachedTokens: this.cached,
      peakGpuBytes: null,
      adapter: { vendor: "cpu", architecture: `wasm (${threadCount(this.threads)})`, features: [], fallback: false },
      wasm: {
        build: this.build,
        why: this.buildWhy,
        threads: this.threads,
        threadsWhy: this.threadsWhy,
        restarts: this.restarts,
      },
      grammarCache: { entries: 0, hits: 0 },
    };
  }

  async dispose(): Promise<void> {
    await this.wllama?.exit();
    this.wllama = null;
  }
}

function logprobEntry(t: LlamaLogprob, top: number): TokenLogprob {
  const plain = (x: LlamaLogprob) => ({ token: x.token, logprob: x.logprob, bytes: x.bytes });
  return { ...plain(t), top_logprobs: (t.top_logprobs ?? []).slice(0, top).map(plain) };
}
