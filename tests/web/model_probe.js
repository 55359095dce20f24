// Test harness page script: drives a Lantern model library directly through tvmjs
// on WebGPU and returns raw logits to the Python test (no engine in between).
/* global tvmjs */

function halfToFloat(h) {
  const s = (h & 0x8000) ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const f = h & 0x3ff;
  if (e === 0) return s * 2 ** -14 * (f / 1024);
  if (e === 31) return f ? NaN : s * Infinity;
  return s * 2 ** (e - 15) * (1 + f / 1024);
}

// Load the parameters from tensor-cache.json by hand, turning float16 tensors into float32:
// what a runtime does for the f32 fallback library of an f16 artifact (no shader-f16).
async function loadParamsUpcast(tvm, dev, modelUrl, names) {
  const index = await (await fetch(new URL("tensor-cache.json", modelUrl))).json();
  const byName = new Map();
  for (const shard of index.records) {
    const bytes = await (await fetch(new URL(shard.dataPath, modelUrl))).arrayBuffer();
    for (const rec of shard.records) {
      const raw = bytes.slice(rec.byteOffset, rec.byteOffset + rec.nbytes);
      const half = rec.dtype === "float16";
      const t = tvm.detachFromCurrentScope(tvm.empty(rec.shape, half ? "float32" : rec.dtype, dev));
      if (half) t.copyFrom(Float32Array.from(new Uint16Array(raw), halfToFloat));
      else t.copyFromRawBytes(new Uint8Array(raw));
      byName.set(rec.name, t);
    }
  }
  return tvm.detachFromCurrentScope(tvm.makeTVMArray(names.map((n) => byName.get(n))));
}

async function loadModel(modelUrl, libFile, upcast = false) {
  const gpu = await tvmjs.detectGPUDevice();
  if (!gpu) throw new Error("no WebGPU adapter");
  const wasm = await (await fetch(new URL(libFile, modelUrl))).arrayBuffer();
  const tvm = await tvmjs.instantiate(new Uint8Array(wasm), tvmjs.createPolyfillWASI(), () => {});
  tvm.initWebGPU(gpu.device);
  const dev = tvm.webgpu();
  tvm.beginScope();
  const vm = tvm.detachFromCurrentScope(tvm.createVirtualMachine(dev));
  let metadata = { params: [] };  // kernel-only test libraries have no _metadata
  try {
    metadata = JSON.parse(vm.getFunction("_metadata")());
  } catch (err) { /* keep the empty metadata */ }
  let params = null;
  if (metadata.params.length && upcast) {
    params = await loadParamsUpcast(tvm, dev, modelUrl, metadata.params.map((p) => p.name));
  } else if (metadata.params.length) {
    await tvm.fetchTensorCache(modelUrl, dev, "lantern-probe", "cache");
    params = tvm.detachFromCurrentScope(
      tvm.getParamsFromCacheByName(metadata.params.map((p) => p.name)));
  }
  tvm.endScope();
  return { tvm, dev, vm, metadata, params, adapter: gpu.adapterInfo };
}

function fn(m, name) {
  return m.vm.getFunction(name);
}

async function toHost(m, tensor) {
  const host = m.tvm.empty(tensor.shape, tensor.dtype, m.tvm.cpu());
  host.copyFrom(tensor);
  await m.dev.sync();
  return Array.from(host.toArray());
}

// steps: [{tokens: [...]}]: each step appends tokens to sequence 0 and returns the
// last position's logits (prefill for several tokens, decode for one).
window.runProbe = async function (modelUrl, libFile, steps, upcast = false) {
  const m = await loadModel(modelUrl, libFile, upcast);
  const { tvm } = m;
  const hidden = m.metadata.params.find((p) => p.name.endsWith("embed_tokens.q_weight") ||
    p.name.endsWith("embed_tokens.weight"));
  tvm.beginScope();
  const kv = tvm.detachFromCurrentScope(fn(m, "create_tir_paged_kv_cache")(
    tvm.makeShapeTuple([1]), tvm.makeShapeTuple([m.metadata.context_window_size]),
    tvm.makeShapeTuple([m.metadata.prefill_chunk_size]), tvm.makeShapeTuple([16]),
    tvm.makeShapeTuple([0])));
  tvm.getGlobalFunc("vm.builtin.kv_state_add_sequence")(kv, new tvmjs.Scalar(0, "int64"));
  const begin = tvm.detachFromCurrentScope(tvm.getGlobalFunc("vm.builtin.kv_state_begin_forward"));
  const end = tvm.detachFromCurrentScope(tvm.getGlobalFunc("vm.builtin.kv_state_end_forward"));
  tvm.endScope();
  const out = [];
  for (const step of steps) {
    tvm.beginScope();
    const n = step.tokens.length;
    const ids = tvm.empty([n], "int32", m.dev);
    ids.copyFrom(Int32Array.from(step.tokens));
    const emb = fn(m, "embed")(ids, m.params);
    const h = emb.shape[1];
    begin(kv, tvm.makeShapeTuple([0]), tvm.makeShapeTuple([n]));
    const ret = fn(m, n > 1 ? "prefill" : "decode")(emb.view([1, n, h]), kv, m.params);
    end(kv);
    out.push(await toHost(m, ret.get(0)));
    tvm.endScope();
  }
  return { logits: out, adapter: m.adapter, hiddenParam: hidden && hidden.name };
};

// calls: [{name, args: [{dtype, shape, data}]}]: runs each library function on WebGPU
// with fresh device tensors and returns every output (tuple items flattened) as arrays.
// In-place functions return their first argument, so the result shows what they wrote.
window.callFunctions = async function (modelUrl, libFile, calls) {
  const m = await loadModel(modelUrl, libFile);
  const { tvm } = m;
  const results = [];
  for (const call of calls) {
    tvm.beginScope();
    const args = call.args.map((a) => {
      const t = tvm.empty(a.shape, a.dtype, m.dev);
      const Ctor = { int32: Int32Array, uint32: Uint32Array }[a.dtype] ?? Float32Array;
      t.copyFrom(Ctor.from(a.data));
      return t;
    });
    const ret = fn(m, call.name)(...args);
    const outs = typeof ret.size === "function" ? [...Array(ret.size).keys()].map((i) => ret.get(i)) : [ret];
    const arrays = [];
    for (const o of outs) arrays.push(await toHost(m, o));
    results.push(arrays);
    tvm.endScope();
  }
  return results;
};
