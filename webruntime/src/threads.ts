// How many threads llama.cpp gets on the `wasm` device, and why (stats().wasm.threadsWhy).
import { SharedEngineUnavailableError } from "./errors";
import { wasmFeatures } from "./llama-builds";

/** SharedEngineUnavailableError, before any download, where ``what`` could not start its Web Workers here
 * (a SharedWorker that has no Worker): createEngine then runs the engine in a dedicated worker. */
export function requireWorkers(what: string): void {
  if (typeof Worker === "undefined") {
    throw new SharedEngineUnavailableError(`${what} starts Web Workers, which a SharedWorker cannot here`);
  }
}

/** Threads llama.cpp may use: several only where SharedArrayBuffer is (a cross-origin isolated context). */
export function wasmThreads(requested: number | undefined, shared = wasmFeatures().threads): number {
  if (!shared) return 1;
  if (requested) return Math.max(1, Math.floor(requested));
  return Math.max(1, Math.min(4, globalThis.navigator?.hardwareConcurrency ?? 1));
}

/**
 * Threads for llama.cpp and why: ``requested``, else the count that runs llama.cpp's way fastest here,
 * up to wasmThreads' bound. navigator.hardwareConcurrency may claim more cores than there are (WebKit
 * reports 4 or 8 whatever the machine), and llama.cpp's threads wait for each other at a barrier after
 * every operation by spinning, so a thread too many, or one the machine is too busy to run, costs most
 * of the speed: WebKitGTK on 2 cores decoded 0.27 tok/s on 4 threads and 12.1 on 2. Where more than 2
 * are claimed, workers that split work and meet at a spinning barrier, as llama.cpp's do, measure it.
 */
export async function chooseThreads(requested: number | undefined, shared: boolean): Promise<{ threads: number; why: string }> {
  const bound = wasmThreads(requested, shared);
  if (!shared) return { threads: 1, why: "no SharedArrayBuffer here (the page is not cross-origin isolated)" };
  if (requested) return { threads: bound, why: "as asked" };
  const claimed = globalThis.navigator?.hardwareConcurrency ?? 1;
  if (bound <= 2) return { threads: bound, why: `navigator.hardwareConcurrency is ${claimed}` };
  const rates = await barrierRates(bound);
  const best = bestThreads(rates);
  return {
    threads: best,
    why:
      `navigator.hardwareConcurrency is ${claimed}; barrier rounds per ms on ` +
      `${rates.map((_, i) => i + 1).join(", ")} threads: ${rates.map((r) => r.toFixed(2)).join(", ")}`,
  };
}

/** The fewest threads within 10% of the best rate (a thread that adds nothing measurable costs a core). */
function bestThreads(rates: number[]): number {
  const top = Math.max(...rates);
  return Math.max(1, rates.findIndex((r) => r >= 0.9 * top) + 1);
}

// A probe worker: rounds of BARRIER_WORK / n steps of arithmetic each, then a barrier that spins on shared
// memory (cells: 0 the round, 1 the count arrived, 2 stop), until told to stop.
const BARRIER_WORKER = `onmessage = (e) => {
  const [cells, n, steps] = e.data, a = new Int32Array(cells);
  let x = 1;
  while (!Atomics.load(a, 2)) {
    for (let i = 0; i < steps; i++) x = (x * 1103515245 + 12345) | 0;
    const round = Atomics.load(a, 0);
    if (Atomics.add(a, 1, 1) === n - 1) { Atomics.store(a, 1, 0); Atomics.add(a, 0, 1); }
    else while (Atomics.load(a, 0) === round && !Atomics.load(a, 2)) {}
  }
  postMessage(x & 0);
};`;
const BARRIER_WORK = 40_000; // steps per round in all: about 40 us on one core, an operation's length

/** Barrier rounds per ms that 1..``upTo`` workers complete, splitting the same work (about 0.5 s in all). */
async function barrierRates(upTo: number, ms = 100): Promise<number[]> {
  const url = URL.createObjectURL(new Blob([BARRIER_WORKER], { type: "text/javascript" }));
  const workers = Array.from({ length: upTo }, () => new Worker(url));
  const sleep = (t: number) => new Promise((done) => setTimeout(done, t));
  // ``group`` meets at one barrier until stop() (which resolves once every worker of it has stopped)
  const start = (group: Worker[]) => {
    const cells = new Int32Array(new SharedArrayBuffer(12));
    const stopped = group.map(
      (w) =>
        new Promise((done) => {
          w.onmessage = done;
          w.postMessage([cells.buffer, group.length, Math.ceil(BARRIER_WORK / group.length)]);
        }),
    );
    return {
      cells,
      stop: () => {
        Atomics.store(cells, 2, 1);
        return Promise.all(stopped);
      },
    };
  };
  const rate = async (n: number): Promise<number> => {
    const { cells, stop } = start(workers.slice(0, n));
    try {
      // from the first round that every worker reached (a worker's start is not what is measured)
      for (const give = performance.now() + 2000; Atomics.load(cells, 0) === 0 && performance.now() < give; ) await sleep(1);
      const [t0, r0] = [performance.now(), Atomics.load(cells, 0)];
      await sleep(ms);
      return (Atomics.load(cells, 0) - r0) / Math.max(1, performance.now() - t0);
    } finally {
      await stop();
    }
  };
  try {
    // every worker started and its loop compiled, each on its own (4 workers at one barrier on 2 cores
    // run too few rounds in that time to reach the JIT's top tier, and the first rates read low)
    const warming = workers.map((w) => start([w]));
    await sleep(ms);
    await Promise.all(warming.map((w) => w.stop()));
    const rates = [];
    for (let n = 1; n <= upTo; n++) rates.push(await rate(n));
    return rates;
  } finally {
    workers.forEach((w) => {
      w.terminate();
    });
    URL.revokeObjectURL(url);
  }
}
