// The structured-output compiler as `lantern serve` runs it: structured.ts and what it imports, bundled
// by build.mjs into dist/schema-host.js as a plain script for V8 (lantern/server/schema_host.py runs it
// with mini-racer), so the server and the browser read one copy of the schema rules and grammar writers.
//
// The script defines one global function, lanternSchemaHost(name, argsJson): it calls CALLS[name] with
// the JSON array of arguments and returns JSON, {"value": ...} or {"error": message, "name": its class}.
// An InvalidRequestError (a schema or request Lantern refuses) and the grammar writers' own errors come
// back as values; anything else is a bug and throws, with its stack.
import { InvalidRequestError } from "./errors";
import * as numbers from "./numbers";
import * as strings from "./strings";
import {
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

(globalThis as unknown as { lanternSchemaHost: (name: string, argsJson: string) => string }).lanternSchemaHost = (
  name,
  argsJson,
) => {
  const call = CALLS[name];
  if (!call) throw new Error(`schema host: no call named ${name}`);
  try {
    return JSON.stringify({ value: call(...(JSON.parse(argsJson) as never[])) ?? null });
  } catch (err) {
    if (!ERRORS.some((kind) => err instanceof kind)) throw err;
    return JSON.stringify({ error: (err as Error).message, name: (err as Error).name });
  }
};
