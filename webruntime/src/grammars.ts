// xgrammar in the browser (web-xgrammar, in wasm): a grammar spec from structured.ts compiled against the
// model's vocabulary, and the token mask of one generation. The server's twin is the xgrammar half of
// lantern/server/grammars.py (xgrammar 0.1.27 on both sides); what the specs say is written once, in
// structured.ts, which the server runs too.
import "@mlc-ai/web-xgrammar";
import type * as XGrammar from "@mlc-ai/web-xgrammar";
import { InvalidRequestError, LanternError } from "./errors";
import { COMPILE_LIMITS, type GrammarSpec, withExactRules } from "./structured";

// Like web-tokenizers, the package is a UMD script marked as an ES module: it installs globalThis.xgrammar.
const xgr = (): typeof XGrammar => (globalThis as unknown as { xgrammar: typeof XGrammar }).xgrammar;
const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/** xgrammar's error without its C++ source location. */
function engineMessage(err: unknown): string {
  return String(err instanceof Error ? err.message : err)
    .trim()
    .replace(/^\[[^\]]*\]\s*\S+:\d+:\s*/, "")
    .split("\n")[0];
}

// On a bad schema or grammar, web-xgrammar aborts the wasm call ("RuntimeError: Aborted()") and
// prints the reason with console.error, bound when its module starts. Listening from before that
// start keeps the reason, so the error can name it. (The module keeps working after an abort.)
let engineLine = "";
let listening = false;
function listenToEngine(): void {
  if (listening) return;
  listening = true;
  const forward = console.error;
  console.error = (...args: unknown[]) => {
    const line = args.map(String).join(" ");
    if (line.includes("[FATAL]")) engineLine = line.slice(line.indexOf("[FATAL]"));
    forward.apply(console, args);
  };
}

// JSON on one line (no free whitespace, indent -1) with OpenAI's separators, in strict mode: the
// same layout as the server's JSON_LAYOUT.
const SEPARATORS: [string, string] = [", ", ": "];

/**
 * The EBNF grammar of a checked schema (JSON text) in the layout above, number placeholders swapped
 * for their exact rules. The twin of grammars.py's schema_ebnf.
 */
export async function schemaEbnf(source: string): Promise<string> {
  const grammar = await xgr().Grammar.fromJSONSchema(source, false, -1, SEPARATORS, true);
  try {
    return withExactRules(grammar.toString());
  } finally {
    grammar.dispose();
  }
}

/**
 * A structural tag with each `json_schema` content replaced by that schema's grammar in the layout
 * above. xgrammar's structural tags put free whitespace inside JSON, where a small model can loop
 * until max_tokens; response_format's JSON has none. The twin of grammars.py's tight_structural_tag.
 */
export async function tightStructuralTag(source: string): Promise<string> {
  const visit = async (node: unknown): Promise<unknown> => {
    if (Array.isArray(node)) return Promise.all(node.map(visit));
    if (!isObject(node)) return node;
    if (node.type === "json_schema" && "json_schema" in node) {
      return { type: "grammar", grammar: await schemaEbnf(JSON.stringify(node.json_schema)) };
    }
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(node)) out[k] = await visit(v);
    return out;
  };
  return JSON.stringify(await visit(JSON.parse(source)));
}

/** Run an xgrammar call on ``spec``; its failure is an InvalidRequestError with xgrammar's reason. */
async function engineCall<T>(spec: GrammarSpec, call: () => Promise<T>): Promise<T> {
  listenToEngine();
  engineLine = "";
  try {
    return await call();
  } catch (err) {
    const what = spec.kind === "json_schema" ? "JSON schema" : spec.kind === "ebnf" ? "EBNF grammar" : "grammar";
    throw new InvalidRequestError(`invalid ${what}: ${engineMessage(engineLine || err)}`);
  }
}

/**
 * What xgrammar compiles for `spec`: a json_schema's EBNF (placeholders swapped), an ebnf spec's own text, a
 * structural tag's tight form (the twin of grammars.py's compiled_text).
 */
export async function compiledText(spec: GrammarSpec): Promise<string> {
  return engineCall(spec, () =>
    spec.kind === "json_schema"
      ? schemaEbnf(spec.source)
      : spec.kind === "ebnf"
        ? Promise.resolve(spec.source)
        : tightStructuralTag(spec.source),
  );
}

/**
 * xgrammar's grammar for ``spec``, printed, and the name of its root rule: what the `wasm` device
 * translates for llama.cpp (gbnf.ts). The same text and errors as GrammarCompiler.compile.
 */
export async function printGrammar(spec: GrammarSpec): Promise<{ text: string; root: string }> {
  const G = xgr().Grammar;
  const source = await compiledText(spec);
  const grammar = await engineCall(spec, () =>
    spec.kind === "structural_tag" ? G.fromStructuralTag(source) : G.fromEBNF(source),
  );
  try {
    const text = grammar.toString();
    // a structural tag's grammar prints its own root rule last
    const names = [...text.matchAll(/^([A-Za-z_][\w.-]*) ::=/gm)].map((m) => m[1]);
    return { text, root: spec.kind === "structural_tag" ? names[names.length - 1] : "root" };
  } finally {
    grammar.dispose();
  }
}

export interface TokenizerJson {
  model: { vocab: Record<string, number> };
  added_tokens?: { id: number; content: string }[];
}

/** The engine's grammar compiler, made on first use (a structured request, or a cut answer to close)
 * and shared with the webgpu device; and the tokenizer.json it reads, parsed once. */
export class LazyGrammars {
  private made: Promise<GrammarCompiler> | null = null;
  private parsed: TokenizerJson | null = null;
  /** The compiler once made (for stats). */
  ready: GrammarCompiler | null = null;

  constructor(
    private readonly tokenizerJson: ArrayBuffer,
    private readonly tokenPostproc: string,
    readonly vocabSize: number,
    readonly stopIds: number[],
  ) {}

  get tokenizer(): TokenizerJson {
    return (this.parsed ??= JSON.parse(new TextDecoder().decode(this.tokenizerJson)) as TokenizerJson);
  }

  compiler(): Promise<GrammarCompiler> {
    return (this.made ??= GrammarCompiler.create(this.tokenizer, this.tokenPostproc, this.vocabSize, this.stopIds).then(
      (g) => (this.ready = g),
    ));
  }
}

/** One per engine: the vocabulary for xgrammar and a cache of compiled grammars (and of refusals) by spec. */
export class GrammarCompiler {
  private readonly cache = new Map<string, XGrammar.CompiledGrammar>();
  /** schema_support.json's compile_limits. What may be compiled was decided with the spec (grammarSize); the
   * server's time limit is a safety net for its load, so here a slow compile is only logged. */
  limits = COMPILE_LIMITS;
  hits = 0;

  private constructor(
    private readonly compiler: XGrammar.GrammarCompiler,
    readonly vocabSize: number,
  ) {}

  static async create(
    tokenizer: TokenizerJson,
    tokenPostproc: string,
    vocabSize: number,
    stopIds: number[],
  ): Promise<GrammarCompiler> {
    listenToEngine();
    const vocab: string[] = new Array(vocabSize).fill("");
    for (const [token, id] of Object.entries(tokenizer.model.vocab)) vocab[id] = token;
    for (const t of tokenizer.added_tokens ?? []) vocab[t.id] = t.content;
    const type = tokenPostproc === "byte_level" ? "byte_level" : tokenPostproc === "byte_fallback" ? "byte_fallback" : "raw";
    const info = await xgr().TokenizerInfo.createTokenizerInfo(
      vocab,
      type,
      false,
      vocabSize,
      [...stopIds].sort((a, b) => a - b),
    );
    return new GrammarCompiler(await xgr().GrammarCompiler.createGrammarCompiler(info, false), vocabSize);
  }

  get entries(): number {
    return this.cache.size;
  }

  async compile(spec: GrammarSpec): Promise<XGrammar.CompiledGrammar> {
    const key = `${spec.kind}\u0000${spec.source}`;
    const hit = this.cache.get(key);
    if (hit) {
      this.hits++;
      return hit;
    }
    const compiled = await this.compileUncached(spec);
    this.cache.set(key, compiled); // a page's few grammars: kept (a matcher may still hold an old one)
    return compiled;
  }

  /** Compile without keeping the result: lantern serve's wasm engine keeps a bounded cache of its own. */
  async compileUncached(spec: GrammarSpec): Promise<XGrammar.CompiledGrammar> {
    const text = await compiledText(spec);
    const start = performance.now();
    const compiled = await engineCall(spec, () =>
      spec.kind === "structural_tag" ? this.compiler.compileStructuralTag(text) : this.compiler.compileGrammar(text),
    );
    const seconds = (performance.now() - start) / 1000;
    if (seconds > this.limits.seconds) console.warn(`lantern: compiling a grammar took ${seconds.toFixed(1)} s`);
    return compiled;
  }

  async matcher(compiled: XGrammar.CompiledGrammar): Promise<TokenMask> {
    return new TokenMask(await xgr().GrammarMatcher.createGrammarMatcher(compiled));
  }
}

/** The grammar state of one generation: which tokens may come next. */
export class TokenMask {
  constructor(readonly matcher: XGrammar.GrammarMatcher) {}

  /** A bitmask over the vocabulary (bit i of word i>>5 set: token i allowed). */
  allowed(): Promise<Int32Array> {
    return this.matcher.getNextTokenBitmask();
  }

  accept(token: number): void {
    if (!this.matcher.acceptToken(token)) throw new LanternError(`internal: the grammar rejected token ${token} it allowed`);
  }

  dispose(): void {
    this.matcher.dispose();
  }
}
