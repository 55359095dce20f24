// A Lantern model library on WebGPU through tvmjs: weights on the GPU, one paged KV cache,
// and a forward step that appends tokens to a sequence and returns the last position's logits. An
// embedding model's library has one function instead, `embed` (pooled vectors of a padded batch).
import * as tvmjs from "@mlc-ai/web-runtime";
import { ArtifactError, DeviceLostError, OutOfMemoryError } from "./errors";
import type { Gpu } from "./device";

interface TensorRecord {
  name: string;
  shape: number[];
  dtype: string;
  nbytes: number;
  byteOffset: number;
}
export interface TensorCacheIndex {
  records: { dataPath: string; records: TensorRecord[] }[];
}

interface LibraryMetadata {
  params: { name: string }[];
  context_window_size: number;
  prefill_chunk_size: number;
}

const PAGE_SIZE = 16;

function halfToFloat(h: number): number {
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const f = h & 0x3ff;
  if (e === 0) return s * 2 ** -14 * (f / 1024);
  if (e === 31) return f ? NaN : s * Infinity;
  return s * 2 ** (e - 15) * (1 + f / 1024);
}

/** Upload one shard's tensors (``bytes``) to ``dev`` into ``byName``: float16 ones as float32 where ``upcast``. */
export function uploadShard(
  tvm: tvmjs.Instance,
  dev: tvmjs.DLDevice,
  records: TensorRecord[],
  bytes: ArrayBuffer,
  upcast: boolean,
  byName: Map<string, tvmjs.Tensor>,
): void {
  for (const rec of records) {
    const raw = new Uint8Array(bytes, rec.byteOffset, rec.nbytes);
    const half = rec.dtype === "float16" && upcast;
    const t = tvm.detachFromCurrentScope(tvm.empty(rec.shape, half ? "float32" : rec.dtype, dev));
    if (half) t.copyFrom(Float32Array.from(new Uint16Array(raw.slice().buffer), halfToFloat));
    else t.copyFromRawBytes(raw);
    byName.set(rec.name, t);
  }
}

/** The library's parameters in the order its ``_metadata`` names them (ArtifactError naming any missing). */
export function paramArray(
  tvm: tvmjs.Instance,
  metadata: Pick<LibraryMetadata, "params">,
  byName: Map<string, tvmjs.Tensor>,
): tvmjs.TVMArray {
  const missing = metadata.params.filter((p) => !byName.has(p.name)).map((p) => p.name);
  if (missing.length) throw new ArtifactError(`tensor-cache.json lacks parameters ${missing.slice(0, 3).join(", ")}`);
  return tvm.detachFromCurrentScope(tvm.makeTVMArray(metadata.params.map((p) => byName.get(p.name))));
}

/** An embedding library's inputs for ``batch``: token ids right-padded to the longest, and the attention mask. */
export function paddedBatch(batch: number[][]): { ids: Int32Array; mask: Int32Array; n: number } {
  const n = Math.max(...batch.map((t) => t.length));
  const ids = new Int32Array(batch.length * n);
  const mask = new Int32Array(batch.length * n);
  for (const [i, tokens] of batch.entries()) {
    ids.set(tokens, i * n);
    mask.fill(1, i * n, i * n + tokens.length);
  }
  return { ids, mask, n };
}

export function largestTensorBytes(index: TensorCacheIndex, upcast: boolean): number {
  let max = 0;
  for (const shard of index.records) {
    for (const r of shard.records) max = Math.max(max, r.dtype === "float16" && upcast ? r.nbytes * 2 : r.nbytes);
  }
  return max;
}

export class TvmModel {
  private lostReason: string | null = null;
  private readonly fn: Record<string, tvmjs.PackedFunc> = {};
  private readonly builtin: Record<string, tvmjs.PackedFunc> = {};
  private kv: tvmjs.TVMObject | null = null;
  readonly totalPages: number;
  readonly contextWindow: number;
  readonly prefillChunk: number;
  private readonly sequences = new Set<number>();

  private constructor(
    private readonly tvm: tvmjs.Instance,
    private readonly vm: tvmjs.VirtualMachine,
    private readonly params: tvmjs.TVMObject,
    readonly metadata: LibraryMetadata,
    private readonly gpu: Gpu,
    contextWindow: number,
    readonly embedding: boolean,
  ) {
    this.contextWindow = contextWindow;
    this.prefillChunk = Math.min(metadata.prefill_chunk_size, contextWindow);
    gpu.device.lost.then((info) => {
      this.lostReason = info.message || info.reason || "unknown";
    });
    tvm.beginScope();
    const entries = embedding ? ["embed"] : ["embed", "prefill", "decode", "batch_prefill", "create_tir_paged_kv_cache"];
    for (const name of entries) {
      this.fn[name] = tvm.detachFromCurrentScope(vm.getFunction(name));
    }
    if (embedding) {
      tvm.endScope();
      this.totalPages = 0;
      return;
    }
    for (const name of [
      "kv_state_add_sequence",
      "kv_state_remove_sequence",
      "kv_state_popn",
      "kv_state_begin_forward",
      "kv_state_end_forward",
      "attention_kv_cache_get_num_available_pages",
    ]) {
      this.builtin[name] = tvm.detachFromCurrentScope(tvm.getGlobalFunc(`vm.builtin.${name}`));
    }
    this.kv = tvm.detachFromCurrentScope(
      this.fn.create_tir_paged_kv_cache(
        tvm.makeShapeTuple([1]),
        tvm.makeShapeTuple([contextWindow]),
        tvm.makeShapeTuple([this.prefillChunk]),
        tvm.makeShapeTuple([PAGE_SIZE]),
        tvm.makeShapeTuple([0]),
      ),
    );
    tvm.endScope();
    this.totalPages = this.availablePages();
  }

  /**
   * Instantiate the library, upload the weights and compile every pipeline. ``fetchShards`` gets the
   * weight shards that ``index`` names and hands each to its ``upload`` as it comes (in any order),
   * so a shard's bytes can go once it is on the GPU.
   */
  static async load(
    wasm: ArrayBuffer,
    gpu: Gpu,
    index: TensorCacheIndex,
    fetchShards: (upload: (name: string, bytes: ArrayBuffer) => void) => Promise<void>,
    opts: {
      upcast: boolean;
      contextWindow?: number;
      embedding?: boolean;
      onCompile: (done: number, total: number) => void;
    },
  ): Promise<TvmModel> {
    const tvm = await tvmjs.instantiate(wasm, tvmjs.createPolyfillWASI(), () => {});
    tvm.initWebGPU(gpu.device);
    const dev = tvm.webgpu();
    gpu.device.pushErrorScope("out-of-memory");
    tvm.beginScope();
    const vm = tvm.detachFromCurrentScope(tvm.createVirtualMachine(dev));
    let metadata: LibraryMetadata;
    try {
      metadata = JSON.parse(vm.getFunction("_metadata")());
    } catch (err) {
      throw new ArtifactError(`the model library has no readable _metadata: ${err}`);
    }
    const byName = new Map<string, tvmjs.Tensor>();
    const pending = new Map(index.records.map((shard) => [shard.dataPath, shard]));
    await fetchShards((name, bytes) => {
      const shard = pending.get(name);
      if (!shard) throw new ArtifactError(`${name} is not a weight shard of tensor-cache.json, or came twice`);
      pending.delete(name);
      uploadShard(tvm, dev, shard.records, bytes, opts.upcast, byName);
    });
    if (pending.size) throw new ArtifactError(`shard ${[...pending.keys()][0]} was not loaded`);
    const params = paramArray(tvm, metadata, byName);
    tvm.endScope();

    tvm.beginScope();
    const kernels = Object.keys(JSON.parse(vm.getInternalModule().getFunction("webgpu.get_fmap", true)())).length;
    tvm.endScope();
    let compiled = 0;
    tvm.registerInitProgressCallback((r: { progress: number }) => {
      compiled = Math.round(r.progress * kernels);
      opts.onCompile(compiled, kernels);
    });
    await tvm.asyncLoadWebGPUPipelines(vm.getInternalModule());
    const model = new TvmModel(
      tvm,
      vm,
      params,
      metadata,
      gpu,
      Math.min(opts.contextWindow ?? metadata.context_window_size, metadata.context_window_size),
      opts.embedding ?? false,
    );
    await tvm.webgpu().sync();
    const oom = await gpu.device.popErrorScope();
    if (oom) throw new OutOfMemoryError(`the GPU ran out of memory while loading the model: ${oom.message}`);
    return model;
  }

  loseDevice(reason: string): void {
    this.lostReason = reason;
    this.gpu.device.destroy();
  }

  private check(): void {
    if (this.lostReason !== null) throw new DeviceLostError(`the GPU device was lost: ${this.lostReason}`);
  }

  availablePages(): number {
    return this.kv ? Number(this.builtin.attention_kv_cache_get_num_available_pages(this.kv)) : 0;
  }

  get sequenceCount(): number {
    return this.sequences.size;
  }

  get peakGpuBytes(): number {
    const ctx = (this.tvm as unknown as { lib: { webGPUContext?: { peakAllocatedBytes: number } } }).lib.webGPUContext;
    return ctx?.peakAllocatedBytes ?? 0;
  }

  addSequence(seq: number): void {
    this.check();
    this.builtin.kv_state_add_sequence(this.kv, new tvmjs.Scalar(seq, "int64"));
    this.sequences.add(seq);
  }

  removeSequence(seq: number): void {
    if (!this.sequences.delete(seq)) return;
    this.builtin.kv_state_remove_sequence(this.kv, new tvmjs.Scalar(seq, "int64"));
  }

  /** Drop the last ``n`` tokens of a sequence (the part of a cached turn the new prompt differs in). */
  popTokens(seq: number, n: number): void {
    if (n > 0) this.builtin.kv_state_popn(this.kv, new tvmjs.Scalar(seq, "int64"), new tvmjs.Scalar(n, "int32"));
  }

  /** Append ``tokens`` to sequence ``seq`` (in prefill chunks); the logits after the last one. */
  forward(seq: number, tokens: number[]): Promise<Float32Array>;
  /** With ``read`` false, only append them (no logits are copied back). */
  forward(seq: number, tokens: number[], read: false): Promise<null>;
  forward(seq: number, tokens: number[], read = true): Promise<Float32Array | null> {
    return this.guarded(async () => {
      let logits: Float32Array | null = null;
      for (let start = 0; start < tokens.length; start += this.prefillChunk) {
        const chunk = tokens.slice(start, start + this.prefillChunk);
        const last = start + this.prefillChunk >= tokens.length;
        const out = await this.step(seq, chunk, chunk.length > 1 ? "prefill" : "decode", read && last);
        if (out) logits = out.data;
      }
      if (!tokens.length) throw new Error("forward called with no tokens");
      return logits;
    });
  }

  /**
   * Append ``tokens`` to ``seq`` and return, for every position but the last, the negative
   * log-likelihood of the token that follows it (perplexity = exp(mean)).
   */
  tokenNll(seq: number, tokens: number[]): Promise<number[]> {
    return this.guarded(async () => {
      const nll: number[] = [];
      for (let start = 0; start < tokens.length; start += this.prefillChunk) {
        const chunk = tokens.slice(start, start + this.prefillChunk);
        const { data: all, vocab } = (await this.step(seq, chunk, "batch_prefill", true))!;
        for (let i = 0; i < chunk.length && start + i + 1 < tokens.length; i++) {
          const row = all.subarray(i * vocab, (i + 1) * vocab);
          let max = -Infinity;
          for (const v of row) if (v > max) max = v;
          let sum = 0;
          for (const v of row) sum += Math.exp(v - max);
          nll.push(max + Math.log(sum) - row[tokens[start + i + 1]]);
        }
      }
      return nll;
    });
  }

  /**
   * An embedding library's pooled vectors (before normalization) of ``batch``: right-padded to its
   * longest, with an attention mask of 1 on tokens and 0 on padding, in one call.
   */
  encode(batch: number[][]): Promise<Float32Array[]> {
    return this.guarded(async () => {
      const { tvm } = this;
      const { ids, mask, n } = paddedBatch(batch);
      tvm.beginScope();
      try {
        const gpuIds = tvm.empty([batch.length, n], "int32", tvm.webgpu());
        gpuIds.copyFrom(ids);
        const gpuMask = tvm.empty([batch.length, n], "int32", tvm.webgpu());
        gpuMask.copyFrom(mask);
        const out = this.fn.embed(gpuIds, gpuMask, this.params);
        const host = tvm.empty(out.shape, out.dtype, tvm.cpu());
        host.copyFrom(out);
        await tvm.webgpu().sync();
        const all = host.toArray() as Float32Array;
        const width = out.shape[1];
        return batch.map((_, i) => all.slice(i * width, (i + 1) * width));
      } finally {
        tvm.endScope();
      }
    });
  }

  /** Run ``work`` on the device; any failure after a device loss is reported as the loss. */
  private async guarded<T>(work: () => Promise<T>): Promise<T> {
    this.check();
    try {
      const result = await work();
      this.check();
      return result;
    } catch (err) {
      this.check();
      throw err;
    }
  }

  /**
   * One chunk through ``entry`` (prefill/decode: last position's logits; batch_prefill: every
   * position's). With ``read``, the logits are copied to the host.
   */
  private async step(
    seq: number,
    chunk: number[],
    entry: "prefill" | "decode" | "batch_prefill",
    read: boolean,
  ): Promise<{ data: Float32Array; vocab: number } | null> {
    const { tvm } = this;
    tvm.beginScope();
    try {
      const ids = tvm.empty([chunk.length], "int32", tvm.webgpu());
      ids.copyFrom(Int32Array.from(chunk));
      const emb = this.fn.embed(ids, this.params);
      const input = emb.view([1, chunk.length, emb.shape[1]]);
      this.builtin.kv_state_begin_forward(this.kv, tvm.makeShapeTuple([seq]), tvm.makeShapeTuple([chunk.length]));
      // biome-ignore lint/suspicious/noImplicitAnyLet: what a tvmjs PackedFunc returns is typed any
      let ret;
      if (entry === "batch_prefill") {
        const positions = tvm.empty([chunk.length], "int32", tvm.webgpu());
        positions.copyFrom(Int32Array.from(chunk.keys()));
        ret = this.fn.batch_prefill(input, positions, this.kv, this.params);
      } else {
        ret = this.fn[entry](input, this.kv, this.params);
      }
      this.builtin.kv_state_end_forward(this.kv);
      if (!read) return null;
      const out = ret.get(0);
      const host = tvm.empty(out.shape, out.dtype, tvm.cpu());
      host.copyFrom(out);
      await tvm.webgpu().sync();
      return { data: new Float32Array(host.toArray() as Float32Array), vocab: out.shape[out.shape.length - 1] };
    } finally {
      tvm.endScope();
    }
  }

  dispose(): void {
    this.vm.dispose();
    this.tvm.dispose();
  }
}
