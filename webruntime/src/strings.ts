// Exact grammars for JSON strings with a `pattern` or length bounds, which xgrammar 0.1.27 gets wrong.
//
// What xgrammar does with them (measured on 0.1.27): a pattern is matched against the JSON *text* of
// the string, not its value, so `[^a]+` lets a raw `"` through (invalid JSON) and counts `\u0041` as
// six characters; a pattern with an anchor inside (`a^b`) silently becomes any string; a pattern
// together with minLength/maxLength drops the lengths; a length-bounded string lets raw control
// characters through (a raw tab: invalid JSON).
//
// So a string subschema with any of these is written in the grammar as a placeholder,
// `lantern:string:<hex of [pattern, minLength, maxLength]>`, and stringRules writes its rules:
//
// 1. The pattern is parsed as the part of ECMA-262 (ajv's dialect) that Python's `re` reads alike
//    (jsonschema's): literals, escapes, classes, groups, alternation, greedy or lazy quantifiers, and
//    `^`/`$`. Lookaround, backreferences, word boundaries and named groups are refused by name.
//    Where the two differ, only what both accept is allowed: `\d`, `\w`, `\s` mean their ASCII
//    sets (Python's also match other Unicode digits, letters and spaces), and a negated class or
//    shorthand leaves out every character either engine might count in it. `\p{..}` and `\P{..}` (which
//    Python's re lacks) are read as ajv reads them, with the u flag: a general category by any of
//    ECMA-262's names, or Any, ASCII, Assigned; a category holds the code points that Python's
//    unicodedata and JavaScript both give it (unicode_categories.json, written by ci/gen/unicode_table.py),
//    and a code point they disagree on or that is unassigned counts as "maybe" in every category.
// 2. The whole value must match (xgrammar's reading too): `abc` means `^abc$`, which is stricter than
//    JSON Schema's search and so never lets an invalid value through.
// 3. Thompson's construction gives an automaton over code points (the Basic Multilingual Plane, no
//    surrogates); the subset construction, run together with a counter of characters written, gives a
//    DFA whose accepting states match and have a length within the bounds; dead states are dropped and
//    equal ones merged (numbers.ts's minimalDfa).
// 4. Each DFA edge is a set of characters, written as JSON writes them: printable ASCII raw, `"` and
//    `\` and the control characters escaped, everything else as a `\uXXXX` escape (xgrammar 0.1.27
//    does not match non-ASCII characters in grammar classes, so a model writes them escaped).
//
// The only copy: the browser bundles it and `lantern serve` runs it in V8 (structured.ts's header);
// tests/test_structured_exact.py checks what its rules accept against jsonschema and ajv.
import { type Automaton, minimalDfa, payloadPlaceholder, placeholderPayload } from "./numbers";

const MAX_NFA_STATES = 4000;
const MAX_MERGED = 500; // equal states are merged in string automata up to this size
const MAX_DFA_STATES = 2000;
const TOP = 0xffff;
type Chars = [number, number][]; // sorted, disjoint, non-touching [lo, hi] pairs
const ALL: Chars = [
  [0, 0xd7ff],
  [0xe000, TOP],
];
const ASCII: Chars = [[0, 0x7f]];
const DIGITS: Chars = [[0x30, 0x39]];
const WORD: Chars = [
  [0x30, 0x39],
  [0x41, 0x5a],
  [0x5f, 0x5f],
  [0x61, 0x7a],
];
const SPACE: Chars = [
  [0x09, 0x0d],
  [0x20, 0x20],
];
const SPACE_MAYBE: Chars = [
  [0x09, 0x0d],
  [0x1c, 0x20],
  [0x80, TOP],
];
const LINE_ENDS: Chars = [
  [0x0a, 0x0a],
  [0x0d, 0x0d],
  [0x2028, 0x2029],
];
// biome-ignore lint/complexity/useSimpleNumberKeys: code points in hex, as in the tables around
const SHORT_ESCAPES: Record<number, string> = { 0x08: "b", 0x09: "t", 0x0a: "n", 0x0c: "f", 0x0d: "r" };
const CONTROL_ESCAPES: Record<string, number> = { t: 0x09, n: 0x0a, v: 0x0b, f: 0x0c, r: 0x0d, "0": 0x00 };
const SYNTAX = "^$\\.*+?()[]{}|/";
const RAW: Chars = [
  [0x20, 0x21],
  [0x23, 0x5b],
  [0x5d, 0x7e],
]; // printable ASCII a JSON string holds unescaped
// \p{..}: the general categories both engines agree on, written by ci/gen/unicode_table.py (esbuild inlines
// compiler/contracts/unicode_categories.json, which the Python twin reads)
declare const __UNICODE_CATEGORIES__: { categories: Record<string, string>; names: Record<string, string[]> };
const UNICODE = __UNICODE_CATEGORIES__;

/** A pattern Lantern cannot enforce exactly, or one that no string (within the lengths) matches. */
export class PatternError extends Error {
  override name = "PatternError";
}

// ---- sets of code points -----------------------------------------------------------------------

function norm(pairs: Chars): Chars {
  const out: Chars = [];
  for (const [lo, hi] of [...pairs].sort((a, b) => a[0] - b[0] || a[1] - b[1])) {
    const last = out[out.length - 1];
    if (last && lo <= last[1] + 1) last[1] = Math.max(last[1], hi);
    else out.push([lo, hi]);
  }
  return out;
}

function minus(a: Chars, b: Chars): Chars {
  const out: Chars = [];
  for (const [lo0, hi] of a) {
    let lo = lo0;
    for (const [blo, bhi] of b) {
      if (bhi < lo || blo > hi) continue;
      if (blo > lo) out.push([lo, blo - 1]);
      lo = bhi + 1;
      if (lo > hi) break;
    }
    if (lo <= hi) out.push([lo, hi]);
  }
  return norm(out);
}

const intersect = (a: Chars, b: Chars): Chars => minus(a, minus(a, b));
const same = (a: Chars, b: Chars): boolean => JSON.stringify(a) === JSON.stringify(b);

const tableRanges = (text: string): Chars =>
  (text ? text.split(" ") : []).map((r): [number, number] => {
    const [a, b] = r.split("-");
    return [parseInt(a, 16), parseInt(b ?? a, 16)];
  });
const CATEGORIES: Record<string, Chars> = Object.fromEntries(
  Object.entries(UNICODE.categories).map(([c, text]) => [c, tableRanges(text)]),
);
const ASSIGNED = norm(Object.values(CATEGORIES).flat()); // those both engines agree on
const UNKNOWN = minus(ALL, ASSIGNED);
const BINARY_PROPERTIES: Record<string, [Chars, Chars]> = { Any: [ALL, ALL], ASCII: [ASCII, ASCII], Assigned: [ASSIGNED, ALL] };

// ---- the pattern --------------------------------------------------------------------------------

export type Node =
  | { t: "set"; chars: Chars }
  | { t: "cat"; items: Node[] }
  | { t: "alt"; branches: Node[] }
  | { t: "rep"; node: Node; lo: number; hi: number | null }
  | { t: "bol" }
  | { t: "eol" };

const isDigit = (ch: string): boolean => ch.length === 1 && ch >= "0" && ch <= "9";

class Parser {
  private i = 0;
  private readonly p: string[];

  constructor(pattern: string) {
    this.p = Array.from(pattern); // code points, so positions count as Python's do
  }

  private fail(what: string): never {
    throw new PatternError(`${what} at position ${this.i} of the pattern`);
  }

  private peek(): string {
    return this.i < this.p.length ? this.p[this.i] : "";
  }

  parse(): Node {
    const node = this.alt();
    if (this.i < this.p.length) this.fail("unmatched ')'");
    return node;
  }

  private alt(): Node {
    const branches = [this.seq()];
    while (this.peek() === "|") {
      this.i++;
      branches.push(this.seq());
    }
    return branches.length === 1 ? branches[0] : { t: "alt", branches };
  }

  private seq(): Node {
    const items: Node[] = [];
    while (!["", "|", ")"].includes(this.peek())) items.push(this.quantified(this.atom()));
    return { t: "cat", items };
  }

  private number(): number | null {
    const start = this.i;
    while (isDigit(this.peek())) this.i++;
    return this.i > start ? Number(this.p.slice(start, this.i).join("")) : null;
  }

  private quantified(node: Node): Node {
    const ch = this.peek();
    let lo: number;
    let hi: number | null;
    if (ch === "*" || ch === "+" || ch === "?") {
      this.i++;
      [lo, hi] = ch === "*" ? [0, null] : ch === "+" ? [1, null] : [0, 1];
    } else if (ch === "{") {
      this.i++;
      const n = this.number();
      if (n === null) this.fail("a '{' that starts no {n,m} quantifier");
      lo = n;
      hi = lo;
      if (this.peek() === ",") {
        this.i++;
        hi = this.number();
      }
      if (this.peek() !== "}") this.fail("an unclosed {n,m} quantifier");
      this.i++;
      if (hi !== null && hi < lo) this.fail(`a quantifier {${lo},${hi}} whose minimum is above its maximum`);
    } else {
      return node;
    }
    if (node.t === "bol" || node.t === "eol") this.fail("a quantifier on an anchor");
    if (this.peek() === "?") this.i++; // lazy: the same strings
    if (["*", "+", "?", "{"].includes(this.peek())) this.fail("a quantifier on a quantifier");
    return { t: "rep", node, lo, hi };
  }

  private atom(): Node {
    const ch = this.peek();
    this.i++;
    if (ch === "(") {
      if (this.peek() === "?") {
        if (this.p[this.i + 1] === ":") this.i += 2;
        else this.fail("lookaround and named groups are not supported");
      }
      const node = this.alt();
      if (this.peek() !== ")") this.fail("an unclosed '('");
      this.i++;
      return node;
    }
    if (ch === "[") return { t: "set", chars: this.charClass() };
    if (ch === ".") return { t: "set", chars: minus(ALL, LINE_ENDS) };
    if (ch === "^") return { t: "bol" };
    if (ch === "$") return { t: "eol" };
    if (ch === "\\") return { t: "set", chars: this.escape(false)[0] };
    if (ch === "*" || ch === "+" || ch === "?" || ch === "{") {
      this.i--;
      this.fail(`a quantifier '${ch}' with nothing to repeat`);
    }
    if (ch === "}" || ch === "]") {
      this.i--;
      this.fail(`a lone '${ch}'`);
    }
    return { t: "set", chars: this.literal(ch) };
  }

  private literal(ch: string): Chars {
    const code = ch.codePointAt(0)!;
    if (code > TOP || (code >= 0xd800 && code <= 0xdfff)) {
      this.i--;
      this.fail(code > TOP ? "a character above U+FFFF" : "a lone surrogate");
    }
    return [[code, code]];
  }

  /** [certain, possible] after a backslash: what every engine, and what some engine, matches. */
  private escape(inClass: boolean): [Chars, Chars] {
    const ch = this.peek();
    this.i++;
    const shorthand: Record<string, [Chars, Chars]> = {
      d: [DIGITS, norm([...DIGITS, [0x80, TOP]])],
      w: [WORD, norm([...WORD, [0x80, TOP]])],
      s: [SPACE, SPACE_MAYBE],
    };
    const lower = ch.toLowerCase();
    if (Object.hasOwn(shorthand, lower)) {
      const [certain, possible] = shorthand[lower];
      if (ch === lower) return [certain, possible];
      return [intersect(minus(ALL, possible), ASCII), minus(ALL, certain)];
    }
    if (ch === "p" || ch === "P") {
      const [certain, possible] = this.unicodeProperty(ch);
      return ch === "P" ? [minus(ALL, possible), minus(ALL, certain)] : [certain, possible];
    }
    let code: number;
    if (Object.hasOwn(CONTROL_ESCAPES, ch)) {
      if (ch === "0" && isDigit(this.peek())) this.fail("an octal escape");
      code = CONTROL_ESCAPES[ch];
    } else if (ch === "x" || ch === "u") {
      const width = ch === "x" ? 2 : 4;
      const digits = this.p.slice(this.i, this.i + width).join("");
      if (digits.length !== width || !/^[0-9A-Fa-f]+$/.test(digits)) this.fail(`an escape \\${ch} without ${width} hex digits`);
      this.i += width;
      code = parseInt(digits, 16);
      if (code >= 0xd800 && code <= 0xdfff) this.fail("a surrogate escape");
    } else if (ch !== "" && (SYNTAX.includes(ch) || (inClass && ch === "-"))) {
      code = ch.codePointAt(0)!;
    } else {
      this.i--;
      this.fail(ch ? `the escape \\${ch} (not read alike by JavaScript and Python)` : "a trailing backslash");
    }
    return [[[code, code]], [[code, code]]];
  }

  /** What the escape at `i` (just after its backslash) certainly matches; the parser then stands after it. */
  escapeAt(i: number, inClass: boolean): Chars {
    this.i = i;
    return this.escape(inClass)[0];
  }

  get position(): number {
    return this.i;
  }

  /** [certain, possible] of `\p{name}` (see the twin's unicode_property). */
  private unicodeProperty(ch: string): [Chars, Chars] {
    const end = this.p.indexOf("}", this.i);
    if (this.peek() !== "{" || end < 0) this.fail(`a \\${ch} without a {name}`);
    const name = this.p.slice(this.i + 1, end).join("");
    const cut = name.lastIndexOf("=");
    const key = cut < 0 ? "" : name.slice(0, cut);
    const value = name.slice(cut + 1);
    if (!["", "gc", "General_Category"].includes(key)) {
      this.fail(`the Unicode property \\${ch}{${name}} (Lantern reads general categories, Any, ASCII and Assigned)`);
    }
    if (!(Object.hasOwn(UNICODE.names, value) || (!key && Object.hasOwn(BINARY_PROPERTIES, value)))) {
      this.fail(`an unknown Unicode property \\${ch}{${name}}`);
    }
    this.i = end + 1;
    if (Object.hasOwn(BINARY_PROPERTIES, value)) return BINARY_PROPERTIES[value];
    const certain = norm(UNICODE.names[value].flatMap((c) => CATEGORIES[c] ?? []));
    return [certain, norm([...certain, ...UNKNOWN])];
  }

  /** [certain, possible, single character?] of one class member. */
  private classAtom(): [Chars, Chars, boolean] {
    const ch = this.peek();
    if (ch === "") this.fail("an unclosed '['");
    this.i++;
    if (ch === "\\") {
      const [certain, possible] = this.escape(true);
      return [certain, possible, certain.length === 1 && certain[0][0] === certain[0][1] && same(certain, possible)];
    }
    if (ch === "[") {
      this.i--;
      this.fail("a '[' inside a class (read differently by JavaScript and Python)");
    }
    const single = this.literal(ch);
    return [single, single, true];
  }

  private charClass(): Chars {
    const negated = this.peek() === "^";
    if (negated) this.i++;
    let certain: Chars = [];
    let possible: Chars = [];
    if (this.peek() === "]") this.fail("an empty class '[]'");
    while (this.peek() !== "]") {
      let [c1, p1, single] = this.classAtom();
      const after = this.p[this.i + 1] ?? "";
      if (this.peek() === "-" && after !== "]" && after !== "") {
        this.i++;
        const [c2, , single2] = this.classAtom();
        if (!(single && single2)) this.fail("a range with a class shorthand at one end");
        if (c2[0][0] < c1[0][0]) this.fail("a range out of order");
        c1 = p1 = [[c1[0][0], c2[0][0]]];
      }
      certain = [...certain, ...c1];
      possible = [...possible, ...p1];
    }
    this.i++;
    if (negated) return minus(ALL, norm(possible));
    return intersect(norm(certain), ALL);
  }
}

export const parsePattern = (pattern: string): Node => new Parser(pattern).parse();

/** `pattern` with each `\p{..}` and `\P{..}` written out as a class (see the twin's with_classes). */
export function withClasses(pattern: string): string {
  const p = Array.from(pattern);
  const out: string[] = [];
  let inClass = false;
  for (let i = 0; i < p.length; ) {
    const ch = p[i];
    if (ch === "\\" && (p[i + 1] === "p" || p[i + 1] === "P")) {
      const parser = new Parser(pattern);
      let chars: Chars;
      try {
        chars = parser.escapeAt(i + 1, inClass);
      } catch (err) {
        if (!(err instanceof PatternError)) throw err;
        out.push(ch, p[i + 1]);
        i += 2;
        continue;
      }
      const hex = (c: number) => `\\u${c.toString(16).padStart(4, "0")}`;
      const ranges = chars.map(([lo, hi]) => (lo === hi ? hex(lo) : `${hex(lo)}-${hex(hi)}`)).join("");
      out.push(inClass ? ranges : ranges ? `[${ranges}]` : "(?!)");
      i = parser.position;
      continue;
    }
    if (ch === "\\") {
      out.push(...p.slice(i, i + 2));
      i += 2;
      continue;
    }
    inClass = (inClass && ch !== "]") || (!inClass && ch === "[");
    out.push(ch);
    i++;
  }
  return out.join("");
}

/** PatternError unless `pattern` matches some string and only characters of RAW (see the twin). */
export function checkPlainPattern(pattern: string): void {
  const sets = (node: Node): Chars[] =>
    node.t === "set"
      ? [node.chars]
      : node.t === "cat"
        ? node.items.flatMap(sets)
        : node.t === "alt"
          ? node.branches.flatMap(sets)
          : node.t === "rep"
            ? sets(node.node)
            : [];
  if (sets(parsePattern(pattern)).some((chars) => minus(chars, RAW).length)) {
    throw new PatternError(
      "it may match a quote, a backslash, a control or a non-ASCII character, which the grammar engine " +
        "would write unescaped here; narrow it to printable ASCII, or use propertyNames with the pattern (enforced exactly)",
    );
  }
  stringDfa(pattern, 0, null);
}

// ---- pattern -> NFA -----------------------------------------------------------------------------

type Edge = [kind: "eps" | "bol" | "eol" | "set", chars: Chars, target: number];

class Nfa {
  readonly edges: Edge[][] = [];

  state(): number {
    if (this.edges.length >= MAX_NFA_STATES) {
      throw new PatternError(`the pattern needs more than ${MAX_NFA_STATES} automaton states (shorten its {n,m} counts)`);
    }
    this.edges.push([]);
    return this.edges.length - 1;
  }

  build(node: Node, start: number): number {
    switch (node.t) {
      case "set": {
        const end = this.state();
        this.edges[start].push(["set", node.chars, end]);
        return end;
      }
      case "bol":
      case "eol": {
        const end = this.state();
        this.edges[start].push([node.t, [], end]);
        return end;
      }
      case "cat":
        for (const item of node.items) start = this.build(item, start);
        return start;
      case "alt": {
        const end = this.state();
        for (const branch of node.branches) this.edges[this.build(branch, start)].push(["eps", [], end]);
        return end;
      }
      case "rep": {
        for (let k = 0; k < node.lo; k++) start = this.build(node.node, start);
        if (node.hi === null) {
          const loop = this.state();
          this.edges[start].push(["eps", [], loop]);
          this.edges[this.build(node.node, loop)].push(["eps", [], loop]);
          return loop;
        }
        const end = this.state();
        for (let k = 0; k < node.hi - node.lo; k++) {
          this.edges[start].push(["eps", [], end]);
          start = this.build(node.node, start);
        }
        this.edges[start].push(["eps", [], end]);
        return end;
      }
    }
  }
}

// A thread is state * 2 + (1 if past `$`); a DFA state is "count|sorted threads".
function closure(nfa: Nfa, threads: number[], atStart: boolean): number[] {
  const seen = new Set(threads);
  const todo = [...threads];
  while (todo.length) {
    const thread = todo.pop()!;
    const ended = thread % 2;
    for (const [kind, , target] of nfa.edges[thread >> 1]) {
      if (kind === "eps" || (kind === "bol" && atStart) || kind === "eol") {
        const next = target * 2 + (ended || kind === "eol" ? 1 : 0);
        if (!seen.has(next)) {
          seen.add(next);
          todo.push(next);
        }
      }
    }
  }
  return [...seen].sort((a, b) => a - b);
}

function minterms(sets: Chars[]): Chars[] {
  const cuts = [...new Set(sets.flatMap((s) => s.flatMap(([lo, hi]) => [lo, hi + 1])))].sort((a, b) => a - b);
  const groups = new Map<string, Chars>();
  for (let k = 0; k + 1 < cuts.length; k++) {
    const lo = cuts[k];
    const member = sets.flatMap((s, i) => (s.some(([a, b]) => a <= lo && lo <= b) ? [i] : []));
    if (!member.length) continue;
    const key = member.join(",");
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key)!.push([lo, cuts[k + 1] - 1]);
  }
  return [...groups.values()].map(norm);
}

type Dfa = [Map<number, number>[], boolean[], Chars[]];

function stringDfa(pattern: string | null, minLength: number, maxLength: number | null, search = false): Dfa {
  const nfa = new Nfa();
  const start = nfa.state();
  const anything: Node = { t: "rep", node: { t: "set", chars: ALL }, lo: 0, hi: null };
  const node = pattern !== null ? parsePattern(pattern) : anything;
  const end = nfa.build(search ? { t: "cat", items: [anything, node, anything] } : node, start);
  const sets = minterms(nfa.edges.flatMap((edges) => edges.filter(([kind]) => kind === "set").map(([, chars]) => chars)));
  const member = new Map<string, number[]>();
  nfa.edges.forEach((edges, s) => {
    for (const [kind, chars, target] of edges) {
      if (kind !== "set") continue;
      sets.forEach((term, m) => {
        if (!same(intersect(term, chars), term)) return;
        const key = `${s},${m}`;
        if (!member.has(key)) member.set(key, []);
        member.get(key)!.push(target);
      });
    }
  });
  const cap = maxLength ?? minLength;
  const key = (threads: number[], count: number) => `${count}|${threads.join(",")}`;
  const parse = (state: string): [number[], number] => {
    const [count, threads] = state.split("|");
    return [threads ? threads.split(",").map(Number) : [], Number(count)];
  };
  const first = key(closure(nfa, [start * 2], true), 0);
  const seen = new Set([first]);
  const automaton: Automaton<string, number> = {
    start: first,
    step(state, m) {
      const [threads, count] = parse(state);
      if (maxLength !== null && count >= maxLength) return null;
      const moved = new Set<number>();
      for (const thread of threads) {
        if (thread % 2) continue;
        for (const t of member.get(`${thread >> 1},${m}`) ?? []) moved.add(t * 2);
      }
      if (!moved.size) return null;
      const next = key(closure(nfa, [...moved], false), Math.min(count + 1, cap));
      seen.add(next);
      if (seen.size > MAX_DFA_STATES) {
        throw new PatternError(`the pattern with these lengths needs more than ${MAX_DFA_STATES} automaton states`);
      }
      return next;
    },
    accepts(state) {
      const [threads, count] = parse(state);
      return count >= minLength && threads.some((thread) => thread >> 1 === end);
    },
  };
  const dfa = minimalDfa(
    automaton,
    sets.map((_, m) => m),
    MAX_MERGED,
  );
  if (dfa === null) throw new PatternError(pattern !== null ? "no string matches it" : "no string has such a length");
  return [dfa[0], dfa[1], sets];
}

/** Whether some name matches `full` in full and `search` somewhere (see the twin's patterns_overlap). */
export function patternsOverlap(full: string, search: string): boolean {
  let a: Dfa, b: Dfa;
  try {
    a = stringDfa(full, 0, null);
    b = stringDfa(search, 0, null, true);
  } catch (err) {
    if (err instanceof PatternError) return true;
    throw err;
  }
  const [ta, fa, sa] = a;
  const [tb, fb, sb] = b;
  const seen = new Set(["0,0"]);
  const todo: [number, number][] = [[0, 0]];
  while (todo.length) {
    const [x, y] = todo.pop()!;
    if (fa[x] && fb[y]) return true;
    for (const [ma, nx] of ta[x]) {
      for (const [mb, ny] of tb[y]) {
        if (!seen.has(`${nx},${ny}`) && intersect(sa[ma], sb[mb]).length) {
          seen.add(`${nx},${ny}`);
          todo.push([nx, ny]);
        }
      }
    }
  }
  return false;
}

// ---- writing character sets as JSON text --------------------------------------------------------

function hexDigits(lo: number, hi: number): string {
  if (lo === hi) return `"${lo.toString(16)}"`;
  const parts: string[] = [];
  for (const [a, b] of [
    [lo, Math.min(hi, 9)],
    [Math.max(lo, 10), hi],
  ]) {
    if (a <= b) parts.push(a === b ? a.toString(16) : `${a.toString(16)}-${b.toString(16)}`);
  }
  return `[${parts.join("")}]`;
}

function hexRanges(lo: number, hi: number, width: number): [number, number][][] {
  if (width === 0) return [[]];
  const base = 16 ** (width - 1);
  let first = Math.floor(lo / base);
  let last = Math.floor(hi / base);
  if (first === last) return hexRanges(lo % base, hi % base, width - 1).map((rest) => [[first, first], ...rest]);
  let out: [number, number][][] = [];
  if (lo % base) {
    const f = first;
    out = out.concat(hexRanges(lo % base, base - 1, width - 1).map((rest) => [[f, f], ...rest]));
    first++;
  }
  let tail: [number, number][][] = [];
  if (hi % base !== base - 1) {
    const l = last;
    tail = hexRanges(0, hi % base, width - 1).map((rest) => [[l, l], ...rest]);
    last--;
  }
  if (first <= last) out.push([[first, last], ...Array.from({ length: width - 1 }, (): [number, number] => [0, 15])]);
  return out.concat(tail);
}

function classChar(code: number): string {
  const ch = String.fromCharCode(code);
  return "]\\^-".includes(ch) ? `\\${ch}` : ch;
}

function charsEbnf(chars: Chars): string {
  const alts: string[] = [];
  const raw = intersect(chars, RAW);
  if (raw.length)
    alts.push(`[${raw.map(([lo, hi]) => (lo === hi ? classChar(lo) : `${classChar(lo)}-${classChar(hi)}`)).join("")}]`);
  if (intersect(chars, [[0x22, 0x22]]).length) alts.push('"\\\\\\""');
  if (intersect(chars, [[0x5c, 0x5c]]).length) alts.push('"\\\\\\\\"');
  const escaped: Chars = [];
  for (const [lo, hi] of minus(chars, [...RAW, [0x22, 0x22], [0x5c, 0x5c]])) {
    for (let code = lo; code <= Math.min(hi, 0x1f); code++) {
      if (Object.hasOwn(SHORT_ESCAPES, code)) alts.push(`"\\\\${SHORT_ESCAPES[code]}"`);
      else escaped.push([code, code]);
    }
    if (hi > 0x1f) escaped.push([Math.max(lo, 0x7f), hi]);
  }
  if (escaped.length) {
    const seqs = norm(escaped).flatMap(([lo, hi]) => hexRanges(lo, hi, 4));
    const body = seqs.map((seq) => seq.map(([a, b]) => hexDigits(a, b)).join(" ")).join(" | ");
    alts.push(seqs.length > 1 ? `"\\\\u" (${body})` : `"\\\\u" ${body}`);
  }
  return alts.map((a) => (a.includes(" ") && alts.length > 1 ? `(${a})` : a)).join(" | ");
}

// ---- placeholders -------------------------------------------------------------------------------

const KIND = "string";
const automata = new Map<string, Dfa>();

/** The placeholder for a string subschema: its pattern and lengths, hex-encoded (see the twin). */
export function placeholder(pattern: string | null, minLength: number, maxLength: number | null): string {
  if (pattern !== null) parsePattern(pattern);
  return payloadPlaceholder(KIND, [pattern, minLength, maxLength]);
}

/**
 * [characters, least, most] when the strings are a run of one class within lengths, written as xgrammar's
 * repetition of one character class: a string with only a maxLength (characters: null, any character JSON
 * holds raw, escapes left out), or a pattern like `^[a-z0-9]{2,40}$` over printable ASCII; else null: the
 * automaton, which counts escapes and non-ASCII characters exactly. (xgrammar masks a repeated single class in
 * ~1 ms a token against a 49k vocabulary; a repeated alternation, or the automaton's chain, takes 20-120 ms.)
 * PatternError when no length is left.
 */
export function oneClass(
  pattern: string | null,
  minLength: number,
  maxLength: number | null,
): [Chars | null, number, number | null] | null {
  if (pattern === null) return minLength === 0 && maxLength !== null ? [null, 0, maxLength] : null;
  let node: Node = parsePattern(pattern);
  if (node.t === "cat") {
    let parts = node.items;
    if (parts.length && parts[0].t === "bol") parts = parts.slice(1);
    if (parts.length && parts[parts.length - 1].t === "eol") parts = parts.slice(0, -1);
    if (parts.length !== 1) return null;
    node = parts[0];
  }
  if (node.t === "set") node = { t: "rep", node, lo: 1, hi: 1 };
  if (node.t !== "rep" || node.node.t !== "set" || !node.node.chars.length || minus(node.node.chars, RAW).length) {
    return null; // (an empty class: the automaton finds whether any string matches)
  }
  const lo = Math.max(node.lo, minLength);
  const hi = maxLength === null ? node.hi : node.hi === null ? maxLength : Math.min(node.hi, maxLength);
  if (hi !== null && lo > hi) throw new PatternError("no string matches it");
  return [norm(node.node.chars), lo, hi];
}

/** The EBNF rules (start: `${name}_0`) for the placeholder `key`: the quoted string. */
export function stringRules(key: string, name: string): string[] {
  const run = oneClass(...(placeholderPayload(key) as [string | null, number, number | null]));
  if (run !== null) {
    const [chars, lo, hi] = run;
    const char = chars === null ? '[^"\\\\\\x00-\\x1f]' : charsEbnf(chars); // one class, repeated in place (see the twin)
    return [`${name}_0 ::= "\\"" ${char}{${lo},${hi === null ? "" : hi}} "\\""`];
  }
  if (!automata.has(key)) {
    if (automata.size >= 256) automata.clear();
    automata.set(key, stringDfa(...(placeholderPayload(key) as [string | null, number, number | null])));
  }
  const [trans, accepting, sets] = automata.get(key)!;
  const rules = [`${name}_0 ::= "\\"" ${name}_s0`];
  const charRules = new Map<string, [string, Chars]>();
  trans.forEach((out, i) => {
    const alts = accepting[i] ? ['"\\""'] : [];
    const byTarget = new Map<number, Chars>();
    for (const [m, t] of out) byTarget.set(t, [...(byTarget.get(t) ?? []), ...sets[m]]);
    for (const [t, unsorted] of byTarget) {
      const chars = norm(unsorted);
      const k = JSON.stringify(chars);
      if (!charRules.has(k)) charRules.set(k, [`${name}_c${charRules.size}`, chars]);
      alts.push(`${charRules.get(k)![0]} ${name}_s${t}`);
    }
    rules.push(`${name}_s${i} ::= ${alts.join(" | ")}`);
  });
  for (const [rule, chars] of charRules.values()) rules.push(`${rule} ::= ${charsEbnf(chars)}`);
  return rules;
}
