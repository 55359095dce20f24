// Exact grammars for JSON numbers between bounds, which xgrammar 0.1.27 does not enforce exactly.
//
// A schema's `number` or `integer` with bounds (minimum, maximum, exclusiveMinimum, exclusiveMaximum)
// or a multipleOf is written in the grammar as a placeholder string, `lantern:number:ge=-1.5:lt=100:mul=0.5`
// (structured.ts's checkSchema does that). After xgrammar turns the schema into EBNF,
// structured.ts's withExactRules swaps each placeholder for rules that admit exactly the JSON numbers
// within the bounds (and multiples, see multipleOf), written with no exponent and at most MAX_DIGITS digits.
//
// Why 15 digits: validators (jsonschema, ajv) read a number and its bounds as IEEE-754 doubles. Two
// different decimals of at most 15 significant digits are never the same double (15 is DBL_DIG: such
// a decimal survives a round trip through a double), and rounding to the nearest double keeps order.
// So for a bound whose shortest decimal form has at most 15 digits, comparing the decimal texts gives
// the validator's answer, exclusive bounds included. A bound with 16 or 17 digits (0.1 + 0.2, say)
// is first rounded inwards to 15 digits, which can only leave out values, never let one in.
//
// The rules come from a small deterministic automaton over the characters `-`, `.`, `0-9`: the
// integer part is compared with each bound's digit by digit (a longer integer part is larger), then
// the fraction; for a multipleOf it also keeps the remainder of the digits read so far. States that
// cannot reach an end within the bounds are dropped, so the model can never
// write itself into a dead end, and equivalent states are merged (Moore's partition refinement).
//
// The only copy: the browser bundles it and `lantern serve` runs it in V8 (structured.ts's header);
// tests/test_structured_exact.py checks what its rules accept against jsonschema and ajv.

export const MAX_DIGITS = 15;
const MAX_MULTIPLE = 250; // multipleOf as an integer of its digits (0.25 -> 25): the automaton keeps a remainder
export const PREFIX = "lantern:";
const SYMBOLS = [..."-.0123456789"];

/** A finite decimal: sign, integer digits (no leading zeros, "" below 1), fraction (no trailing zeros). */
interface Decimal {
  negative: boolean;
  whole: string;
  fraction: string;
}

const text = (d: Decimal): string => {
  const body = (d.whole || "0") + (d.fraction ? `.${d.fraction}` : "");
  return d.negative ? `-${body}` : body;
};
const significant = (d: Decimal): number => (d.whole + d.fraction).replace(/^0+|0+$/g, "").length;
const isZero = (d: Decimal): boolean => !d.whole && !d.fraction;

function decimalFromText(s: string): Decimal {
  const [mantissa, exponent = "0"] = s.toLowerCase().split("e");
  const negative = mantissa.startsWith("-");
  const [w, f = ""] = mantissa.replace(/^[+-]/, "").split(".");
  const digits = w + f;
  const point = w.length + parseInt(exponent, 10);
  let whole: string;
  let fraction: string;
  if (point <= 0) [whole, fraction] = ["", "0".repeat(-point) + digits];
  else if (point >= digits.length) [whole, fraction] = [digits + "0".repeat(point - digits.length), ""];
  else [whole, fraction] = [digits.slice(0, point), digits.slice(point)];
  whole = whole.replace(/^0+/, "");
  fraction = fraction.replace(/0+$/, "");
  return { negative: negative && !!(whole || fraction), whole, fraction };
}

/** The shortest decimal that reads back as `value` (what String and Python's repr print). */
const decimalOf = (value: number): Decimal => decimalFromText(String(value));

/** `d` cut to MAX_DIGITS significant digits, towards +infinity if `up` else towards -infinity. */
function roundInwards(d: Decimal, up: boolean): Decimal {
  if (significant(d) <= MAX_DIGITS) return d;
  const digits = d.whole + d.fraction;
  const first = digits.length - digits.replace(/^0+/, "").length;
  const keep = first + MAX_DIGITS;
  let kept = digits.slice(0, keep);
  const dropped = digits.slice(keep);
  if (up !== d.negative && /[1-9]/.test(dropped)) kept = (BigInt(kept) + 1n).toString().padStart(kept.length, "0");
  const point = d.whole.length + (kept.length - keep);
  kept += "0".repeat(Math.max(0, point - kept.length));
  return { negative: d.negative, whole: kept.slice(0, point).replace(/^0+/, ""), fraction: kept.slice(point).replace(/0+$/, "") };
}

/** The placeholder string for a bounded `kind` ("number"/"integer") subschema; every bound kept. */
export function placeholder(kind: string, schema: Record<string, unknown>): string {
  const parts = [PREFIX + kind];
  for (const [key, op] of [
    ["minimum", "ge"],
    ["exclusiveMinimum", "gt"],
    ["maximum", "le"],
    ["exclusiveMaximum", "lt"],
    ["multipleOf", "mul"],
  ]) {
    if (key in schema) parts.push(`${op}=${text(decimalOf(schema[key] as number))}`);
  }
  return parts.join(":");
}

/**
 * A placeholder carrying `payload` as the hex of its JSON's UTF-8 bytes (letters and digits only, so xgrammar
 * keeps it as it is). Written with encodeURIComponent, not TextEncoder, which the server's V8 lacks; JSON.stringify
 * escapes lone surrogates, so the text always encodes.
 */
export function payloadPlaceholder(kind: string, payload: unknown): string {
  const hex = encodeURIComponent(JSON.stringify(payload)).replace(/%([0-9A-F]{2})|[^%]/g, (c: string, byte?: string) =>
    (byte ?? c.charCodeAt(0).toString(16).padStart(2, "0")).toLowerCase(),
  );
  return `${PREFIX}${kind}:${hex}`;
}

/** The payload of a payloadPlaceholder. */
export function placeholderPayload(key: string): unknown {
  return JSON.parse(decodeURIComponent(key.split(":")[2].replace(/../g, "%$&")));
}

/** The shortest decimal text of a number, with no exponent (decimalOf(v) as text). */
export const decimalText = (value: number): string => text(decimalOf(value));

/** [m, e] for a multipleOf written `s`: x is a multiple when x * 10**e is an integer m divides (see the twin). */
export function multipleOf(s: string): [number, number] {
  const d = decimalFromText(s);
  if (d.negative || !(d.whole || d.fraction)) throw new NumberRangeError("must be a number above 0");
  const m = Number(d.whole + d.fraction);
  const e = d.fraction.length;
  if (m % 5 ** e) {
    throw new NumberRangeError(
      `${s} is not a binary fraction, and validators dividing doubles reject exact ` +
        `multiples of it (0.07 / 0.01 = ${0.07 / 0.01}); use an integer or a power-of-two ` +
        "fraction such as 0.5 or 0.25, or scale the value (cents as an integer)",
    );
  }
  return [m, e];
}

type Side = [number, boolean] | null; // (value, inclusive)
type DecimalBound = [Decimal, boolean] | null;

function tighter(a: Side, b: Side, lower: boolean): Side {
  if (a === null || b === null) return a ?? b;
  if (a[0] !== b[0]) return a[0] > b[0] === lower ? a : b;
  return !a[1] ? a : b; // the same value: exclusive wins
}

function parsePlaceholder(key: string): [string, DecimalBound, DecimalBound, Multiple] {
  const [kind, ...ops] = key.slice(PREFIX.length).split(":");
  let lower: Side = null;
  let upper: Side = null;
  let multiple: Multiple = null;
  for (const op of ops) {
    const [name, value] = op.split("=");
    if (name === "mul") {
      multiple = multipleOf(value);
      continue;
    }
    const bound: Side = [Number(value), name === "ge" || name === "le"];
    if (name === "ge" || name === "gt") lower = tighter(lower, bound, true);
    else upper = tighter(upper, bound, false);
  }
  return [kind, inwards(lower, true), inwards(upper, false), multiple];
}

/** A bound as a decimal of at most MAX_DIGITS digits; cut, it becomes inclusive (see the Python twin). */
function inwards(bound: Side, up: boolean): DecimalBound {
  if (bound === null) return null;
  const exact = decimalOf(bound[0]);
  const cut = roundInwards(exact, up);
  return [cut, bound[1] || text(cut) !== text(exact)];
}

// ---- comparing a magnitude with a bound, one character at a time -------------------------------
// A comparator state: "i,n,c" in the integer part (n digits in, c the comparison so far), "f,j" equal
// so far with j fraction digits in, or "<" / ">" settled. Strings, so states compare and hash as keys.

function digitStep(state: string, d: string, bound: Decimal, inFraction: boolean): string {
  if (state === "<" || state === ">") return state;
  const parts = state.split(",");
  if (inFraction) {
    const j = Number(parts[1]);
    if (j < bound.fraction.length) return d < bound.fraction[j] ? "<" : d > bound.fraction[j] ? ">" : `f,${j + 1}`;
    return d !== "0" ? ">" : state;
  }
  const n = Number(parts[1]);
  let c = parts[2];
  if (n >= bound.whole.length) return ">";
  if (c === "=") c = d < bound.whole[n] ? "<" : d > bound.whole[n] ? ">" : "=";
  return `i,${n + 1},${c}`;
}

function pointStep(state: string, bound: Decimal): string {
  if (state === "<" || state === ">" || state.startsWith("f")) return state;
  const [, n, c] = state.split(",");
  if (Number(n) < bound.whole.length) return "<";
  return c !== "=" ? c : "f,0";
}

function endOf(state: string, bound: Decimal): string {
  state = pointStep(state, bound);
  if (state === "<" || state === ">") return state;
  return Number(state.split(",")[1]) < bound.fraction.length ? "<" : "=";
}

interface Bound {
  value: Decimal;
  inclusive: boolean;
}
type Cmp = [string | null, string | null];
type Multiple = [number, number] | null; // multipleOf's [m, e]
type MagState = [string, number, Cmp, Multiple]; // phase, digits so far, comparators, [remainder, fraction digits]

class Magnitude {
  constructor(
    readonly lower: Bound | null,
    readonly upper: Bound | null,
    readonly integer: boolean,
    readonly multiple: Multiple,
  ) {}

  start(): MagState {
    return ["S", 0, this.settle("i,0,=", "i,0,=")!, this.multiple && [0, 0]];
  }

  private settle(lo: string | null, hi: string | null): Cmp | null {
    if (this.lower === null || lo === ">") lo = null;
    else if (lo === "<") return null;
    if (this.upper === null || hi === "<") hi = null;
    else if (hi === ">") return null;
    return [lo, hi];
  }

  step([phase, count, [lo, hi], rem]: MagState, ch: string): MagState | null {
    const lb = this.lower?.value as Decimal;
    const ub = this.upper?.value as Decimal;
    if (ch === ".") {
      if ((phase !== "Z" && phase !== "I") || this.integer) return null;
      const cmp = this.settle(lo && pointStep(lo, lb), hi && pointStep(hi, ub));
      return cmp && ["D", count, cmp, rem];
    }
    if (ch === "-" || phase === "Z" || count + (phase !== "S" || ch !== "0" ? 1 : 0) > MAX_DIGITS) return null;
    if (phase === "S" && ch === "0") return ["Z", 0, [lo, hi], rem];
    const frac = phase === "D" || phase === "F";
    if (rem) {
      const [m, e] = this.multiple!;
      if (frac && rem[1] === e) {
        // past e fraction digits only zeros keep a multiple
        if (ch !== "0") return null;
      } else {
        rem = [(rem[0] * 10 + Number(ch)) % m, rem[1] + (frac ? 1 : 0)];
      }
    }
    const cmp = this.settle(lo && digitStep(lo, ch, lb, frac), hi && digitStep(hi, ch, ub, frac));
    return cmp && [frac ? "F" : "I", count + 1, cmp, rem];
  }

  accepts([phase, , [lo, hi], rem]: MagState): boolean {
    if (phase !== "Z" && phase !== "I" && phase !== "F") return false;
    if (rem && (rem[0] * 10 ** (this.multiple![1] - rem[1])) % this.multiple![0]) return false;
    if (lo !== null) {
      const r = endOf(lo, this.lower!.value);
      if (!(r === ">" || (r === "=" && this.lower!.inclusive))) return false;
    }
    if (hi !== null) {
      const r = endOf(hi, this.upper!.value);
      if (!(r === "<" || (r === "=" && this.upper!.inclusive))) return false;
    }
    return true;
  }
}

type State = "top" | [string, MagState];
/** A deterministic automaton given by its start, its step (null: no edge) and its accepting states. */
export interface Automaton<T, S> {
  start: T;
  step(s: T, ch: S): T | null;
  accepts(s: T): boolean;
}

function numberAutomaton(kind: string, lower: DecimalBound, upper: DecimalBound, multiple: Multiple): Automaton<State, string> {
  const integer = kind === "integer";
  const parts = new Map<string, Magnitude>();
  if (upper === null || !(upper[0].negative || (isZero(upper[0]) && !upper[1]))) {
    const lo = lower === null || lower[0].negative ? null : { value: lower[0], inclusive: lower[1] };
    parts.set("+", new Magnitude(lo, upper && { value: upper[0], inclusive: upper[1] }, integer, multiple));
  }
  if (lower === null || lower[0].negative) {
    const abs = (d: Decimal): Decimal => ({ ...d, negative: false });
    const lo = upper?.[0].negative
      ? { value: abs(upper[0]), inclusive: upper[1] }
      : { value: { negative: false, whole: "", fraction: "" }, inclusive: false };
    const hi = lower !== null ? { value: abs(lower[0]), inclusive: lower[1] } : null;
    parts.set("-", new Magnitude(lo, hi, integer, multiple));
  }
  return {
    start: "top",
    step(state, ch) {
      if (state === "top") {
        if (ch === "-") return parts.has("-") ? ["-", parts.get("-")!.start()] : null;
        if (!parts.has("+")) return null;
        state = ["+", parts.get("+")!.start()];
      }
      const [side, inner] = state;
      const next = parts.get(side)!.step(inner, ch);
      return next && [side, next];
    },
    accepts: (state) => state !== "top" && parts.get(state[0])!.accepts(state[1]),
  };
}

/**
 * The minimal DFA (states numbered breadth-first from 0 = start, symbols in `symbols` order), or null if
 * it accepts nothing; past `mergeLimit` live states only trimmed. Moore's partition refinement.
 */
export function minimalDfa<T, S>(
  a: Automaton<T, S>,
  symbols: S[],
  mergeLimit: number | null = null,
): [Map<S, number>[], boolean[]] | null {
  const keyOf = (s: T) => JSON.stringify(s);
  const order: T[] = [a.start];
  const index = new Map([[keyOf(a.start), 0]]);
  const edges: Map<S, number>[] = [];
  for (let k = 0; k < order.length; k++) {
    const out = new Map<S, number>();
    for (const ch of symbols) {
      const next = a.step(order[k], ch);
      if (next === null) continue;
      const key = keyOf(next);
      if (!index.has(key)) {
        index.set(key, order.length);
        order.push(next);
      }
      out.set(ch, index.get(key)!);
    }
    edges.push(out);
  }
  const final = order.map((s) => a.accepts(s));
  const sources: number[][] = order.map(() => []);
  edges.forEach((out, i) => {
    for (const t of out.values()) sources[t].push(i);
  });
  const live = new Set(final.flatMap((f, i) => (f ? [i] : []))); // states that can still reach an end: back from the ends
  const todo = [...live];
  while (todo.length) {
    for (const i of sources[todo.pop()!]) {
      if (!live.has(i)) {
        live.add(i);
        todo.push(i);
      }
    }
  }
  if (!live.has(0)) return null;
  const sorted = [...live].sort((x, y) => x - y);
  // Moore's refinement; past mergeLimit states each stays its own class (see the twin)
  const merge = mergeLimit === null || live.size <= mergeLimit;
  let cls = new Map(sorted.map((i) => [i, merge ? (final[i] ? 1 : 0) : i]));
  while (merge) {
    const names = new Map<string, number>();
    const next = new Map<number, number>();
    for (const i of sorted) {
      const sig = JSON.stringify([cls.get(i), [...edges[i]].filter(([, t]) => live.has(t)).map(([ch, t]) => [ch, cls.get(t)])]);
      if (!names.has(sig)) names.set(sig, names.size);
      next.set(i, names.get(sig)!);
    }
    if (names.size === new Set(cls.values()).size) break;
    cls = next;
  }
  const rep = new Map<number, number>();
  for (const i of sorted) if (!rep.has(cls.get(i)!)) rep.set(cls.get(i)!, i);
  const number = new Map([[cls.get(0)!, 0]]);
  const queue = [cls.get(0)!];
  const trans: Map<S, number>[] = [];
  const accepting: boolean[] = [];
  for (let q = 0; q < queue.length; q++) {
    const c = queue[q];
    const i = rep.get(c)!; // the start state for its own class: 0 is the smallest live state
    const out = new Map<S, number>();
    for (const [ch, t] of edges[i]) {
      if (!live.has(t)) continue;
      const tc = cls.get(t)!;
      if (!number.has(tc)) {
        number.set(tc, number.size);
        queue.push(tc);
      }
      out.set(ch, number.get(tc)!);
    }
    trans.push(out);
    accepting.push(final[i]);
  }
  return [trans, accepting];
}

const isDigit = (c: string) => c >= "0" && c <= "9";

function symbolsText(chars: string[]): string {
  if (chars.length === 1) return `"${chars[0]}"`;
  const out: string[] = [];
  for (let k = 0; k < chars.length; ) {
    let j = k;
    while (
      j + 1 < chars.length &&
      chars[j + 1].charCodeAt(0) === chars[j].charCodeAt(0) + 1 &&
      isDigit(chars[j + 1]) &&
      isDigit(chars[k])
    )
      j++;
    out.push(j === k ? chars[k] : j > k + 1 ? `${chars[k]}-${chars[j]}` : chars[k] + chars[j]);
    k = j + 1;
  }
  return `[${out.join("")}]`;
}

function dfaRules(name: string, trans: Map<string, number>[], accepting: boolean[]): string[] {
  return trans.map((out, i) => {
    const alts = accepting[i] ? ['""'] : [];
    const targets = new Map<string, [number, string[]]>(); // "-" on its own: never inside a class
    for (const ch of SYMBOLS) {
      if (!out.has(ch)) continue;
      const t = out.get(ch)!;
      const key = `${t},${ch === "-"}`;
      if (!targets.has(key)) targets.set(key, [t, []]);
      targets.get(key)![1].push(ch);
    }
    for (const [t, chars] of targets.values()) alts.push(`${symbolsText(chars)} ${name}_${t}`);
    return `${name}_${i} ::= ${alts.join(" | ")}`;
  });
}

/** No number the grammar can write lies between the bounds. */
export class NumberRangeError extends Error {
  override name = "NumberRangeError";
}

// a request's schema is checked, then compiled: one automaton for both (null: the range is empty)
const automata = new Map<string, [Map<string, number>[], boolean[]] | null>();

/** The EBNF rules (start: `${name}_0`) for the placeholder `key`. */
export function numberRules(key: string, name: string): string[] {
  const [kind, lower, upper, multiple] = parsePlaceholder(key);
  if (multiple && multiple[0] > MAX_MULTIPLE) {
    throw new NumberRangeError(
      `a multipleOf whose digits read above ${MAX_MULTIPLE} is not supported (its grammar keeps a rule per remainder)`,
    );
  }
  if (!automata.has(key)) {
    if (automata.size >= 512) automata.clear();
    automata.set(key, minimalDfa(numberAutomaton(kind, lower, upper, multiple), SYMBOLS));
  }
  const dfa = automata.get(key)!;
  if (dfa === null) {
    const between = lower || upper ? "lies between the bounds" : "exists";
    throw new NumberRangeError(`no ${kind} of at most ${MAX_DIGITS} digits${multiple ? " that is a multiple" : ""} ${between}`);
  }
  return dfaRules(name, ...dfa);
}
