// An encoder worker's side of the wasm device's pool (cpu-encoder.ts; the worker is worker/encoder.ts): an
// embedding model's CPU library compiled to wasm, run by TVM's web runtime on the worker's one thread. The
// pool sends "load" once (the library, the weight index and shards), then "embed" batches; each answer
// names its request's id.
import * as tvmjs from "@mlc-ai/web-runtime";
import type { EncoderReply, EncoderRequest } from "./cpu-encoder";
import { paddedBatch, paramArray, type TensorCacheIndex, uploadShard } from "./model";

let embed: ((batch: number[][]) => Float32Array[]) | null = null;

async function load(wasm: ArrayBuffer, index: TensorCacheIndex, shards: Record<string, ArrayBuffer>, upcast: boolean) {
  const tvm = await tvmjs.instantiate(wasm, tvmjs.createPolyfillWASI(), () => {});
  const dev = tvm.cpu();
  tvm.beginScope();
  const vm = tvm.detachFromCurrentScope(tvm.createVirtualMachine(dev));
  const metadata: { params: { name: string }[] } = JSON.parse(vm.getFunction("_metadata")());
  const byName = new Map<string, tvmjs.Tensor>();
  for (const shard of index.records) {
    const bytes = shards[shard.dataPath];
    if (!bytes) throw new Error(`shard ${shard.dataPath} was not sent`);
    uploadShard(tvm, dev, shard.records, bytes, upcast, byName);
  }
  const params = paramArray(tvm, metadata, byName);
  const fn = tvm.detachFromCurrentScope(vm.getFunction("embed"));
  tvm.endScope();
  // as TvmModel.encode on webgpu, with the vectors already here
  embed = (batch) => {
    const { ids, mask, n } = paddedBatch(batch);
    tvm.beginScope();
    try {
      const idsT = tvm.empty([batch.length, n], "int32", dev);
      idsT.copyFrom(ids);
      const maskT = tvm.empty([batch.length, n], "int32", dev);
      maskT.copyFrom(mask);
      const out = fn(idsT, maskT, params);
      const all = out.toArray() as Float32Array;
      const width = out.shape[1];
      return batch.map((_, i) => all.slice(i * width, (i + 1) * width));
    } finally {
      tvm.endScope();
    }
  };
}

/** Answer the pool's requests on ``scope`` (a dedicated worker's global). */
export function serveEncoder(scope: {
  postMessage(msg: EncoderReply, transfer: Transferable[]): void;
  onmessage: ((ev: MessageEvent<EncoderRequest>) => unknown) | null;
}): void {
  const reply = (msg: EncoderReply, transfer: Transferable[] = []) => scope.postMessage(msg, transfer);
  scope.onmessage = async (ev) => {
    const msg = ev.data;
    try {
      if (msg.op === "load") {
        await load(msg.wasm, msg.index, msg.shards, msg.upcast);
        reply({ op: "ready", id: msg.id });
      } else {
        if (!embed) throw new Error("the encoder was not loaded");
        const vectors = embed(msg.batch);
        reply(
          { op: "vectors", id: msg.id, vectors },
          vectors.map((v) => v.buffer),
        );
      }
    } catch (err) {
      reply({ op: "error", id: msg.id, message: err instanceof Error ? err.message : String(err) });
    }
  };
}
