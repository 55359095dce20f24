// The OpenAI request rules of compiler/contracts/request_rules.json (esbuild inlines it as __REQUEST_RULES__),
// applied to a request as the caller gave it. The twin of lantern/request_rules.py (compiler/), line for
// line: the server reads the same file, so one request is accepted or refused alike on both runtimes,
// with the same message (tests/test_request_rules.py).
import { InvalidRequestError } from "./errors";
import type { ChatCompletionRequest, ChatMessage } from "./protocol";

interface Rule {
  type: "string" | "boolean" | "number" | "integer" | "enum" | "object" | "array" | "strings" | "token_map" | "embedding_input";
  required?: boolean;
  optional_for_roles?: string[];
  default?: unknown;
  fallback?: number;
  min?: number;
  max?: number;
  values?: string[];
  fields?: Record<string, Rule>;
  items?: Rule;
  min_items?: number;
  max_items?: number;
  value?: Rule;
  requires?: { field: string; value: unknown };
  message?: string;
}

declare const __REQUEST_RULES__: {
  messages: Record<string, string>;
  got_max_chars: number;
  endpoints: Record<"chat" | "completions" | "embeddings", Record<string, Rule>>;
  standalone_endpoints: string[];
  shared: Record<string, Rule>;
  template_roles: Record<string, string>;
  artifact: { stop_token_ids: string[]; tools_in_template: string };
};
export const RULES = __REQUEST_RULES__;
const TOKEN_ID = /^[0-9]+$/;

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

/** A request as checkRequest returns it: nulls dropped, the table's defaults filled in. */
export type CheckedRequest = ChatCompletionRequest & { stream_options: { include_usage: boolean } };

/** The template ``name`` with its {placeholders} filled. */
export function message(name: string, params: Record<string, unknown>): string {
  return fill(RULES.messages[name], params);
}

/** Each {name} replaced by its parameter: a string as it is, anything else as show() writes it. */
function fill(template: string, params: Record<string, unknown>): string {
  return template.replace(/\{(\w+)\}/g, (_, name: string) => {
    const value = params[name];
    return typeof value === "string" ? value : show(value);
  });
}

/** ``value`` as JSON.stringify writes it (the server's show() writes the same). */
export function show(value: unknown): string {
  return JSON.stringify(value) ?? "null";
}

/** What a message says was sent: the value's JSON, or its kind when that is long. */
function got(value: unknown): string {
  const text = show(value);
  if (text.length <= RULES.got_max_chars) return text;
  return typeof value === "string" ? "a string" : isObject(value) ? "an object" : "an array";
}

const isNumber = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v);

function fail(
  rule: Rule,
  kind: string,
  field: string,
  value: unknown,
  params: Record<string, unknown> = {},
): InvalidRequestError {
  return new InvalidRequestError(fill(rule.message ?? RULES.messages[kind], { field, got: got(value), ...params }));
}

/** ``value`` (present, not null) checked against ``rule``; returns it with nested defaults filled. */
function check(rule: Rule, value: unknown, field: string): unknown {
  const kind = rule.type;
  if (kind === "string" && typeof value !== "string") throw fail(rule, "string", field, value);
  if (kind === "boolean" && typeof value !== "boolean") throw fail(rule, "boolean", field, value);
  if (kind === "enum" && !(typeof value === "string" && rule.values!.includes(value))) {
    throw fail(rule, "enum", field, value, { values: rule.values!.join(", ") });
  }
  if (kind === "number") {
    if (!(isNumber(value) && rule.min! <= value && value <= rule.max!))
      throw fail(rule, "number", field, value, { min: rule.min, max: rule.max });
  }
  if (kind === "integer") {
    const lo = rule.min!;
    const hi = rule.max;
    if (!(Number.isInteger(value) && lo <= (value as number) && (hi === undefined || (value as number) <= hi))) {
      throw fail(rule, hi !== undefined ? "integer" : "integer_from", field, value, { min: lo, max: hi });
    }
  }
  if (kind === "strings") {
    const items = typeof value === "string" ? [value] : value;
    if (!(Array.isArray(items) && items.length <= rule.max_items! && items.every((s) => typeof s === "string" && s))) {
      throw fail(rule, "strings", field, value, { max_items: rule.max_items });
    }
  }
  if (kind === "embedding_input" && !embeddingInput(value, rule.max_items!)) {
    throw fail(rule, "embedding_input", field, value, { max_items: rule.max_items });
  }
  if ((kind === "object" || kind === "token_map") && !isObject(value)) throw fail(rule, "object", field, value);
  if (kind === "object" && rule.fields) return fields(rule.fields, value as Json, `${field}.`);
  if (kind === "token_map") {
    // in key order on both sides (JavaScript would list integer-like keys first, Python as sent)
    for (const [key, v] of Object.entries(value as Json).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
      if (!TOKEN_ID.test(key)) throw fail(rule, "token_key", field, key);
      check(rule.value!, v, `${field}[${key}]`);
    }
  }
  if (kind === "array") {
    if (!Array.isArray(value)) throw fail(rule, "array", field, value);
    if (value.length < (rule.min_items ?? 0))
      throw fail(rule, "too_few", field, value, { min_items: rule.min_items, count: value.length });
    if (rule.items) return value.map((v, i) => check(rule.items!, v, `${field}[${i}]`));
  }
  return value;
}

function tokenIds(v: unknown): boolean {
  return Array.isArray(v) && v.length > 0 && v.every((t) => Number.isInteger(t) && (t as number) >= 0);
}

/** OpenAI's embeddings ``input``: a text, texts, one token list, or token lists (none empty). */
function embeddingInput(value: unknown, maxItems: number): boolean {
  if (typeof value === "string") return value !== "";
  if (!Array.isArray(value) || !(value.length > 0 && value.length <= maxItems)) return tokenIds(value);
  return value.every((s) => typeof s === "string" && s) || tokenIds(value) || value.every(tokenIds);
}

/**
 * ``body`` checked field by field in the table's order: nulls dropped, defaults filled, other
 * fields kept as they are (OpenAI's clients send fields such as `user`).
 */
function fields(rules: Record<string, Rule>, body: Json, prefix = ""): Json {
  const out: Json = Object.fromEntries(Object.entries(body).filter(([k, v]) => !(Object.hasOwn(rules, k) && v === null)));
  for (const [name, rule] of Object.entries(rules)) {
    const field = prefix + name;
    if (Object.hasOwn(out, name)) {
      out[name] = check(rule, out[name], field);
      const need = rule.requires;
      if (need && out[need.field] !== need.value)
        throw fail({} as Rule, "requires", field, out[name], { other: need.field, value: need.value });
    } else if (rule.required && !(rule.optional_for_roles ?? []).includes(out.role as string)) {
      throw new InvalidRequestError(message("required", { field }));
    } else if (rule.default !== undefined) {
      out[name] = isObject(rule.default) ? check(rule, { ...rule.default }, field) : rule.default;
    }
  }
  return out;
}

/**
 * ``req`` under the rules of ``endpoint`` ("chat", or null for the shared fields only), with nulls
 * dropped and defaults filled; InvalidRequestError for the first broken rule.
 */
export function checkRequest(req: unknown, endpoint: "chat" | "embeddings" | null): CheckedRequest {
  if (!isObject(req)) throw new InvalidRequestError(message("body", { got: got(req) }));
  const shared = endpoint && RULES.standalone_endpoints.includes(endpoint) ? {} : RULES.shared;
  const rules = { ...(endpoint ? RULES.endpoints[endpoint] : {}), ...shared };
  return fields(rules, req) as unknown as CheckedRequest;
}

/** The most tokens a request may generate, or undefined (the twin of SamplingFields.token_limit). */
export function tokenLimit(req: ChatCompletionRequest): number | undefined {
  return req.max_completion_tokens ?? req.max_tokens ?? undefined;
}

/** The stop strings of a request, as a list (the twin of SamplingFields.stop_list). */
export function stopList(req: ChatCompletionRequest): string[] {
  return typeof req.stop === "string" ? [req.stop] : (req.stop ?? []);
}

/** The messages as the chat template sees them: roles renamed (developer -> system). */
export function templateMessages(messages: ChatMessage[]): ChatMessage[] {
  return messages.map((m) => ({ ...m, role: (RULES.template_roles[m.role] ?? m.role) as ChatMessage["role"] }));
}

/** The fields an artifact may carry defaults for: name -> [OpenAI's default, min, max or null]. */
export function generationFields(): Record<string, [number, number, number | null]> {
  return Object.fromEntries(
    Object.entries(RULES.shared)
      .filter(([, r]) => r.fallback !== undefined)
      .map(([name, r]) => [name, [r.fallback!, r.min!, r.max ?? null]]),
  );
}

/** The token ids that end a generation, from an artifact's mlc-chat-config.json. */
export function stopTokenIds(chatConfig: unknown): Set<number> {
  const ids = new Set<number>();
  for (const path of RULES.artifact.stop_token_ids) {
    let value: unknown = chatConfig;
    for (const key of path.split(".")) value = isObject(value) ? value[key] : undefined;
    for (const x of Array.isArray(value) ? value : [value]) if (Number.isInteger(x)) ids.add(x as number);
  }
  return ids;
}

/** Whether a chat template renders a request's tools itself. */
export function templateKnowsTools(template: string | null | undefined): boolean {
  return !!template && template.includes(RULES.artifact.tools_in_template);
}
