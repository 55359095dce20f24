// xgrammar's grammar, as llama.cpp's GBNF: the `wasm` device hands llama.cpp (wllama) the very
// grammar the `webgpu` device enforces with xgrammar, so both accept the same requests and
// constrain them to the same language.
//
// Input is xgrammar's printed grammar (Grammar.toString(), xgrammar 0.1.27): rules `name ::= body`,
// strings, character classes, groups, `* + ? {m,n}`, lookahead assertions `(= ...)` (hints only:
// dropped) and TagDispatch(...) for structural tags. GBNF differs in rule names (letters, digits
// and '-') and in its escapes, so both are rewritten here.
//
// TagDispatch (free text until a trigger, then the tag's grammar) maps onto llama.cpp's lazy
// grammar: free text until a trigger word, then the grammar from the trigger on. Two differences,
// stated in the README: after a dispatched tag only more tags may follow (separated by whitespace),
// and TagDispatch must be the whole grammar (as it is for Lantern's tool calls).
import { InvalidRequestError } from "./errors";

export interface LlamaGrammar {
  grammar: string;
  // llama.cpp's lazy mode: free text until one of these words, then `grammar` from the word on
  triggers: string[] | null;
}

type Tok =
  | { t: "name"; v: string }
  | { t: "str"; v: number[] }  // code points
  | { t: "class"; neg: boolean; v: [number, number][] }
  | { t: "op"; v: string }  // ::= ( ) | * + ? = , {m,n}
  | { t: "word"; v: string };  // true/false/identifiers inside TagDispatch

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
    if (/\s/.test(c)) { i++; continue; }
    if (c === "#") { while (i < src.length && src[i] !== "\n") i++; continue; }
    if (src.startsWith("::=", i)) { out.push({ t: "op", v: "::=" }); i += 3; continue; }
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
    if ("()|*+?=,".includes(c)) { out.push({ t: "op", v: c }); i++; continue; }
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

interface Rule { name: string; body: Tok[] }

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

interface Dispatch { pairs: [number[], string][]; loop: boolean }

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
  for (let name = root; ;) {
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
        throw new InvalidRequestError("this structural tag is not supported on the wasm device: " +
          "free text with triggered tags must be the whole output");
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
      for (let i = 0; i < body.length; i++) {
        const tok = body[i];
        if (tok.t === "op" && tok.v === "(" && body[i + 1]?.t === "op" && (body[i + 1] as { v: string }).v === "=") {
          i = closeParen(body, i) - 1;  // a lookahead assertion: a matching hint, not part of the language
          continue;
        }
        if (tok.t === "name") {
          const n = names.get(tok.v);
          if (!n) throw new InvalidRequestError(`the grammar refers to an undefined rule '${tok.v}'`);
          out.push(n);
        } else if (tok.t === "str") out.push(stringLiteral(tok.v));
        else if (tok.t === "class") out.push(classLiteral(tok.neg, tok.v));
        else out.push(tok.v);
      }
    }
    lines.push(`${names.get(r.name)} ::= ${out.join(" ")}`);
  }
  return { grammar: lines.join("\n"), triggers };
}
