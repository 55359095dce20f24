// Exact grammars for `uniqueItems` arrays of listed values, which xgrammar 0.1.27 ignores.
//
// An array whose items are an `enum`, a `const` or booleans, with `uniqueItems: true`, is written in
// the grammar as a placeholder, `lantern:unique:<hex of [[value texts], minItems, maxItems]>`, and
// uniqueRules writes one rule per set of values already used: each next value is one not used
// yet, and the array may close once it holds minItems. The values are written as JSON in ASCII
// (strings with \uXXXX escapes, numbers with no exponent), so equal values have one text.
//
// The only copy, for both runtimes (structured.ts's header); tests/test_structured_exact.py checks it.
import { decimalText, payloadPlaceholder, placeholderPayload } from "./numbers";

const MAX_RULES = 2000;
const KIND = "unique";

/** uniqueItems on items Lantern cannot enumerate, or an array no unique values can fill. */
export class UniqueItemsError extends Error {
  override name = "UniqueItemsError";
}

/** The one JSON text a listed value is written as (ASCII, as Python's json.dumps writes it). */
export function valueText(value: unknown): string {
  if (typeof value === "boolean" || value === null) return JSON.stringify(value);
  if (typeof value === "number") return decimalText(value);
  if (typeof value === "string") {
    return JSON.stringify(value).replace(/[\u0080-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
  }
  throw new UniqueItemsError("uniqueItems needs items whose values are strings, numbers, booleans or null");
}

function ofType(value: unknown, types: unknown): boolean {
  if (types === undefined) return true;
  const kinds: Record<string, boolean> = {
    null: value === null,
    boolean: typeof value === "boolean",
    string: typeof value === "string",
    number: typeof value === "number",
    integer: typeof value === "number" && Number.isInteger(value),
  };
  return (typeof types === "string" ? [types] : (types as string[])).some((t) => kinds[t] ?? false);
}

/** The distinct value texts an `items` schema allows (an enum or const filtered by its type, or the booleans). */
export function itemValues(items: unknown): string[] {
  const allowed = ["enum", "const", "type", "title", "description"];
  if (
    typeof items === "object" &&
    items !== null &&
    !Array.isArray(items) &&
    Object.keys(items).every((k) => allowed.includes(k))
  ) {
    const s = items as Record<string, unknown>;
    const values =
      "const" in s
        ? [s.const]
        : "enum" in s
          ? Array.isArray(s.enum)
            ? s.enum
            : []
          : s.type === "boolean"
            ? [true, false]
            : null;
    if (values !== null) return [...new Set(values.filter((v) => ofType(v, s.type)).map(valueText))];
  }
  throw new UniqueItemsError("uniqueItems is supported for arrays whose items are an enum, a const or booleans");
}

export function placeholder(values: string[], minItems: number, maxItems: number | null): string {
  return payloadPlaceholder(KIND, [values, minItems, maxItems]);
}

const ebnfLiteral = (text: string): string => `"${text.replace(/\\/g, "\\\\").replace(/"/g, '\\"')}"`;

/** The EBNF rules (start: `${name}_0`) for the placeholder `key`: the whole array. */
export function uniqueRules(key: string, name: string): string[] {
  const [values, lo, maxItems] = placeholderPayload(key) as [string[], number, number | null];
  const hi = maxItems === null ? values.length : Math.min(maxItems, values.length);
  if (lo > hi) {
    throw new UniqueItemsError(
      lo > values.length
        ? `minItems ${lo} needs more distinct values than the ${values.length} its items allow`
        : `minItems ${lo} is above maxItems ${hi}`,
    );
  }
  const literals = values.map(ebnfLiteral);
  const rules: string[] = [];
  const index = new Map([[0n, 0]]);
  const order = [0n]; // the sets of used values, as bit masks, breadth-first
  for (let k = 0; k < order.length; k++) {
    const used = order[k];
    let count = 0;
    for (let b = used; b; b >>= 1n) count += Number(b & 1n);
    const alts = count >= lo ? ['"]"'] : [];
    if (count < hi) {
      literals.forEach((literal, j) => {
        if ((used >> BigInt(j)) & 1n) return;
        const next = used | (1n << BigInt(j));
        if (!index.has(next)) {
          if (order.length >= MAX_RULES) {
            throw new UniqueItemsError(
              `the array's unique values need more than ${MAX_RULES} grammar rules (list fewer values or lower maxItems)`,
            );
          }
          index.set(next, order.length);
          order.push(next);
        }
        alts.push(`${used === 0n ? "" : '", " '}${literal} ${name}_u${index.get(next)}`);
      });
    }
    rules.push(`${name}_u${index.get(used)} ::= ${alts.join(" | ")}`);
  }
  return [`${name}_0 ::= "[" ${name}_u0`, ...rules];
}
