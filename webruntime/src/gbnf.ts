// xgrammar's grammar, as llama.cpp's GBNF: the `wasm` device hands llama.cpp (wllama) the very
// grammar the `webgpu` device enforces with xgrammar, so both accept the same requests and
// constrain them to the same language.
//
// Input is xgrammar's printed grammar (Grammar.toString(), xgrammar 0.1.27): rules `name ::= body`,
// strings, character classes, groups, `* + ? {m,n}`, lookahead assertions `(= ...)` (hints only:
// dropped) and TagDispatch(...) for structural tags. GBNF differs in rule names (letters, digits
// and '-') and in its escapes, so both are rewritten here.
//
// Two limits of llama.cpp's grammar parser shape the output (both measured in wllama 3.13's build):
// - its left-recursion check recurses once a rule or group per leftmost symbol and gives up past about
//   256 levels. xgrammar writes an object's optional properties as a chain, `part-k ::= ( ( part-k+1 )
//   | ( ", " "key" ... ) )`, three levels a property as printed; groups that change nothing are
//   flattened here (`part-k ::= part-k+1 | ", " "key" ...`), one level a property, so an object with up
//   to about 250 optional properties (JSONSchemaBench's largest: 229) parses.
// - a repetition bound above 2000 (MAX_REPETITION_THRESHOLD) is read as unbounded, which would let a
//   string outrun its maxLength, and a minimum above it is refused: such bounds are written exactly
//   with chunks of 64 (`x{0,5000}` as `( c{0,77} x{0,63} | c{78} x{0,8} )`, `c ::= x{64}`). A
//   repeated group becomes a rule of its own, so that the parser's count of the rules it repeats
//   stays one.
//
// TagDispatch (free text until a trigger, then the tag's grammar) maps onto llama.cpp's lazy
// grammar: free text until a trigger word, then the grammar from the trigger on. Two differences,
// stated in docs/runtime.md, "Devices": after a dispatched tag only more tags may follow (separated by whitespace),
// and TagDispatch must be the whole grammar (as it is for Lantern's tool calls).
import { InvalidRequestError } from "./errors";

export interface LlamaGrammar {
  grammar: string;
  // llama.cpp's lazy mode: free text until one of these words, then `grammar` from the word on
  triggers: string[] | null;
}

type Tok =
  | { t: "name"; v: string }
  | { t: "str"; v: number[] } // code points
  | { t: "class"; neg: boolean; v: [number, number][] }
  | { t: "op"; v: string } // ::= ( ) | * + ? = , {m,n}
  | { t: "word"; v: string }; // true/false/identifiers inside TagDispatch

const ESCAPES: Record<string, number> = { n: 10, r: 13, t: 9, "0": 0, a: 7, b: 8, f: 12, v: 11, e: 27 };

/** Read one (possibly escaped) character at ``i``: [code point, next index]. */
function readChar(s: string, i: number): [number, number] {
  if (s[i] !== "\\") {
    const cp = s.codePointAt(i)!;
    return [cp, i + (cp > 0xffff ? 2 : 1)];
  }
  const c = s[i + 1];
  const hex = { x: 2, u: 4, U: 8 }[c as "x" | "u" | "U"];
  if (hex) {
    let j = i + 2;
    while (j < s.length && j < i + 2 + hex && /[0-9a-fA-F]/.test(s[j])) j++;
    return [parseInt(s.slice(i + 2, j), 16), j];
  }
  return [ESCAPES[c] ?? c.codePointAt(0)!, i + 2];
}

function tokenize(src: string): Tok[] {
  const out: Tok[] = [];
  let i = 0;
  while (i < src.length) {
    const c = src[i];
    if (/\s/.test(c)) {
      i++;
      continue;
    }
    if (c === "#") {
      while (i < src.length && src[i] !== "\n") i++;
      continue;
    }
    if (src.startsWith("::=", i)) {
      out.push({ t: "op", v: "::=" });
      i += 3;
      continue;
    }
    if (c === '"') {
      const v: number[] = [];
      i++;
      while (src[i] !== '"') {
        if (i >= src.length) throw new Error("unterminated string");
        const [cp, j] = readChar(src, i);
        v.push(cp);
        i = j;
      }
      out.push({ t: "str", v });
      i++;
      continue;
    }
    if (c === "[") {
      i++;
      const neg = src[i] === "^";
      if (neg) i++;
      const v: [number, number][] = [];
      while (src[i] !== "]") {
        if (i >= src.length) throw new Error("unterminated character class");
        const [lo, j] = readChar(src, i);
        i = j;
        if (src[i] === "-" && src[i + 1] !== "]") {
          const [hi, k] = readChar(src, i + 1);
          v.push([lo, hi]);
          i = k;
        } else {
          v.push([lo, lo]);
        }
      }
      out.push({ t: "class", neg, v });
      i++;
      continue;
    }
    if (c === "{") {
      const end = src.indexOf("}", i);
      out.push({ t: "op", v: src.slice(i, end + 1).replace(/\s+/g, "") });
      i = end + 1;
      continue;
    }
    if ("()|*+?=,".includes(c)) {
      out.push({ t: "op", v: c });
      i++;
      continue;
    }
    const m = /^[A-Za-z_][A-Za-z0-9_.-]*/.exec(src.slice(i, i + 256));
    if (!m) throw new Error(`unexpected '${c}'`);
    out.push({ t: "name", v: m[0] });
    i += m[0].length;
  }
  return out;
}

// \u with four digits, not \x: xgrammar (which the tests read GBNF back with) takes every hex digit after \x
const hex = (cp: number) => (cp <= 0xffff ? `\\u${cp.toString(16).padStart(4, "0")}` : `\\U${cp.toString(16).padStart(8, "0")}`);

function stringLiteral(cps: number[]): string {
  const body = cps.map((cp) => {
    if (cp === 0x22) return '\\"';
    if (cp === 0x5c) return "\\\\";
    if (cp === 10) return "\\n";
    if (cp === 13) return "\\r";
    if (cp === 9) return "\\t";
    return cp < 0x20 || cp === 0x7f ? hex(cp) : String.fromCodePoint(cp);
  });
  return `"${body.join("")}"`;
}

function classChar(cp: number): string {
  // what GBNF reads specially inside [...] is written as a hex escape
  return cp < 0x20 || cp === 0x7f || "\\]-[^".includes(String.fromCodePoint(cp)) ? hex(cp) : String.fromCodePoint(cp);
}

function classLiteral(neg: boolean, ranges: [number, number][]): string {
  return `[${neg ? "^" : ""}${ranges.map(([lo, hi]) => (lo === hi ? classChar(lo) : `${classChar(lo)}-${classChar(hi)}`)).join("")}]`;
}

interface Rule {
  name: string;
  body: Tok[];
}

function splitRules(toks: Tok[]): Rule[] {
  const rules: Rule[] = [];
  for (let i = 0; i < toks.length; i++) {
    const next = toks[i + 1];
    if (toks[i].t === "name" && next?.t === "op" && next.v === "::=") {
      rules.push({ name: (toks[i] as { v: string }).v, body: [] });
      i++;
    } else if (!rules.length) {
      throw new Error("expected a rule");
    } else {
      rules[rules.length - 1].body.push(toks[i]);
    }
  }
  return rules;
}

/** The index just past the group that opens at ``open`` (a "(" token). */
function closeParen(body: Tok[], open: number): number {
  let depth = 0;
  for (let i = open; i < body.length; i++) {
    const tok = body[i];
    if (tok.t === "op" && tok.v === "(") depth++;
    if (tok.t === "op" && tok.v === ")" && --depth === 0) return i + 1;
  }
  throw new Error("unbalanced parentheses");
}

interface Dispatch {
  pairs: [number[], string][];
  loop: boolean;
}

/** TagDispatch(("trigger", rule), ..., stop_eos=true, stop_str=(), loop_after_dispatch=b) */
function readDispatch(body: Tok[]): Dispatch {
  const pairs: [number[], string][] = [];
  let loop = false;
  for (let i = 2; i < body.length; i++) {
    const tok = body[i];
    const at = (k: number) => body[i + k];
    if (tok.t === "op" && tok.v === "(" && at(1)?.t === "str" && at(3)?.t === "name") {
      pairs.push([(at(1) as { v: number[] }).v, (at(3) as { v: string }).v]);
      i += 4;
    } else if (tok.t === "name" && at(1)?.t === "op" && (at(1) as { v: string }).v === "=") {
      const key = tok.v;
      const value = at(2);
      if (key === "loop_after_dispatch") loop = value?.t === "name" && value.v === "true";
      if (key === "stop_eos" && !(value?.t === "name" && value.v === "true")) throw new Error("TagDispatch without stop_eos");
      if (key === "stop_str" && !(value?.t === "op" && value.v === "(" && (at(3) as { v: string })?.v === ")")) {
        throw new Error("TagDispatch with stop strings");
      }
    }
  }
  if (!pairs.length) throw new Error("TagDispatch without tags");
  return { pairs, loop };
}

/**
 * xgrammar's printed grammar as GBNF for llama.cpp. ``root`` names the root rule. Throws
 * InvalidRequestError for a construct llama.cpp's sampler cannot be given.
 */
export function toLlamaGrammar(xgrammarText: string, root: string): LlamaGrammar {
  let rules: Rule[];
  try {
    rules = splitRules(tokenize(xgrammarText));
  } catch (err) {
    throw new InvalidRequestError(`the grammar could not be translated for llama.cpp: ${(err as Error).message}`);
  }
  const byName = new Map(rules.map((r) => [r.name, r]));
  if (!byName.has(root)) throw new InvalidRequestError(`the grammar has no rule '${root}'`);

  // GBNF names: letters, digits and '-'; "root" is the start rule.
  const names = new Map<string, string>();
  const taken = new Set<string>(["root"]);
  names.set(root, "root");
  for (const r of rules) {
    if (names.has(r.name)) continue;
    let n = `x-${r.name.replace(/[^A-Za-z0-9]/g, "-")}`;
    while (taken.has(n)) n += "-";
    taken.add(n);
    names.set(r.name, n);
  }

  // A structural tag's root is a chain of one-reference rules down to its TagDispatch.
  let triggers: string[] | null = null;
  let dispatchRule: string | null = null;
  for (let name = root; ; ) {
    const body = byName.get(name)!.body;
    if (body[0]?.t === "name" && body[0].v === "TagDispatch") {
      dispatchRule = name;
      break;
    }
    const refs = body.filter((t) => t.t === "name");
    const plain = body.every((t) => t.t === "name" || (t.t === "op" && (t.v === "(" || t.v === ")")));
    if (!plain || refs.length !== 1 || !byName.has((refs[0] as { v: string }).v)) break;
    name = (refs[0] as { v: string }).v;
  }

  const lines: string[] = [];
  for (const r of rules) {
    const out: string[] = [];
    const body = r.body;
    if (body[0]?.t === "name" && body[0].v === "TagDispatch") {
      if (r.name !== dispatchRule) {
        throw new InvalidRequestError(
          "this structural tag is not supported on the wasm device: " + "free text with triggered tags must be the whole output",
        );
      }
      let d: Dispatch;
      try {
        d = readDispatch(body);
      } catch (err) {
        throw new InvalidRequestError(`this structural tag is not supported on the wasm device: ${(err as Error).message}`);
      }
      triggers = [...new Set(d.pairs.map(([t]) => String.fromCodePoint(...t)))];
      const alts = d.pairs.map(([t, rule]) => `${stringLiteral(t)} ${names.get(rule)}`).join(" | ");
      out.push(d.loop ? `(${alts}) ([ \\t\\n]* (${alts}))*` : `(${alts})`);
    } else {
      let alts: Alts;
      try {
        alts = flatten(parseAlts(r.body));
      } catch (err) {
        throw new InvalidRequestError(`the grammar could not be translated for llama.cpp: ${(err as Error).message}`);
      }
      const gbnfName = names.get(r.name)!;
      let helpers = 0;
      const newRule = (body: string): string => {
        let n = `${gbnfName}-r${++helpers}`;
        while (taken.has(n)) n += "-";
        taken.add(n);
        lines.push(`${n} ::= ${body}`);
        return n;
      };
      const emitTok = (tok: Tok): string => {
        if (tok.t === "name") {
          const n = names.get(tok.v);
          if (!n) throw new InvalidRequestError(`the grammar refers to an undefined rule '${tok.v}'`);
          return n;
        }
        if (tok.t === "str") return stringLiteral(tok.v);
        if (tok.t === "class") return classLiteral(tok.neg, tok.v);
        return tok.v;
      };
      const emitAlts = (a: Alts): string => a.map((seq) => (seq.length ? seq.map(emitItem).join(" ") : '""')).join(" | ");
      const emitItem = (it: Item): string => {
        if (it.op === null) return it.node.k === "tok" ? emitTok(it.node.tok) : `( ${emitAlts(it.node.alts)} )`;
        const x = it.node.k === "tok" ? emitTok(it.node.tok) : newRule(emitAlts(it.node.alts));
        const bounds = /^\{(\d*)(,(\d*))?\}$/.exec(it.op);
        if (!bounds) return `${x}${it.op}`; // * + ?
        const min = Number(bounds[1] || 0);
        const max = bounds[2] === undefined ? min : bounds[3] ? Number(bounds[3]) : null;
        return repeat(x, min, max, newRule);
      };
      out.push(emitAlts(alts));
    }
    lines.push(`${names.get(r.name)} ::= ${out.join(" ")}`);
  }
  return { grammar: lines.join("\n"), triggers };
}

// ---- rule bodies as trees: flattened, repetitions within llama.cpp's limits -----------------------

type Node = { k: "tok"; tok: Tok } | { k: "group"; alts: Alts };
interface Item {
  node: Node;
  op: string | null;
} // op: a postfix * + ? {m,n}, or none
type Alts = Item[][]; // alternatives of sequences

const isOp = (tok: Tok | undefined, v: string): boolean => tok?.t === "op" && tok.v === v;

/** A rule body as alternatives of sequences; lookahead assertions `(= ...)` (hints only) are dropped. */
function parseAlts(body: Tok[]): Alts {
  let i = 0;
  const alts = (): Alts => {
    const out: Alts = [[]];
    while (i < body.length && !isOp(body[i], ")")) {
      const tok = body[i];
      const seq = out[out.length - 1];
      if (isOp(tok, "|")) {
        out.push([]);
        i++;
      } else if (isOp(tok, "(") && isOp(body[i + 1], "=")) {
        i = closeParen(body, i);
      } else if (isOp(tok, "(")) {
        i++;
        const inner = alts();
        if (!isOp(body[i], ")")) throw new Error("unbalanced parentheses");
        i++;
        seq.push({ node: { k: "group", alts: inner }, op: null });
      } else if (tok.t === "op" && (tok.v === "*" || tok.v === "+" || tok.v === "?" || tok.v.startsWith("{"))) {
        const last = seq.pop();
        if (!last) throw new Error(`'${tok.v}' with nothing before it`);
        seq.push(last.op === null ? { ...last, op: tok.v } : { node: { k: "group", alts: [[last]] }, op: tok.v });
        i++;
      } else {
        seq.push({ node: { k: "tok", tok }, op: null });
        i++;
      }
    }
    return out;
  };
  const out = alts();
  if (i !== body.length) throw new Error("unbalanced parentheses");
  return out;
}

/** The same language with fewer groups: a group without an operator that is a whole alternative gives
 * its alternatives to the parent, and one of a single sequence gives its items to the sequence around
 * it. Each group is a rule to llama.cpp, a level of its left-recursion check. */
function flatten(alts: Alts): Alts {
  const out: Alts = [];
  for (const seq of alts) {
    const items = seq.map(
      (it): Item => (it.node.k === "group" ? { node: { k: "group", alts: flatten(it.node.alts) }, op: it.op } : it),
    );
    const only = items[0];
    if (items.length === 1 && only.op === null && only.node.k === "group") {
      out.push(...only.node.alts);
      continue;
    }
    out.push(
      items.flatMap((it) => (it.op === null && it.node.k === "group" && it.node.alts.length === 1 ? it.node.alts[0] : [it])),
    );
  }
  return out;
}

// llama.cpp's MAX_REPETITION_THRESHOLD: a bound above it reads as unbounded, a minimum at or above it,
// or a bound at it times the rules repeated, is refused
const REPEAT_LIMIT = 2000;
const CHUNK = 64;

/** ``x`` (one symbol) repeated ``min`` to ``max`` (null: unbounded) times, exactly, in what llama.cpp reads. */
function repeat(x: string, min: number, max: number | null, newRule: (body: string) => string): string {
  if (min < REPEAT_LIMIT && (max === null || max < REPEAT_LIMIT)) {
    if (max === min) return min === 1 ? x : `${x}{${min}}`;
    return `${x}{${min},${max ?? ""}}`;
  }
  let chunk: string | null = null;
  const c = () => (chunk ??= newRule(`${x}{${CHUNK}}`));
  const exactly = (n: number): string[] => {
    const whole = Math.floor(n / CHUNK),
      rest = n % CHUNK;
    return [...(whole ? [repeat(c(), whole, whole, newRule)] : []), ...(rest ? [repeat(x, rest, rest, newRule)] : [])];
  };
  const head = exactly(min);
  if (max === null) return [...head, `${x}*`].join(" ");
  const span = max - min;
  if (span < REPEAT_LIMIT) return [...head, ...(span ? [`${x}{0,${span}}`] : [])].join(" ");
  // 0..span: fewer than q whole chunks and a partial one, or q chunks and at most the rest
  const q = Math.floor(span / CHUNK),
    rest = span % CHUNK;
  const below = `${repeat(c(), 0, q - 1, newRule)} ${x}{0,${CHUNK - 1}}`;
  const at = [repeat(c(), q, q, newRule), ...(rest ? [`${x}{0,${rest}}`] : [])].join(" ");
  return [...head, `( ${below} | ${at} )`].join(" ");
}
