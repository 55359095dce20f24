// Token selection from one step's logits, on the CPU (no step sorts the vocabulary: 262,144
// floats for Gemma 3 take a few milliseconds). The order of operations is the contract the Python server follows:
//   logit_bias -> repetition/frequency/presence penalties (over generated tokens), then DRY (over the prompt
//   and generated tokens) ->
//   grammar mask (disallowed tokens to -inf) -> greedy when temperature is 0, else temperature -> top_k -> softmax -> top_p -> draw.
// Draws come from a seeded xorshift128+ generator, so one seed gives one token sequence.
import { InvalidRequestError } from "./errors";
import type { ChatCompletionRequest } from "./protocol";
import { checkRequest, generationFields, message, RULES } from "./request_rules";

export interface SamplingParams {
  temperature: number;
  topP: number;
  topK: number;
  repetitionPenalty: number;
  frequencyPenalty: number;
  presencePenalty: number;
  dryMultiplier: number; // DRY (llama.cpp's "don't repeat yourself" sampler): 0 is off
  dryBase: number;
  dryAllowedLength: number;
  dryPenaltyLastN: number; // tokens it looks back over, the prompt's included; -1: all of them, 0: off
  logitBias: Map<number, number>;
  seed: number | null;
  topLogprobs: number; // -1: no logprobs
}

/**
 * Sampling fields an artifact may carry defaults for (lantern.json "generation"): OpenAI's default and
 * the closed range a value may take (null: no upper bound). The request rules' fields with a
 * "fallback" (compiler/contracts/request_rules.json), as package.GENERATION_FIELDS on the Python side.
 */
export type GenerationField = "temperature" | "top_p" | "top_k" | "repetition_penalty";
export const GENERATION_FIELDS = generationFields() as Record<GenerationField, [number, number, number | null]>;
export type GenerationDefaults = Partial<Record<GenerationField, number>>;

/**
 * A request's sampling, each field taken from the request, else the artifact's ``defaults``, else OpenAI's.
 * The request is held to the shared request rules first (InvalidRequestError), as the server's
 * SamplingFields is; the twin of sampling_params in lantern/server/engine.py.
 */
export function samplingParams(
  request: ChatCompletionRequest,
  vocabSize: number,
  defaults: GenerationDefaults = {},
): SamplingParams {
  const req = checkRequest(request, null);
  const bias = new Map<number, number>();
  for (const [k, v] of Object.entries(req.logit_bias ?? {})) {
    const id = Number(k);
    if (id >= vocabSize) throw new InvalidRequestError(message("token_outside_vocabulary", { token: k, last: vocabSize - 1 }));
    bias.set(id, v);
  }
  const gen = (name: GenerationField) => req[name] ?? defaults[name] ?? GENERATION_FIELDS[name][0];
  return {
    temperature: gen("temperature"),
    topP: gen("top_p"),
    topK: Math.min(gen("top_k"), vocabSize),
    repetitionPenalty: gen("repetition_penalty"),
    frequencyPenalty: req.frequency_penalty!, // the rules' defaults are filled in
    presencePenalty: req.presence_penalty!,
    dryMultiplier: dryMultiplier(req),
    dryBase: req.dry_base!,
    dryAllowedLength: req.dry_allowed_length!,
    dryPenaltyLastN: req.dry_penalty_last_n!,
    logitBias: bias,
    seed: req.seed ?? null,
    topLogprobs: req.logprobs ? (req.top_logprobs ?? 0) : -1,
  };
}

/**
 * The request's dry_multiplier; absent, its schema_defaults.dryMultiplier when it answers under a
 * response_format (JSON from the first token, where a small model repeats itself until max_tokens),
 * else 0. The twin of dry_multiplier in lantern/server/engine.py.
 */
export function dryMultiplier(req: ChatCompletionRequest): number {
  if (req.dry_multiplier !== undefined && req.dry_multiplier !== null) return req.dry_multiplier;
  const type = req.response_format?.type;
  if (type !== "json_schema" && type !== "json_object") return 0;
  return req.schema_defaults?.dryMultiplier ?? (RULES.endpoints.chat.schema_defaults.fields!.dryMultiplier.default as number);
}

/**
 * DRY, as llama.cpp defines it, without sequence breakers: a token that would extend a repeat of
 * n >= dryAllowedLength tokens (the end of `history`, prompt and generated tokens, seen before in it,
 * followed by that token) loses
 * dryMultiplier * dryBase^(n - dryAllowedLength) of its logit, for the longest such n. The repeats are
 * found with the Z-algorithm over the reversed window: linear in its length. The twin of
 * dry_penalties in lantern/server/sampler.py.
 */
export function dryPenalties(history: number[], p: SamplingParams): Map<number, number> {
  const window = p.dryPenaltyLastN > 0 ? history.slice(-p.dryPenaltyLastN) : history;
  const rev = window.slice().reverse();
  const n = rev.length;
  if (n <= p.dryAllowedLength) return new Map();
  const z = new Int32Array(n);
  let left = 0;
  let right = 0;
  const longest = new Map<number, number>();
  for (let i = 1; i < n; i++) {
    let k = i < right ? Math.min(right - i, z[i - left]) : 0;
    while (i + k < n && rev[k] === rev[i + k]) k++;
    z[i] = k;
    if (i + k > right) {
      left = i;
      right = i + k;
    }
    // rev[i..i+k) equals rev[0..k): the k tokens ending at history position n-1-i repeat the last k,
    // and the token after them (rev[i-1]) would extend the repeat to k+1
    if (k >= p.dryAllowedLength && k > (longest.get(rev[i - 1]) ?? 0)) longest.set(rev[i - 1], k);
  }
  const top = p.dryBase > 1.000001 ? Math.trunc(88.7228391 / Math.log(p.dryBase)) : Infinity; // llama.cpp's clamp
  const out = new Map<number, number>();
  for (const [t, k] of longest) out.set(t, p.dryMultiplier * p.dryBase ** Math.min(k - p.dryAllowedLength, top));
  return out;
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
  logprob: number; // of the chosen token under the processed distribution (temperature 1)
  top: [number, number][]; // [token, logprob], best first
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
  // The penalties' and DRY's window: the prompt and the generated tokens (the twin's comment)
  private readonly counts = new Map<number, number>();
  private readonly history: number[];

  constructor(
    private readonly p: SamplingParams,
    prompt: readonly number[] = [],
  ) {
    this.rng = new Rng(p.seed ?? Math.floor(Math.random() * 2 ** 52));
    if (p.repetitionPenalty !== 1 || p.frequencyPenalty || p.presencePenalty) {
      for (const token of prompt) this.counts.set(token, (this.counts.get(token) ?? 0) + 1);
    }
    this.history = p.dryMultiplier ? prompt.slice() : [];
  }

  /** Record a generated token (the penalties look at these, after the prompt's). */
  accept(token: number): void {
    this.counts.set(token, (this.counts.get(token) ?? 0) + 1);
    if (this.p.dryMultiplier) this.history.push(token);
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
    if (p.dryMultiplier && p.dryPenaltyLastN) {
      for (const [id, penalty] of dryPenalties(this.history, p)) logits[id] -= penalty;
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
        top = best(lp, p.topLogprobs).map((i) => [i, lp[i]]);
      }
    }
    return { token, logprob, top };
  }

  // Temperature, top-k, top-p, draw, without sorting the vocabulary (262,144 entries for Gemma 3):
  // top-k and top-p rank only the best candidates (`best`); with neither, the draw walks the
  // distribution in token order. The server's `Sampler._draw` is this function step for step.
  private draw(logits: Float32Array): number {
    const { p } = this;
    const V = logits.length;
    if (p.topK === 0 && p.topP >= 1) {
      // the whole distribution: any fixed order draws the same law
      let max = -Infinity;
      for (let i = 0; i < V; i++) if (logits[i] > max) max = logits[i]; // NaN ranks last
      const cum = new Float64Array(V);
      let sum = 0;
      for (let i = 0; i < V; i++) cum[i] = sum += Math.exp((logits[i] - max) / p.temperature);
      const u = this.rng.next() * sum;
      for (let i = 0; i < V; i++) if (cum[i] > u) return i;
      return V - 1;
    }
    let n = p.topK > 0 ? p.topK : NUCLEUS_START;
    let total = NaN;
    let first = true;
    for (;;) {
      const ids = best(logits, n);
      const top = logits[ids[0]];
      const cum = new Float64Array(ids.length); // running sums of exp((l - top) / T), best first
      let sum = 0;
      for (let k = 0; k < ids.length; k++) cum[k] = sum += Math.exp((logits[ids[k]] - top) / p.temperature);
      if (first) {
        // top-p's share is of the top-k's weight, or of every token's (in token order)
        first = false;
        total = sum;
        if (p.topK === 0) {
          total = 0;
          for (let i = 0; i < V; i++) total += Math.exp((logits[i] - top) / p.temperature);
        }
      }
      let keep = ids.length;
      if (p.topP < 1) {
        const k = cum.findIndex((c) => c / total >= p.topP);
        if (k >= 0) keep = k + 1;
        else if (p.topK === 0 && n < V) {
          n *= 8; // the nucleus is wider than the candidates ranked so far
          continue;
        }
      }
      const u = this.rng.next() * cum[keep - 1];
      for (let k = 0; k < keep; k++) if (cum[k] > u) return ids[k];
      return ids[keep - 1];
    }
  }
}

/** Candidates ranked first for top-p; eight times more while the nucleus is wider. */
const NUCLEUS_START = 64;

/**
 * The ids of the `n` largest values, best first, ties broken by the lower id (NaN ranks last): a
 * partial selection (quickselect for the n-th largest value), then a sort of the selected only.
 * The twin of `_best` in server/sampler.py.
 */
export function best(values: Float32Array | Float64Array, n: number): number[] {
  const V = values.length;
  const ranked = new Float64Array(values);
  for (let i = 0; i < V; i++) if (Number.isNaN(ranked[i])) ranked[i] = -Infinity; // NaN ranks last
  let ids: number[] = [];
  if (n < V) {
    const kth = nthLargest(new Float64Array(ranked), n);
    for (let i = 0; i < V; i++) if (ranked[i] >= kth) ids.push(i); // ties at the threshold included, cut below
  } else {
    ids = Array.from(values.keys());
  }
  ids.sort((a, b) => ranked[b] - ranked[a] || a - b);
  return ids.slice(0, n);
}

/** The n-th largest entry (1-based) of `a`, which it reorders: Hoare's quickselect. */
function nthLargest(a: Float64Array, n: number): number {
  const target = a.length - n; // its index in ascending order
  let lo = 0;
  let hi = a.length - 1;
  while (lo < hi) {
    const pivot = a[(lo + hi) >> 1];
    let i = lo;
    let j = hi;
    while (i <= j) {
      while (a[i] < pivot) i++;
      while (a[j] > pivot) j--;
      if (i <= j) {
        const t = a[i];
        a[i] = a[j];
        a[j] = t;
        i++;
        j--;
      }
    }
    if (target <= j) hi = j;
    else if (target >= i) lo = i;
    else break;
  }
  return a[target];
}
