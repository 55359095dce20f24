// Per-kernel GPU time on any WebGPU page (ci/bench/bench_webgpu.py --profile injects it before the page's
// own scripts): every compute pass gets timestamp writes, named by its pipeline's entry point.
// window.__lanternProfile.take() waits for the pending readbacks and returns {name: {ms, count}}.
// Chromium quantizes timestamps unless started with --disable-dawn-features=timestamp_quantization.
(() => {
  if (!("gpu" in navigator)) return;
  const names = new WeakMap(), passes = new WeakMap(), encoders = new WeakMap(), pending = new Set();
  let device = null, totals = {};
  const origRequestDevice = GPUAdapter.prototype.requestDevice;
  GPUAdapter.prototype.requestDevice = async function (desc = {}) {
    const want = this.features.has("timestamp-query") ? ["timestamp-query"] : [];
    const d = await origRequestDevice.call(this, { ...desc, requiredFeatures: [...(desc.requiredFeatures || []), ...want] });
    if (want.length) device = d;
    return d;
  };
  for (const m of ["createComputePipeline", "createComputePipelineAsync"]) {
    const orig = GPUDevice.prototype[m];
    GPUDevice.prototype[m] = function (desc) {
      const r = orig.call(this, desc);
      const name = desc.compute.entryPoint || "main";
      if (r instanceof Promise) return r.then((p) => (names.set(p, name), p));
      names.set(r, name);
      return r;
    };
  }
  const MAX = 4096;
  const origBegin = GPUCommandEncoder.prototype.beginComputePass;
  GPUCommandEncoder.prototype.beginComputePass = function (desc = {}) {
    if (!device) return origBegin.call(this, desc);
    let st = encoders.get(this);
    if (!st) { st = { qs: device.createQuerySet({ type: "timestamp", count: MAX }), names: [] }; encoders.set(this, st); }
    const i = st.names.length;
    if (2 * i + 2 > MAX) return origBegin.call(this, desc);
    st.names.push("?");
    const pass = origBegin.call(this, { ...desc, timestampWrites: { querySet: st.qs, beginningOfPassWriteIndex: 2 * i, endOfPassWriteIndex: 2 * i + 1 } });
    passes.set(pass, { st, i });
    return pass;
  };
  const origSet = GPUComputePassEncoder.prototype.setPipeline;
  GPUComputePassEncoder.prototype.setPipeline = function (p) {
    const at = passes.get(this);
    if (at) at.st.names[at.i] = names.get(p) || "?";
    return origSet.call(this, p);
  };
  const origFinish = GPUCommandEncoder.prototype.finish;
  const buffers = new WeakMap();
  GPUCommandEncoder.prototype.finish = function (desc) {
    const st = encoders.get(this);
    if (st && st.names.length) {
      const n = st.names.length * 2;
      const resolve = device.createBuffer({ size: n * 8, usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC });
      const read = device.createBuffer({ size: n * 8, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
      this.resolveQuerySet(st.qs, 0, n, resolve, 0);
      this.copyBufferToBuffer(resolve, 0, read, 0, n * 8);
      const cb = origFinish.call(this, desc);
      buffers.set(cb, { read, resolve, names: st.names, qs: st.qs });
      return cb;
    }
    return origFinish.call(this, desc);
  };
  const origSubmit = GPUQueue.prototype.submit;
  GPUQueue.prototype.submit = function (cbs) {
    const r = origSubmit.call(this, cbs);
    for (const cb of cbs) {
      const b = buffers.get(cb);
      if (!b) continue;
      const p = b.read.mapAsync(GPUMapMode.READ).then(() => {
        const t = new BigUint64Array(b.read.getMappedRange().slice(0));
        b.names.forEach((name, i) => {
          const ms = Number(t[2 * i + 1] - t[2 * i]) / 1e6;
          const e = totals[name] || (totals[name] = { ms: 0, count: 0 });
          e.ms += ms; e.count += 1;
        });
        b.read.destroy(); b.resolve.destroy(); b.qs.destroy();
      }).finally(() => pending.delete(p));
      pending.add(p);
    }
    return r;
  };
  window.__lanternProfile = {
    async take() { await Promise.all([...pending]); const t = totals; totals = {}; return t; },
  };
})();
