// The structured-output compiler as `lantern serve` runs it: structured.ts and what it imports, bundled
// by build.mjs into dist/schema-host.js as a plain script for V8 (lantern/server/schema_host.py runs it
// with mini-racer), so the server and the browser read one copy of the schema rules and grammar writers.
//
// The script defines one global function, lanternSchemaHost(name, argsJson): it calls CALLS[name] with
// the JSON array of arguments and returns JSON, {"value": ...} or {"error": message, "name": its class}.
// An InvalidRequestError (a schema or request Lantern refuses) and the grammar writers' own errors come
// back as values; anything else is a bug and throws, with its stack.
import { InvalidRequestError } from "./errors";
import type * as XGrammar from "@mlc-ai/web-xgrammar";
import { GrammarCompiler, type TokenizerJson } from "./grammars";
import * as numbers from "./numbers";
import * as strings from "./strings";
import {
  type GrammarSpec,
  checkSchema,
  exactRuleSet,
  grammarSize,
  placeholderPattern,
  requestSpec,
  responseFormatSpec,
  type SchemaDefaults,
} from "./structured";
import type { ChatCompletionRequest } from "./protocol";
import * as unique from "./unique";

/** One grammar writer's rules for a case, as tests/test_structured_exact.py reads them. */
function exactRules(kind: string, ...args: unknown[]): { placeholder: string; rules: string[] } {
  if (kind === "string") {
    const [pattern, min, max] = args as [string | null, number, number | null];
    const key = strings.placeholder(pattern, min, max);
    return { placeholder: key, rules: strings.stringRules(key, "s") };
  }
  if (kind === "unique") {
    const [items, min, max] = args as [unknown, number, number | null];
    const key = unique.placeholder(unique.itemValues(items), min, max);
    return { placeholder: key, rules: unique.uniqueRules(key, "u") };
  }
  const key = numbers.placeholder(kind, args[0] as Record<string, unknown>);
  return { placeholder: key, rules: numbers.numberRules(key, "n") };
}

const CALLS: Record<string, (...args: never[]) => unknown> = {
  // what the server asks for
  checkSchema: (schema: unknown, where: string, defaults: SchemaDefaults) => {
    const warnings: string[] = [];
    return { schema: checkSchema(schema, where, defaults, warnings), warnings };
  },
  responseFormatSpec: (fmt: ChatCompletionRequest["response_format"], defaults: SchemaDefaults) =>
    responseFormatSpec(fmt, defaults),
  requestSpec: (req: ChatCompletionRequest) => requestSpec(req),
  grammarSize: (schema: unknown) => grammarSize(schema),
  exactRuleSet: (keys: string[]) => exactRuleSet(keys),
  // what the tests read of the grammar writers
  exactRules,
  withClasses: (pattern: string) => strings.withClasses(pattern),
  parsePattern: (pattern: string) => strings.parsePattern(pattern),
  valueTexts: (values: unknown[]) => values.map(unique.valueText),
  constants: () => ({ maxDigits: numbers.MAX_DIGITS, placeholderPattern }),
};

const ERRORS = [InvalidRequestError, strings.PatternError, numbers.NumberRangeError, unique.UniqueItemsError];

/** A refusal's JSON; anything not in ERRORS is a bug and throws on. */
function refusal(err: unknown): string {
  if (!ERRORS.some((kind) => err instanceof kind)) throw err;
  return JSON.stringify({ error: (err as Error).message, name: (err as Error).name });
}

(globalThis as unknown as { lanternSchemaHost: (name: string, argsJson: string) => string }).lanternSchemaHost = (
  name,
  argsJson,
) => {
  const call = CALLS[name];
  if (!call) throw new Error(`schema host: no call named ${name}`);
  try {
    return JSON.stringify({ value: call(...(JSON.parse(argsJson) as never[])) ?? null });
  } catch (err) {
    return refusal(err);
  }
};

// xgrammar's wasm build (web-xgrammar, as the browser runs it) for a lantern serve without the native
// xgrammar package (lantern/server/xgrammar_wasm.py): grammars.ts's compiler and matchers behind numbered
// handles. Python keeps the cache and releases what it drops. Structured arguments come as JSON text;
// the mask is returned as an ArrayBuffer (bit i of word i>>5: token i allowed).
let compiler: GrammarCompiler | null = null;
const grammars = new Map<number, XGrammar.CompiledGrammar>();
const matchers = new Map<number, XGrammar.GrammarMatcher>();
let nextHandle = 1;

function matcherOf(handle: number): XGrammar.GrammarMatcher {
  const m = matchers.get(handle);
  if (!m) throw new Error(`schema host: no matcher ${handle}`);
  return m;
}

const XGRAMMAR = {
  async init(tokenizerJson: string, tokenPostproc: string, vocabSize: number, stopIdsJson: string): Promise<void> {
    const tokenizer = JSON.parse(tokenizerJson) as TokenizerJson;
    compiler = await GrammarCompiler.create(tokenizer, tokenPostproc, vocabSize, JSON.parse(stopIdsJson) as number[]);
  },
  /** JSON: {"value": handle} or a refusal (InvalidRequestError with xgrammar's reason, as in the browser). */
  async compile(specJson: string): Promise<string> {
    if (!compiler) throw new Error("schema host: xgrammar.init first");
    try {
      const handle = nextHandle++;
      grammars.set(handle, await compiler.compileUncached(JSON.parse(specJson) as GrammarSpec));
      return JSON.stringify({ value: handle });
    } catch (err) {
      return refusal(err);
    }
  },
  async matcher(grammar: number): Promise<number> {
    const compiled = grammars.get(grammar);
    if (!compiled) throw new Error(`schema host: no grammar ${grammar}`);
    const handle = nextHandle++;
    matchers.set(handle, (await compiler!.matcher(compiled)).matcher);
    return handle;
  },
  async mask(handle: number): Promise<ArrayBuffer> {
    return (await matcherOf(handle).getNextTokenBitmask()).buffer as ArrayBuffer;
  },
  accept: (handle: number, token: number): boolean => matcherOf(handle).acceptToken(token),
  rollback: (handle: number, tokens: number): void => matcherOf(handle).rollBack(tokens),
  forced: (handle: number): string => matcherOf(handle).findJumpForwardString(),
  /** Dispose of grammars and matchers by handle (a matcher keeps its own grammar alive). */
  release(handlesJson: string): void {
    for (const h of JSON.parse(handlesJson) as number[]) {
      grammars.get(h)?.dispose();
      matchers.get(h)?.dispose();
      grammars.delete(h);
      matchers.delete(h);
    }
  },
};

(globalThis as unknown as { lanternXgrammar: typeof XGRAMMAR }).lanternXgrammar = XGRAMMAR;
