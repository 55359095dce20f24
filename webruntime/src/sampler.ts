// Token selection from one step's logits, on the CPU (the vocabulary is ~50k floats, well
// under a millisecond). The order of operations is the contract the Python server follows:
//   logit_bias -> repetition/frequency/presence penalties (over generated tokens) ->
//   grammar mask (disallowed tokens to -inf) -> greedy when temperature is 0, else temperature -> top_k -> softmax -> top_p -> draw.
// Draws come from a seeded xorshift128+ generator, so one seed gives one token sequence.
import { InvalidRequestError } from "./errors";
import type { ChatCompletionRequest } from "./protocol";

export interface SamplingParams {
  temperature: number;
  topP: number;
  topK: number;
  repetitionPenalty: number;
  frequencyPenalty: number;
  presencePenalty: number;
  logitBias: Map<number, number>;
  seed: number | null;
  topLogprobs: number;  // -1: no logprobs
}

/**
 * Sampling fields an artifact may carry defaults for (lantern.json "generation"): OpenAI's default and
 * the closed range a value may take (null: no upper bound). The twin of GENERATION_FIELDS in
 * compiler/package.py; tests/test_generation_defaults.py holds them equal.
 */
export const GENERATION_FIELDS = {
  temperature: [1, 0, 2],
  top_p: [1, 0, 1],
  top_k: [0, 0, null],  // 0: off; above the vocabulary means all of it
  repetition_penalty: [1, 0.01, 10],
} as const;
export type GenerationDefaults = Partial<Record<keyof typeof GENERATION_FIELDS, number>>;

/** A request's sampling, each field taken from the request, else the artifact's ``defaults``, else OpenAI's. */
export function samplingParams(req: ChatCompletionRequest, vocabSize: number,
                               defaults: GenerationDefaults = {}): SamplingParams {
  const num = (v: unknown, name: string, lo: number, hi: number, dflt: number) => {
    if (v === undefined || v === null) return dflt;
    if (typeof v !== "number" || !Number.isFinite(v) || v < lo || v > hi) {
      throw new InvalidRequestError(`${name} must be a number in [${lo}, ${hi}], got ${JSON.stringify(v)}`);
    }
    return v;
  };
  const bias = new Map<number, number>();
  for (const [k, v] of Object.entries(req.logit_bias ?? {})) {
    const id = Number(k);
    if (!Number.isInteger(id) || id < 0 || id >= vocabSize) {
      throw new InvalidRequestError(`logit_bias names token ${k}, outside the vocabulary (0..${vocabSize - 1})`);
    }
    bias.set(id, num(v, `logit_bias[${k}]`, -100, 100, 0));
  }
  if (req.top_logprobs !== undefined && !req.logprobs) {
    throw new InvalidRequestError("top_logprobs requires logprobs: true");
  }
  const seed = req.seed === undefined || req.seed === null ? null : num(req.seed, "seed", -(2 ** 53), 2 ** 53, 0);
  if (seed !== null && !Number.isInteger(seed)) throw new InvalidRequestError("seed must be an integer");
  const gen = (name: keyof typeof GENERATION_FIELDS) => {
    const [openai, lo, hi] = GENERATION_FIELDS[name];
    return num(req[name], name, lo, hi ?? Infinity, defaults[name] ?? openai);
  };
  const topK = gen("top_k");
  if (!Number.isInteger(topK)) throw new InvalidRequestError(`top_k must be an integer, got ${topK}`);
  return {
    temperature: gen("temperature"),
    topP: gen("top_p"),
    topK: Math.min(topK, vocabSize),
    repetitionPenalty: gen("repetition_penalty"),
    frequencyPenalty: num(req.frequency_penalty, "frequency_penalty", -2, 2, 0),
    presencePenalty: num(req.presence_penalty, "presence_penalty", -2, 2, 0),
    logitBias: bias,
    seed,
    topLogprobs: req.logprobs ? num(req.top_logprobs, "top_logprobs", 0, 20, 0) : -1,
  };
}

/** xorshift128+ seeded through splitmix64; uniform doubles in [0, 1) with 53 bits. */
export class Rng {
  private s0: bigint;
  private s1: bigint;

  constructor(seed: number) {
    const mask = (1n << 64n) - 1n;
    let x = BigInt.asUintN(64, BigInt(seed));
    const next = () => {
      x = (x + 0x9e3779b97f4a7c15n) & mask;
      let z = x;
      z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & mask;
      z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & mask;
      return z ^ (z >> 31n);
    };
    this.s0 = next();
    this.s1 = next();
  }

  next(): number {
    const mask = (1n << 64n) - 1n;
    let s1 = this.s0;
    const s0 = this.s1;
    this.s0 = s0;
    s1 = (s1 ^ (s1 << 23n)) & mask;
    this.s1 = s1 ^ s0 ^ (s1 >> 17n) ^ (s0 >> 26n);
    return Number(((this.s1 + s0) & mask) >> 11n) / 2 ** 53;
  }
}

export interface Sampled {
  token: number;
  logprob: number;  // of the chosen token under the processed distribution (temperature 1)
  top: [number, number][];  // [token, logprob], best first
}

function logSoftmax(x: Float32Array): Float64Array {
  let max = -Infinity;
  for (const v of x) if (v > max) max = v;
  let sum = 0;
  for (const v of x) sum += Math.exp(v - max);
  const lse = max + Math.log(sum);
  return Float64Array.from(x, (v) => v - lse);
}

export class Sampler {
  private readonly rng: Rng;
  private readonly counts = new Map<number, number>();

  constructor(private readonly p: SamplingParams) {
    this.rng = new Rng(p.seed ?? Math.floor(Math.random() * 2 ** 52));
  }

  /** Record a generated token (the penalties look at these). */
  accept(token: number): void {
    this.counts.set(token, (this.counts.get(token) ?? 0) + 1);
  }

  /** Choose the next token; `allowed` (a grammar's bitmask: bit i of word i>>5) rules out the others. */
  sample(raw: Float32Array, allowed?: Int32Array): Sampled {
    const { p } = this;
    const logits = new Float32Array(raw);
    for (const [id, b] of p.logitBias) logits[id] += b;
    for (const [id, n] of this.counts) {
      let v = logits[id];
      if (p.repetitionPenalty !== 1) v = v > 0 ? v / p.repetitionPenalty : v * p.repetitionPenalty;
      logits[id] = v - p.frequencyPenalty * n - p.presencePenalty;
    }
    const isAllowed = (i: number) => !allowed || ((allowed[i >> 5] >>> (i & 31)) & 1) === 1;
    let firstAllowed = 0;
    if (allowed) {
      firstAllowed = -1;
      for (let i = 0; i < logits.length; i++) {
        if (!isAllowed(i) || Number.isNaN(logits[i])) logits[i] = -Infinity;
        if (firstAllowed < 0 && isAllowed(i)) firstAllowed = i;
      }
    }
    let token: number;
    if (p.temperature === 0) {
      token = 0;
      for (let i = 1; i < logits.length; i++) if (logits[i] > logits[token]) token = i;
    } else {
      token = this.draw(logits);
    }
    // Only logits that are all -inf or NaN (a broken model) can leave a forbidden token here.
    if (!isAllowed(token)) token = firstAllowed;
    let logprob = 0;
    let top: [number, number][] = [];
    if (p.topLogprobs >= 0) {
      const lp = logSoftmax(logits);
      logprob = lp[token];
      if (p.topLogprobs > 0) {
        const order = Array.from(lp.keys()).sort((a, b) => lp[b] - lp[a]).slice(0, p.topLogprobs);
        top = order.map((i) => [i, lp[i]]);
      }
    }
    return { token, logprob, top };
  }

  private draw(logits: Float32Array): number {
    const { p } = this;
    // candidates sorted by logit, best first; ties broken by the lower token id
    let ids = Array.from(logits.keys()).sort((a, b) => logits[b] - logits[a] || a - b);
    if (p.topK > 0) ids = ids.slice(0, p.topK);
    const max = logits[ids[0]];
    const cum = new Float64Array(ids.length);  // running sums of exp((l - max) / T), in order
    let sum = 0;
    for (let k = 0; k < ids.length; k++) {
      sum += Math.exp((logits[ids[k]] - max) / p.temperature);
      cum[k] = sum;
    }
    let keep = ids.length;
    if (p.topP < 1) {
      const k = cum.findIndex((c) => c / sum >= p.topP);
      if (k >= 0) keep = k + 1;
    }
    const u = this.rng.next() * cum[keep - 1];
    for (let k = 0; k < keep; k++) if (cum[k] > u) return ids[k];
    return ids[keep - 1];
  }
}
