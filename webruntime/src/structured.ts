// Structured output and tool calls: a request's response_format or tools become one grammar spec for
// xgrammar. The only copy, for both runtimes: the browser bundles it, and `lantern serve` runs it in V8
// (schema-host.ts, bundled as dist/schema-host.js; lantern/server/schema_host.py). The schema checks read
// compiler/contracts/schema_support.json (esbuild inlines it as __SCHEMA_SUPPORT__); normalize.ts rewrites a schema
// into Lantern's dialect first, and numbers.ts, strings.ts and unique.ts write the exact rules that
// xgrammar's own leave loose. Compiling a spec against a vocabulary is grammars.ts's (the server's:
// grammars.py's), as each runtime has its own xgrammar build.
//
// Tool calls, for a model whose chat template does not know tools, are written as
//   <tool_call>{"name": "<function>", "arguments": {...}}</tool_call>
// after the tools are listed in the system message (see toolSystemPrompt).
import { InvalidRequestError } from "./errors";
import { normalize, pyJson } from "./normalize";
import * as numbers from "./numbers";
import * as strings from "./strings";
import * as unique from "./unique";
import type { ChatCompletionRequest, ChatMessage, Tool, ToolCall, ToolChoice } from "./protocol";

declare const __SCHEMA_SUPPORT__: {
  engine: string;
  keywords: string[];
  formats: string[];
  format_patterns: Record<string, string>;
  compile_limits: { size: number; seconds: number; cache_megabytes: number };
};
const SUPPORT = __SCHEMA_SUPPORT__;
/** What a grammar may cost: its size (checked with the spec), compile seconds, cache megabytes. */
export const COMPILE_LIMITS = SUPPORT.compile_limits;
const KEYWORDS = new Set(SUPPORT.keywords);
const FORMATS = new Set(SUPPORT.formats);
const FORMAT_PATTERNS = SUPPORT.format_patterns;

export const TOOL_OPEN = "<tool_call>";
export const TOOL_CLOSE = "</tool_call>";

// ---- schemas ----------------------------------------------------------------------------------

type Schema = boolean | Record<string, unknown>;
const SCHEMA_MAPS = ["properties", "patternProperties", "$defs", "definitions"];
const SCHEMA_LISTS = ["anyOf", "oneOf", "allOf", "prefixItems"];
const SCHEMA_ONE = ["items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems", "propertyNames"];
const BOUNDS = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];
const NUMERIC = [...BOUNDS, "multipleOf"];
const LENGTHS = ["minLength", "maxLength"];
// A placeholder as xgrammar prints it inside a rule: the JSON string literal, quotes escaped.
const PLACEHOLDER_IN_EBNF = /"\\"(lantern:([a-z]+)(?::[-0-9a-z=.]+)*)\\""/g;
const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/** Bounds for a schema's unbounded strings and arrays: a request's schema_defaults (0: none). */
export interface SchemaDefaults {
  maxLength?: number;
  maxItems?: number;
}

/**
 * A copy of `schema` that xgrammar enforces exactly, or InvalidRequestError naming the keyword; `defaults`
 * bound the strings and arrays it leaves unbounded (withDefaultBounds). The schema is first
 * rewritten into Lantern's dialect (normalize.ts); what that ignored is appended to `warnings`.
 */
export function checkSchema(schema: unknown, where = "#", defaults: SchemaDefaults = {}, warnings?: string[]): Schema {
  const [normalized, notes] = normalize(schema, where);
  if (warnings) for (const n of notes) if (!warnings.includes(n)) warnings.push(n);
  return checkNormalized(normalized, where, defaults);
}

/**
 * checkSchema on a normalized schema. xgrammar ignores keywords it does not know, and its numeric ranges and some
 * formats are inexact, so: keywords and formats outside schema_support.json are refused; formats in
 * `format_patterns` become exact patterns; a number or integer with bounds or multipleOf, a string with a pattern
 * or lengths, and an array with uniqueItems become placeholders that numbers.ts, strings.ts and unique.ts swap
 * for exact rules once xgrammar has written the rest of the grammar (withExactRules).
 */
function checkNormalized(schema: unknown, where: string, defaults: SchemaDefaults): Schema {
  if (typeof schema === "boolean") return schema;
  if (!isObject(schema)) throw new InvalidRequestError(`schema at ${where} must be an object or a boolean`);
  for (const key of Object.keys(schema)) {
    if (!KEYWORDS.has(key)) {
      throw new InvalidRequestError(
        `schema keyword '${key}' at ${where} is not supported by the grammar engine ` +
          `(${SUPPORT.engine}); remove it or use a supported keyword`,
      );
    }
  }
  let out: Record<string, unknown> = { ...schema };
  const fmt = schema.format;
  if (typeof fmt === "string" && Object.hasOwn(FORMAT_PATTERNS, fmt)) {
    if ("pattern" in schema)
      throw new InvalidRequestError(`schema keyword 'pattern' at ${where}: cannot be combined with format '${fmt}'`);
    delete out.format;
    out.pattern = FORMAT_PATTERNS[fmt];
  } else if (fmt !== undefined && !FORMATS.has(fmt as string)) {
    throw new InvalidRequestError(
      `schema keyword 'format' at ${where}: format '${fmt}' is not supported ` +
        `(supported: ${[...FORMATS, ...Object.keys(FORMAT_PATTERNS)].sort().join(", ")})`,
    );
  }
  const ref = schema.$ref;
  if (ref !== undefined && !(typeof ref === "string" && ref.startsWith("#/"))) {
    throw new InvalidRequestError(`schema keyword '$ref' at ${where}: only local references (#/...) are supported`);
  }
  if (Array.isArray(schema.allOf) && schema.allOf.length > 1) {
    throw new InvalidRequestError(`schema keyword 'allOf' at ${where}: only one subschema is supported`);
  }
  checkContradictions(schema, where);
  for (const key of Object.keys(isObject(schema.patternProperties) ? schema.patternProperties : {})) {
    try {
      strings.checkPlainPattern(key);
    } catch (err) {
      if (!(err instanceof strings.PatternError)) throw err;
      throw new InvalidRequestError(`schema keyword 'patternProperties' at ${where}: pattern '${key}': ${err.message}`);
    }
  }
  for (const key of SCHEMA_MAPS) {
    const v = schema[key];
    if (isObject(v))
      out[key] = Object.fromEntries(Object.entries(v).map(([k, s]) => [k, checkNormalized(s, `${where}/${key}/${k}`, defaults)]));
  }
  for (const key of SCHEMA_LISTS) {
    const v = schema[key];
    if (Array.isArray(v)) out[key] = v.map((s, i) => checkNormalized(s, `${where}/${key}/${i}`, defaults));
  }
  for (const key of SCHEMA_ONE) if (key in schema) out[key] = checkNormalized(schema[key], `${where}/${key}`, defaults);
  out = withDefaultBounds(out, defaults);
  if (NUMERIC.some((k) => k in schema)) out = exactNumber(out, where);
  if ("pattern" in schema || LENGTHS.some((k) => k in out)) {
    // a format's own pattern alone: xgrammar's is exact
    out = exactString(out, where, typeof fmt === "string" && Object.hasOwn(FORMAT_PATTERNS, fmt) ? fmt : null);
  }
  if ("uniqueItems" in schema) out = uniqueItems(out, where);
  return out;
}

function checkWholeNumbers(schema: Record<string, unknown>, keys: string[], where: string): void {
  for (const key of keys) {
    const v = schema[key] ?? 0;
    if (!(typeof v === "number" && Number.isInteger(v) && v >= 0)) {
      throw new InvalidRequestError(`schema keyword '${key}' at ${where} must be a whole number of at least 0`);
    }
  }
}
const quoted = (keys: string[]): string => keys.map((k) => `'${k}'`).join(", ");

/** Refuse, by keyword, a schema no value satisfies: an empty enum, a minimum count above its maximum, or a
 * required property that additionalProperties: false forbids. */
function checkContradictions(schema: Record<string, unknown>, where: string): void {
  if ("enum" in schema && !(Array.isArray(schema.enum) && schema.enum.length)) {
    throw new InvalidRequestError(`schema keyword 'enum' at ${where} must list at least one value`);
  }
  for (const [low, high] of [
    ["minItems", "maxItems"],
    ["minProperties", "maxProperties"],
  ]) {
    checkWholeNumbers(schema, [low, high], where);
    if (high in schema && ((schema[low] ?? 0) as number) > (schema[high] as number)) {
      throw new InvalidRequestError(
        `schema keywords '${low}', '${high}' at ${where}: ${low} ${schema[low]} is above ${high} ${schema[high]}`,
      );
    }
  }
  if (schema.additionalProperties === false && !("patternProperties" in schema)) {
    const props = isObject(schema.properties) ? schema.properties : {};
    const missing = (Array.isArray(schema.required) ? schema.required : []).filter((n) => !Object.hasOwn(props, n as string));
    if (missing.length) {
      throw new InvalidRequestError(
        `schema keyword 'required' at ${where}: '${missing[0]}' is required but not in properties, ` +
          "and additionalProperties is false",
      );
    }
  }
}

/**
 * `schema` with a request's schema_defaults filled in: maxLength on a string with no maxLength, pattern, format
 * or listed values; maxItems on an array with no maxItems or prefixItems. Counted above the schema's own minimum
 * (a minimum of the wrong type is refused later by name).
 */
export function withDefaultBounds(schema: Record<string, unknown>, defaults: SchemaDefaults): Record<string, unknown> {
  const types = typesOf(schema);
  const aboveMinimum = (key: string, bound: number): number => {
    const low = schema[key] ?? 0;
    return typeof low === "number" && Number.isInteger(low) && low > 0 ? low + bound : bound;
  };
  if (
    defaults.maxLength &&
    types.includes("string") &&
    !["maxLength", "pattern", "format", "enum", "const"].some((k) => k in schema)
  ) {
    schema = { ...schema, maxLength: aboveMinimum("minLength", defaults.maxLength) };
  }
  if (defaults.maxItems && types.includes("array") && !["maxItems", "prefixItems"].some((k) => k in schema)) {
    schema = { ...schema, maxItems: aboveMinimum("minItems", defaults.maxItems) };
  }
  return schema;
}

const typesOf = (schema: Record<string, unknown>): unknown[] =>
  typeof schema.type === "string" ? [schema.type] : Array.isArray(schema.type) ? (schema.type as unknown[]) : [];

/** `schema` with its `own` keywords replaced by the placeholder `key` (a const), as anyOf the placeholder and its
 * other types when it has types not in `kinds`. */
function asPlaceholder(schema: Record<string, unknown>, key: string, own: string[], kinds: string[]): Record<string, unknown> {
  const rest = Object.fromEntries(Object.entries(schema).filter(([k]) => !own.includes(k) && k !== "type"));
  const others = typesOf(schema).filter((t) => !kinds.includes(t as string));
  if (!others.length) return { ...rest, const: key };
  // the other types' keywords go in their branch: xgrammar ignores keywords beside anyOf
  const top = Object.fromEntries(Object.entries(rest).filter(([k]) => k === "$defs" || k === "definitions"));
  const other = Object.fromEntries(Object.entries(rest).filter(([k]) => !(k in top)));
  return { ...top, anyOf: [{ const: key }, { ...other, type: others.length > 1 ? others : others[0] }] };
}

function noValuesList(schema: Record<string, unknown>, keyword: string, where: string): void {
  for (const key of ["enum", "const"]) {
    if (key in schema) {
      throw new InvalidRequestError(
        `schema keyword '${keyword}' at ${where} cannot be combined with '${key}': list only the allowed values`,
      );
    }
  }
}

/** `err` as an InvalidRequestError naming `keys` at `where`, if it is one of `kind`; else rethrown. */
function asRequestError(err: unknown, kind: new (...a: never[]) => Error, keys: string[], where: string): never {
  if (!(err instanceof kind)) throw err;
  throw new InvalidRequestError(`schema keyword${keys.length > 1 ? "s" : ""} ${quoted(keys)} at ${where}: ${err.message}`);
}

/** A number or integer with bounds or multipleOf as a placeholder for numbers.ts (a nullable one, or one of
 * several types, as anyOf the placeholder and the other types). */
function exactNumber(schema: Record<string, unknown>, where: string): Record<string, unknown> {
  const present = NUMERIC.filter((k) => k in schema);
  for (const key of present) {
    const value = schema[key];
    if (typeof value !== "number" || !Number.isFinite(value)) {
      throw new InvalidRequestError(`schema keyword '${key}' at ${where} must be a finite number`);
    }
  }
  const numeric = typesOf(schema).filter((t) => t === "number" || t === "integer");
  if (!numeric.length)
    throw new InvalidRequestError(`schema keyword '${present[0]}' at ${where} needs "type": "number" or "integer"`);
  noValuesList(schema, present[0], where);
  const key = numbers.placeholder(numeric.includes("number") ? "number" : "integer", schema);
  try {
    if ("multipleOf" in schema) numbers.multipleOf(numbers.decimalText(schema.multipleOf as number));
  } catch (err) {
    asRequestError(err, numbers.NumberRangeError, ["multipleOf"], where);
  }
  try {
    numbers.numberRules(key, "n");
  } catch (err) {
    if (!(err instanceof numbers.NumberRangeError)) throw err;
    throw new InvalidRequestError(`schema keywords ${quoted(present)} at ${where}: ${err.message}`);
  }
  return asPlaceholder(schema, key, NUMERIC, ["number", "integer"]);
}

/** A string with a pattern (its own, or its format's) or lengths as a placeholder for strings.ts. */
function exactString(schema: Record<string, unknown>, where: string, fmt: string | null): Record<string, unknown> {
  checkWholeNumbers(schema, LENGTHS, where);
  const types = typesOf(schema);
  if (types.length && !types.includes("string")) return schema; // pattern and lengths apply to strings only
  let named = ["pattern", ...LENGTHS].filter((k) => k in schema);
  if (fmt) named = ["format", ...named.filter((k) => k !== "pattern")];
  if ("format" in schema) {
    throw new InvalidRequestError(
      `schema keyword '${named[named.length - 1]}' at ${where} cannot be combined with format '${schema.format}'`,
    );
  }
  noValuesList(schema, named[0], where);
  const lo = (schema.minLength ?? 0) as number;
  const hi = (schema.maxLength ?? null) as number | null;
  if (hi !== null && lo > hi) {
    throw new InvalidRequestError(
      `schema keywords 'minLength', 'maxLength' at ${where}: minLength ${lo} is above maxLength ${hi}`,
    );
  }
  const pattern = schema.pattern ?? null;
  if (pattern !== null && typeof pattern !== "string")
    throw new InvalidRequestError(`schema keyword 'pattern' at ${where} must be a string`);
  let key = "";
  try {
    key = strings.placeholder(pattern, lo, hi);
    strings.stringRules(key, "s");
  } catch (err) {
    asRequestError(err, strings.PatternError, named, where);
  }
  return asPlaceholder(schema, key, ["pattern", ...LENGTHS], ["string"]);
}

/** An array with uniqueItems as a placeholder for unique.ts (uniqueItems false: dropped). */
function uniqueItems(schema: Record<string, unknown>, where: string): Record<string, unknown> {
  if (typeof schema.uniqueItems !== "boolean")
    throw new InvalidRequestError(`schema keyword 'uniqueItems' at ${where} must be true or false`);
  if (!schema.uniqueItems) return Object.fromEntries(Object.entries(schema).filter(([k]) => k !== "uniqueItems"));
  const types = typesOf(schema);
  if (types.length && !types.includes("array")) return schema;
  noValuesList(schema, "uniqueItems", where);
  let key = "";
  try {
    if ("prefixItems" in schema) throw new unique.UniqueItemsError("uniqueItems cannot be combined with prefixItems");
    key = unique.placeholder(
      unique.itemValues(schema.items),
      (schema.minItems ?? 0) as number,
      (schema.maxItems ?? null) as number | null,
    );
    unique.uniqueRules(key, "u");
  } catch (err) {
    asRequestError(err, unique.UniqueItemsError, ["uniqueItems"], where);
  }
  return asPlaceholder(schema, key, ["items", "uniqueItems", "minItems", "maxItems"], ["array"]);
}

// ---- requests -> grammar specs ------------------------------------------------------------------

/** What xgrammar compiles; `source` is a JSON schema text, an EBNF grammar or a structural tag (JSON). */
/** `warnings`: what the rewrite of its schemas ignored (not part of the grammar: a cache ignores them). */
export interface GrammarSpec {
  kind: "json_schema" | "ebnf" | "structural_tag";
  source: string;
  warnings?: string[];
}

/**
 * The size compile_limits bounds, read from a checked schema, the same in both runtimes (one per
 * JSON object in it, and n(n+1)/2 more for an object of n properties with minProperties or maxProperties).
 */
export function grammarSize(schema: unknown): number {
  if (Array.isArray(schema)) return schema.reduce((n: number, v) => n + grammarSize(v), 0);
  if (!isObject(schema)) return 0;
  const n = isObject(schema.properties) ? Object.keys(schema.properties).length : 0;
  const counted = "minProperties" in schema || "maxProperties" in schema ? (n * (n + 1)) / 2 : 0;
  return 1 + counted + Object.values(schema).reduce((m: number, v) => m + grammarSize(v), 0);
}

function checkSize(size: number): void {
  const limit = SUPPORT.compile_limits.size;
  if (size > limit) {
    throw new InvalidRequestError(
      `the schema's grammar has size ${size}, over the limit of ${limit}: bound or simplify it ` +
        "(fewer subschemas or alternatives, no minProperties or maxProperties over many properties)",
    );
  }
}

function schemaSpec(schema: unknown, where: string, defaults: SchemaDefaults): GrammarSpec {
  if (typeof schema === "string") {
    try {
      schema = JSON.parse(schema);
    } catch (err) {
      throw new InvalidRequestError(`${where} is not valid JSON: ${(err as Error).message}`);
    }
  }
  const warnings: string[] = [];
  const checked = checkSchema(schema, "#", defaults, warnings);
  checkSize(grammarSize(checked));
  const source = pyJson(checked); // keys in the schema's order: xgrammar writes properties so, as OpenAI does
  return warnings.length ? { kind: "json_schema", source, warnings } : { kind: "json_schema", source };
}

export function responseFormatSpec(
  fmt: ChatCompletionRequest["response_format"],
  defaults: SchemaDefaults = {},
): GrammarSpec | null {
  if (!fmt || (fmt.type ?? "text") === "text") return null;
  switch (fmt.type) {
    case "json_object": // WebLLM passes a schema as a JSON string here
      return schemaSpec(fmt.schema ?? { type: "object" }, "response_format.schema", defaults);
    case "json_schema":
      if (!isObject(fmt.json_schema) || !("schema" in fmt.json_schema)) {
        throw new InvalidRequestError("response_format.json_schema must be {name, schema, strict}");
      }
      return schemaSpec(fmt.json_schema.schema, "response_format.json_schema.schema", defaults);
    case "grammar":
      if (typeof fmt.grammar !== "string" || !fmt.grammar.trim()) {
        throw new InvalidRequestError("response_format.grammar must be an EBNF string with a `root` rule");
      }
      checkSize(fmt.grammar.split("::=").length - 1); // a grammar's own rules
      return { kind: "ebnf", source: fmt.grammar };
    case "regex":
      if (typeof fmt.pattern !== "string" || !fmt.pattern) {
        throw new InvalidRequestError("response_format.pattern must be a regular expression string");
      }
      return {
        kind: "structural_tag",
        source: pyJson({ type: "structural_tag", format: { type: "regex", pattern: fmt.pattern } }),
      };
    default:
      throw new InvalidRequestError(
        `response_format.type '${(fmt as { type: unknown }).type}' is not one of text, ` +
          "json_object, json_schema, grammar, regex",
      );
  }
}

function toolTag(fn: Tool["function"], defaults: SchemaDefaults, warnings: string[]): Record<string, unknown> {
  const params = fn.parameters ?? { type: "object", properties: {} };
  return {
    type: "tag",
    begin: `${TOOL_OPEN}{"name": ${JSON.stringify(fn.name)}, "arguments": `,
    content: { type: "json_schema", json_schema: checkSchema(params, `#/tools/${fn.name}/parameters`, defaults, warnings) },
    end: `}${TOOL_CLOSE}`,
  };
}

export function toolSpec(
  tools: Tool[],
  choice: ToolChoice | undefined,
  parallel: boolean,
  defaults: SchemaDefaults = {},
): GrammarSpec | null {
  if (!tools.length || choice === "none") return null;
  const byName = new Map(tools.map((t) => [t.function.name, t.function]));
  const warnings: string[] = [];
  let fmt: Record<string, unknown>;
  if (typeof choice === "object" && choice !== null) {
    const name = choice.function?.name;
    const fn = byName.get(name);
    if (!fn) {
      throw new InvalidRequestError(
        `tool_choice names the function '${name}', which is not in tools (${[...byName.keys()].join(", ")})`,
      );
    }
    fmt = toolTag(fn, defaults, warnings);
  } else {
    const tags = [...byName.values()].map((fn) => toolTag(fn, defaults, warnings));
    fmt =
      choice === "required"
        ? { type: "tags_with_separator", tags, separator: "\n", at_least_one: true, stop_after_first: !parallel }
        : { type: "triggered_tags", triggers: [TOOL_OPEN], tags, at_least_one: false, stop_after_first: !parallel };
  }
  checkSize(grammarSize(fmt));
  const source = pyJson({ type: "structural_tag", format: fmt });
  return warnings.length ? { kind: "structural_tag", source, warnings } : { kind: "structural_tag", source };
}

/**
 * The one grammar a chat request asks for: from its tools, or from its response_format, its schemas
 * bounded by the request's schema_defaults (as checkRequest fills them in; absent: no bounds).
 */
export function requestSpec(req: ChatCompletionRequest): GrammarSpec | null {
  const tools = req.tools ?? [];
  for (const [i, t] of tools.entries()) {
    if (t?.type !== "function" || typeof t.function?.name !== "string" || !/^[A-Za-z0-9_-]{1,64}$/.test(t.function.name)) {
      throw new InvalidRequestError(
        `tools[${i}] must be {type: "function", function: {name, description, parameters}} ` +
          "with a name of letters, digits, _ and - (at most 64)",
      );
    }
  }
  const choice = req.tool_choice;
  if (
    choice !== undefined &&
    choice !== null &&
    !["none", "auto", "required"].includes(choice as string) &&
    typeof choice !== "object"
  ) {
    throw new InvalidRequestError('tool_choice must be none, auto, required or {type: "function", function: {name}}');
  }
  if (choice !== undefined && choice !== null && choice !== "none" && choice !== "auto" && !tools.length) {
    throw new InvalidRequestError("tool_choice needs tools");
  }
  const defaults = req.schema_defaults ?? {};
  const calls = toolSpec(tools, choice ?? undefined, req.parallel_tool_calls ?? true, defaults);
  const fmt = responseFormatSpec(req.response_format, defaults);
  if (calls && fmt) {
    throw new InvalidRequestError(
      "response_format cannot be combined with tools in one request; " + 'use tool_choice: "none" or drop response_format',
    );
  }
  return calls ?? fmt;
}

/** Whether a request may produce tool calls. */
export function callsTools(req: ChatCompletionRequest): boolean {
  return !!req.tools?.length && req.tool_choice !== "none";
}

export function toolSystemPrompt(tools: Tool[]): string {
  const lines = tools.map((t) =>
    JSON.stringify({
      name: t.function.name,
      description: t.function.description ?? "",
      parameters: t.function.parameters ?? { type: "object", properties: {} },
    }),
  );
  return (
    `You can call these tools:\n${lines.join("\n")}\nTo call a tool, reply with ` +
    `${TOOL_OPEN}{"name": <tool name>, "arguments": <JSON arguments>}${TOOL_CLOSE}`
  );
}

/** Messages in Lantern's default tool format, for a chat template that does not know tools. */
export function toolMessages(messages: ChatMessage[], tools: Tool[] | null): ChatMessage[] {
  const out = messages.map((m): ChatMessage => {
    if (m.role === "assistant" && m.tool_calls?.length) {
      const calls = m.tool_calls
        .map(
          (c) =>
            `${TOOL_OPEN}{"name": ${JSON.stringify(c.function.name)}, ` + `"arguments": ${c.function.arguments}}${TOOL_CLOSE}`,
        )
        .join("");
      return { role: "assistant", content: (m.content ?? "") + calls };
    }
    if (m.role === "tool") return { role: "user", content: `<tool_response>\n${m.content ?? ""}\n</tool_response>` };
    const { tool_calls: _, ...rest } = m;
    return { ...rest, content: m.content ?? "" };
  });
  if (tools?.length) {
    const extra = toolSystemPrompt(tools);
    if (out[0]?.role === "system") out[0] = { ...out[0], content: `${out[0].content}\n\n${extra}` };
    else out.unshift({ role: "system", content: extra });
  }
  return out;
}

const CALL = new RegExp(`${TOOL_OPEN}([\\s\\S]*?)${TOOL_CLOSE.replace("/", "\\/")}`, "g");

/** Split generated text into content and OpenAI tool_calls (arguments as JSON text). */
export function parseToolCalls(text: string): { content: string | null; calls: ToolCall[] } {
  const calls: ToolCall[] = [];
  for (const [, body] of text.matchAll(CALL)) {
    // The grammar wrote `{"name": <string>, "arguments": <JSON>}`; the arguments are kept as written.
    const m = /^\{"name": ("(?:[^"\\]|\\.)*"), "arguments": ([\s\S]*)\}$/.exec(body);
    try {
      if (!m) continue;
      JSON.parse(m[2]);
      calls.push({
        id: `call_${crypto.randomUUID().replace(/-/g, "").slice(0, 24)}`,
        type: "function",
        function: { name: JSON.parse(m[1]), arguments: m[2] },
      });
    } catch {
      // only reachable when max_tokens cut a call short; the text stays content
    }
  }
  if (!calls.length) return { content: text, calls };
  const content = cutOpenCall(text.replace(CALL, "")).trim();
  return { content: content || null, calls };
}

/** Drop a tool call that max_tokens cut off before its closing tag. */
export function cutOpenCall(text: string): string {
  const open = text.lastIndexOf(TOOL_OPEN);
  if (open >= 0) return text.slice(0, open);
  for (let k = TOOL_OPEN.length - 1; k > 0; k--) if (text.endsWith(TOOL_OPEN.slice(0, k))) return text.slice(0, -k);
  return text;
}

// ---- exact rules ----------------------------------------------------------------------------------

const RULES: Record<string, (key: string, name: string) => string[]> = {
  number: numbers.numberRules,
  integer: numbers.numberRules,
  string: strings.stringRules,
  unique: unique.uniqueRules,
};

/**
 * The exact rules for the placeholders `keys` (as a grammar holds them, in order; repeats allowed): the rule that
 * replaces each placeholder, by key, and every rule to append. The server sends only the keys, not its grammar
 * (a large schema's grammar is megabytes), and swaps them itself with `placeholderPattern`.
 */
export function exactRuleSet(keys: string[]): { names: Record<string, string>; rules: string[] } {
  const names = new Map<string, [string, string]>();
  for (const key of keys) {
    if (names.has(key)) continue;
    const kind = key.split(":")[1];
    const family = kind === "integer" ? "number" : kind;
    const n = [...names.values()].filter(([, name]) => name.startsWith(`lantern_${family}_`)).length;
    names.set(key, [kind, `lantern_${family}_${n}`]);
  }
  return {
    names: Object.fromEntries([...names].map(([key, [, name]]) => [key, `${name}_0`])),
    rules: [...names].flatMap(([key, [kind, name]]) => RULES[kind](key, name)),
  };
}

/** The pattern of a placeholder in xgrammar's printed grammar (group 1: its key), for the server's swap. */
export const placeholderPattern = PLACEHOLDER_IN_EBNF.source;

/** xgrammar's printed grammar with every placeholder replaced by its exact rules. */
export function withExactRules(ebnf: string): string {
  const keys = Array.from(ebnf.matchAll(PLACEHOLDER_IN_EBNF), (m) => m[1]);
  if (!keys.length) return ebnf;
  const { names, rules } = exactRuleSet(keys);
  const swapped = ebnf.replace(PLACEHOLDER_IN_EBNF, (_, key: string) => names[key]);
  return `${swapped.replace(/\n+$/, "")}\n${rules.join("\n")}\n`;
}
