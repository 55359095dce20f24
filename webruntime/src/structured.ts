// Structured output and tool calls in the browser, with xgrammar (web-xgrammar, in wasm).
// The twin of the server's lantern/server/structured.py: the same grammar specs, the same schema
// checks (both read server/schema_support.json; esbuild inlines it as __SCHEMA_SUPPORT__), the
// same tool-call format, and xgrammar 0.1.27 on both sides, so one request is constrained alike.
//
// Tool calls, for a model whose chat template does not know tools, are written as
//   <tool_call>{"name": "<function>", "arguments": {...}}</tool_call>
// after the tools are listed in the system message (see toolSystemPrompt).
import "@mlc-ai/web-xgrammar";
import type * as XGrammar from "@mlc-ai/web-xgrammar";
import { InvalidRequestError, LanternError } from "./errors";
import { normalize } from "./normalize";
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
const KEYWORDS = new Set(SUPPORT.keywords);
const FORMATS = new Set(SUPPORT.formats);
const FORMAT_PATTERNS = SUPPORT.format_patterns;

// Like web-tokenizers, the package is a UMD script marked as an ES module: it installs globalThis.xgrammar.
const xgr = (): typeof XGrammar => (globalThis as unknown as { xgrammar: typeof XGrammar }).xgrammar;

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
 * bound the strings and arrays it leaves unbounded (see structured.py's check_schema). The schema is first
 * rewritten into Lantern's dialect (normalize.ts); what that ignored is appended to `warnings`.
 */
export function checkSchema(schema: unknown, where = "#", defaults: SchemaDefaults = {}, warnings?: string[]): Schema {
  const [normalized, notes] = normalize(schema, where);
  if (warnings) for (const n of notes) if (!warnings.includes(n)) warnings.push(n);
  return checkNormalized(normalized, where, defaults);
}

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

/** Refuse, by keyword, a schema no value satisfies (see structured.py's _check_contradictions). */
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

/** `schema` with a request's schema_defaults filled in (see structured.py's with_default_bounds). */
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

/** `schema` with its `own` keywords replaced by the placeholder `key` (see structured.py's _as_placeholder). */
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

/** A number or integer with bounds or multipleOf as a placeholder for numbers.ts (see structured.py's _exact_number). */
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
 * JSON as Python's json.dumps writes it by default (", " and ": ", keys in order), so a spec is the
 * server's. Key order is kept: xgrammar writes properties in the schema's order, as OpenAI does.
 */
function pyJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(pyJson).join(", ")}]`;
  if (isObject(v))
    return `{${Object.keys(v)
      .map((k) => `${JSON.stringify(k)}: ${pyJson(v[k])}`)
      .join(", ")}}`;
  return JSON.stringify(v);
}

/**
 * The size compile_limits bounds, read from a checked schema: the twin of structured.py's grammar_size (one per
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
  const source = pyJson(checked);
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

// ---- xgrammar -----------------------------------------------------------------------------------

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
 * for their exact rules. The twin of structured.py's schema_ebnf.
 */
export async function schemaEbnf(source: string): Promise<string> {
  const grammar = await xgr().Grammar.fromJSONSchema(source, false, -1, SEPARATORS, true);
  try {
    return withExactRules(grammar.toString());
  } finally {
    grammar.dispose();
  }
}

const RULES: Record<string, (key: string, name: string) => string[]> = {
  number: numbers.numberRules,
  integer: numbers.numberRules,
  string: strings.stringRules,
  unique: unique.uniqueRules,
};

/** xgrammar's printed grammar with every placeholder replaced by its exact rules (structured.py's with_exact_rules). */
export function withExactRules(ebnf: string): string {
  const names = new Map<string, [string, string]>();
  const swapped = ebnf.replace(PLACEHOLDER_IN_EBNF, (_, key: string, kind: string) => {
    const family = kind === "integer" ? "number" : kind;
    if (!names.has(key)) {
      const n = [...names.values()].filter(([, name]) => name.startsWith(`lantern_${family}_`)).length;
      names.set(key, [kind, `lantern_${family}_${n}`]);
    }
    return `${names.get(key)![1]}_0`;
  });
  if (!names.size) return ebnf;
  const rules = [...names].flatMap(([key, [kind, name]]) => RULES[kind](key, name));
  return `${swapped.replace(/\n+$/, "")}\n${rules.join("\n")}\n`;
}

/**
 * A structural tag with each `json_schema` content replaced by that schema's grammar in the layout
 * above. xgrammar's structural tags put free whitespace inside JSON, where a small model can loop
 * until max_tokens; response_format's JSON has none. The twin of structured.py's tight_structural_tag.
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
 * structural tag's tight form (the twin of structured.py's compiled_text).
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
  limits = SUPPORT.compile_limits;
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
    const text = await compiledText(spec);
    const start = performance.now();
    const compiled = await engineCall(spec, () =>
      spec.kind === "structural_tag" ? this.compiler.compileStructuralTag(text) : this.compiler.compileGrammar(text),
    );
    const seconds = (performance.now() - start) / 1000;
    if (seconds > this.limits.seconds) console.warn(`lantern: compiling a grammar took ${seconds.toFixed(1)} s`);
    this.cache.set(key, compiled); // a page's few grammars: kept (a matcher may still hold an old one)
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
