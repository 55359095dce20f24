// Test harness page script: drives a Lantern model library directly through tvmjs
// on WebGPU and returns raw logits to the Python test (no engine in between).
/* global tvmjs */

async function loadModel(modelUrl, libFile) {
  const gpu = await tvmjs.detectGPUDevice();
  if (!gpu) throw new Error("no WebGPU adapter");
  const wasm = await (await fetch(new URL(libFile, modelUrl))).arrayBuffer();
  const tvm = await tvmjs.instantiate(new Uint8Array(wasm), tvmjs.createPolyfillWASI(), () => {});
  tvm.initWebGPU(gpu.device);
  const dev = tvm.webgpu();
  tvm.beginScope();
  const vm = tvm.detachFromCurrentScope(tvm.createVirtualMachine(dev));
  const metadata = JSON.parse(vm.getFunction("_metadata")());
  await tvm.fetchTensorCache(modelUrl, dev, "lantern-probe", "cache");
  const params = tvm.detachFromCurrentScope(
    tvm.getParamsFromCacheByName(metadata.params.map((p) => p.name)));
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
window.runProbe = async function (modelUrl, libFile, steps) {
  const m = await loadModel(modelUrl, libFile);
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
