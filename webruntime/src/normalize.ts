// Real-world JSON Schemas, rewritten into the one dialect Lantern's grammar checks read.
//
// Schemas arrive in every draft (04 to 2020-12), with vendor keywords and annotations, and with
// `allOf`, `not` and conditionals that xgrammar does not enforce. normalize returns a schema of the
// same meaning in Draft 2020-12 with only the keywords schema_support.json lists, plus the warnings a
// user should see (what was ignored); or InvalidRequestError naming what it cannot rewrite exactly.
// structured.ts's checkSchema then checks and lowers the result as before.
//
// What it does, node by node (bottom-up):
// - drafts: `dependencies` becomes dependentRequired / dependentSchemas, array-form `items` with
//   `additionalItems` becomes prefixItems / items, boolean exclusiveMinimum / exclusiveMaximum become
//   numbers; `$ref` siblings apply (draft-04/06/07 say to ignore them, jsonschema does, ajv does not:
//   applied, the answer is valid for both, and a warning says so);
// - annotations (schema_support.json's `annotations`) are dropped; keywords in `refused` are refused by
//   name; any other keyword is unknown, so an annotation as JSON Schema says: dropped, with a warning;
// - `allOf` (and a `$ref` with siblings) is merged into one schema: properties and required unioned,
//   bounds and lengths tightened, types and enums intersected, subschemas merged recursively, `$ref`s
//   resolved first; a subschema no value satisfies becomes `false` where it stands (a contradiction),
//   and only a schema false as a whole is refused, naming its first contradiction;
// - `not` of a type, of one required name, or of listed values (an enum, booleans, null);
//   dependentRequired and dependentSchemas and if/then/else (only with a one-name `required`
//   condition) become a choice of branches;
// - ajv-formats' number formats (int32, int64, float, double) become the bounds they check, and
//   patternProperties every name matches (".*") apply to listed and unlisted properties;
// - a node's own keywords beside anyOf / oneOf are merged into each branch (xgrammar reads either the
//   branches or the node, not both); a branch that contradicts them is dropped;
// - once all is merged (close): a required property that `properties` does not list is listed, with the
//   value additionalProperties or a matching patternProperties allows (xgrammar allows no unlisted
//   property); listed properties with additionalProperties true or a schema: unlisted properties are not
//   generated (xgrammar would let a listed name through again with any value), with a warning;
//   uniqueItems over items the grammar cannot list: at most one item, with a warning; propertyNames
//   beside properties, additionalProperties or patternProperties (xgrammar then enforces the names and
//   no value) checked on the listed names and dropped where only listed names are generated, listed
//   out where it allows a list of names, turned into patternProperties where it is one pattern, else
//   refused;
// - false subschemas are removed where xgrammar refuses them (prune), and $refs into dropped keywords
//   are pointed at copies in $defs (relocate).
//
// The only copy, for both runtimes (structured.ts's header). It reads compiler/contracts/schema_support.json;
// tests/test_schema_normalize.py checks it on every JSONSchemaBench schema and on its own cases.
import { InvalidRequestError } from "./errors";
import * as strings from "./strings";
import * as unique from "./unique";

declare const __SCHEMA_SUPPORT__: {
  keywords: string[];
  annotations: string[];
  refused: string[];
  formats: string[];
  format_patterns: Record<string, string>;
  validator_formats: string[];
  format_numbers: Record<string, Record<string, unknown>>;
  normalize_limits: { nodes: number; branches: number; names: number };
};
const SUPPORT = __SCHEMA_SUPPORT__;
const KEYWORDS = new Set(SUPPORT.keywords);
const ANNOTATIONS = new Set(SUPPORT.annotations);
const REFUSED = new Set(SUPPORT.refused);
const ENFORCED_FORMATS = new Set([...SUPPORT.formats, ...Object.keys(SUPPORT.format_patterns)]);
const VALIDATOR_FORMATS = new Set(SUPPORT.validator_formats);
const FORMAT_NUMBERS = SUPPORT.format_numbers;
const MAX_NODES = SUPPORT.normalize_limits.nodes;
const MAX_BRANCHES = SUPPORT.normalize_limits.branches;
const MAX_NAMES = SUPPORT.normalize_limits.names;
const MAX_DEPTH = 64;
const ANY_NAME = ["", ".*", "^.*", "^"]; // patterns every property name matches

type Obj = Record<string, unknown>;
type Schema = boolean | Obj;

/** A schema Lantern cannot rewrite exactly: an InvalidRequestError to the page, and a 400 from the server. */
export class SchemaError extends InvalidRequestError {
  constructor(message: string) {
    super(message);
    this.name = "InvalidRequestError";
  }
}

/** Parts of a schema that no value satisfies together. */
export class Contradiction extends SchemaError {}

const MAPS = ["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"];
const LISTS = ["anyOf", "oneOf", "allOf", "prefixItems"];
const ONE = [
  "items",
  "additionalProperties",
  "unevaluatedProperties",
  "unevaluatedItems",
  "propertyNames",
  "not",
  "if",
  "then",
  "else",
];
const DRAFTS: [string, number][] = [
  ["draft-04", 4],
  ["draft-06", 6],
  ["draft-07", 7],
  ["2019-09", 2019],
  ["2020-12", 2020],
];
const NUMBER_KEYWORDS = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"];
const SCALARS = ["string", "number", "integer", "boolean", "null"];
const TYPES = [...SCALARS, "array", "object"];
const DEFS = ["$defs", "definitions"];

const isObject = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const has = (o: Obj, k: string): boolean => Object.hasOwn(o, k);
const without = (o: Obj, ...keys: string[]): Obj => Object.fromEntries(Object.entries(o).filter(([k]) => !keys.includes(k)));
const only = (o: Obj, keys: string[]): Obj => Object.fromEntries(Object.entries(o).filter(([k]) => keys.includes(k)));
const isEmpty = (s: unknown): boolean => s === true || (isObject(s) && Object.keys(s).length === 0);
const unique_ = <T>(xs: T[]): T[] => [...new Set(xs)];
const oneOrList = (ts: unknown[]): unknown => (ts.length === 1 ? ts[0] : ts);

/** The draft a root schema's `$schema` names (4, 6, 7, 2019, 2020), or null. */
export function draftOf(schema: unknown): number | null {
  const uri = isObject(schema) ? schema.$schema : undefined;
  if (typeof uri === "string") for (const [name, draft] of DRAFTS) if (uri.includes(name)) return draft;
  return null;
}

function typeOf(v: unknown): string {
  if (v === null) return "null";
  if (typeof v === "boolean") return "boolean";
  if (typeof v === "number") return Number.isInteger(v) ? "integer" : "number";
  if (typeof v === "string") return "string";
  return Array.isArray(v) ? "array" : "object";
}

function typesOf(schema: Obj): unknown[] | null {
  const t = schema.type;
  return typeof t === "string" ? [t] : Array.isArray(t) ? [...t] : null;
}

/** JSON with sorted keys and numbers by value: equal JSON values give equal texts (1 and 1.0 too). */
function canon(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canon).join(",")}]`;
  if (isObject(v))
    return `{${Object.keys(v)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canon(v[k])}`)
      .join(",")}}`;
  return JSON.stringify(v);
}
const same = (a: unknown, b: unknown): boolean => canon(a) === canon(b);

/**
 * JSON as Python's json.dumps writes it by default (", " and ": ", keys in order): the layout of the messages that
 * quote values and of a spec's schema text (structured.ts), as the server wrote them when it had its own compiler.
 */
export function pyJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(pyJson).join(", ")}]`;
  if (isObject(v))
    return `{${Object.keys(v)
      .map((k) => `${JSON.stringify(k)}: ${pyJson(v[k])}`)
      .join(", ")}}`;
  return JSON.stringify(v);
}
const pyList = (xs: unknown[]): string => `[${xs.map((x) => `'${x}'`).join(", ")}]`;
const cut = (text: string, n: number): string => Array.from(text).slice(0, n).join("");

function jsonPointer(root: unknown, ref: string): unknown {
  let node = root;
  for (let part of ref === "#" ? [] : ref.slice(2).split("/")) {
    part = part.replaceAll("~1", "/").replaceAll("~0", "~");
    if (isObject(node) && has(node, part)) node = node[part];
    else if (Array.isArray(node) && /^[0-9]+$/.test(part) && Number(part) < node.length) node = node[Number(part)];
    else return undefined;
  }
  return node;
}

function search(pattern: string, name: string): boolean {
  try {
    return new RegExp(strings.withClasses(pattern), "u").test(name);
  } catch {
    return false;
  }
}

class Normalizer {
  private readonly draft: number | null;
  private readonly ignored = new Map<string, string[]>();
  private readonly refs = new Map<string, Schema>();
  private readonly resolving: string[] = [];
  contradiction: Contradiction | null = null;
  private falseRefs = new Set<string>();
  private readonly merging: string[] = [];
  private nodes = 0;

  constructor(
    private readonly root: unknown,
    private readonly where: string,
  ) {
    this.draft = draftOf(root);
  }

  private warn(what: string, where: string): void {
    const places = this.ignored.get(what) ?? [];
    if (!places.includes(where)) places.push(where);
    this.ignored.set(what, places);
  }

  warnings(): string[] {
    return [...this.ignored].map(
      ([what, places]) => `${what} at ${places[0]}${places.length > 1 ? ` and ${places.length - 1} more places` : ""}`,
    );
  }

  // ---- one node ---------------------------------------------------------------------------------

  node(schema: unknown, where: string): Schema {
    this.nodes++;
    if (this.nodes > MAX_NODES)
      throw new SchemaError(`schema at ${this.where}: more than ${MAX_NODES} subschemas after resolving allOf and $ref`);
    if (typeof schema === "boolean") return schema;
    if (!isObject(schema)) throw new SchemaError(`schema at ${where} must be an object or a boolean, not ${typeOf(schema)}`);
    const spelled = this.draftSpellings(schema, where);
    for (const t of typeof spelled.type === "string" ? [spelled.type] : Array.isArray(spelled.type) ? spelled.type : []) {
      if (!TYPES.includes(t as string)) {
        throw new SchemaError(`schema keyword 'type' at ${where}: ${pyJson(t)} is not a JSON Schema type (${TYPES.join(", ")})`);
      }
    }
    const out: Obj = {};
    let doubled: Schema | undefined;
    for (const [key, value] of Object.entries(spelled)) {
      if (
        key === "not" &&
        isObject(value) &&
        Object.keys(value)
          .filter((k) => !ANNOTATIONS.has(k))
          .join() === "not"
      ) {
        doubled = this.node(value.not, `${where}/not/not`); // a double negation: its schema, merged below
        continue;
      }
      if (REFUSED.has(key))
        throw new SchemaError(`schema keyword '${key}' at ${where} is not supported: Lantern cannot enforce it in a grammar`);
      if (ANNOTATIONS.has(key)) continue;
      if (!KEYWORDS.has(key)) {
        this.warn(`ignored the unknown keyword '${key}'`, where);
        continue;
      }
      if (key === "format" && typeof value === "string" && !ENFORCED_FORMATS.has(value) && !VALIDATOR_FORMATS.has(value)) {
        this.warn(`ignored format '${value}' (no validator checks it)`, where);
        continue;
      }
      out[key] = this.children(key, value, where);
    }
    if (has(out, "allOf") && !(Array.isArray(out.allOf) && out.allOf.length)) {
      throw new SchemaError(`schema keyword 'allOf' at ${where} must be a non-empty list of schemas`);
    }
    try {
      let merged: Schema = out;
      if (has(out, "$ref")) merged = this.refSiblings(out, where);
      if (isObject(merged) && has(merged, "allOf")) {
        const parts = merged.allOf as unknown[];
        merged = without(merged, "allOf");
        for (let i = 0; i < parts.length; i++) {
          merged = this.merge(merged, parts[i] as Schema, `${where}/allOf/${i}`);
          if (merged === false) return false;
        }
      }
      if (doubled !== undefined) {
        merged = this.merge(merged, doubled, `${where}/not/not`);
        if (merged === false) return false;
      }
      return this.finish(merged, where);
    } catch (err) {
      if (!(err instanceof Contradiction)) throw err;
      this.contradiction ??= err;
      return false;
    }
  }

  private finish(schema: Schema, where: string): Schema {
    if (typeof schema === "boolean") return schema;
    let s: Schema = this.conditionals({ ...schema }, where);
    if (s !== false && has(s as Obj, "not")) s = this.negation(s as Obj, where);
    if (s !== false) s = this.distribute(s as Obj, where);
    if (isObject(s)) s = this.numberFormat(this.anyNamePattern(this.typedValues(s, where), where), where);
    if (isObject(s) && s.minItems && !has(s, "items") && !has(s, "prefixItems")) s = { ...s, items: {} };
    return s;
  }

  /** The restrictions a grammar needs, once everything is merged (close). */
  close(schema: Schema, where: string): Schema {
    if (!isObject(schema)) return schema;
    let out: Obj = {};
    for (const [key, value] of Object.entries(schema)) {
      if (MAPS.includes(key) && isObject(value)) {
        out[key] = Object.fromEntries(
          Object.entries(value).map(([k, v]) => [k, this.close(v as Schema, `${where}/${key}/${k}`)]),
        );
      } else if (LISTS.includes(key) && Array.isArray(value)) {
        out[key] = value.map((v, i) => this.close(v as Schema, `${where}/${key}/${i}`));
      } else if (ONE.includes(key)) {
        out[key] = this.close(value as Schema, `${where}/${key}`);
      } else {
        out[key] = value;
      }
    }
    try {
      if (out.uniqueItems === true) out = this.uniqueItems(out, where);
      return this.listedProperties(this.propertyNames(out, where), where);
    } catch (err) {
      if (!(err instanceof Contradiction)) throw err;
      this.contradiction ??= err;
      return false;
    }
  }

  private numberFormat(schema: Obj, where: string): Schema {
    const lowered =
      typeof schema.format === "string" && Object.hasOwn(FORMAT_NUMBERS, schema.format)
        ? FORMAT_NUMBERS[schema.format]
        : undefined;
    const types = typesOf(schema);
    if (lowered === undefined || !types || !types.length) return schema;
    const rest = without(schema, "format");
    const numeric = types.filter((t) => t === "number" || t === "integer");
    if (!numeric.length) return rest;
    if (numeric.length === types.length) return this.merge(rest, lowered, where);
    const others = types.filter((t) => t !== "number" && t !== "integer");
    const other = without(rest, ...NUMBER_KEYWORDS);
    return { anyOf: [this.merge({ ...rest, type: oneOrList(numeric) }, lowered, where), { ...other, type: oneOrList(others) }] };
  }

  private uniqueItems(schema: Obj, where: string): Obj {
    let items = schema.items;
    if (isObject(items) && has(items, "$ref") && !this.resolving.includes(items.$ref as string))
      items = this.deref(items as Obj, where);
    try {
      unique.itemValues(items === undefined ? null : items);
      return has(schema, "items") ? { ...schema, items } : schema;
    } catch (err) {
      if (!(err instanceof unique.UniqueItemsError)) throw err;
      if (has(schema, "prefixItems") || ((schema.minItems as number) ?? 0) > 1) return schema;
    }
    this.warn("generated at most one item for uniqueItems over items that cannot be listed", where);
    return { ...without(schema, "uniqueItems"), maxItems: Math.min((schema.maxItems as number) ?? 1, 1) };
  }

  private anyNamePattern(schema: Obj, where: string): Obj {
    const pats = schema.patternProperties;
    if (!isObject(pats) || !Object.keys(pats).some((p) => ANY_NAME.includes(p))) return schema;
    const out: Obj = { ...schema, patternProperties: without(pats, ...ANY_NAME) };
    if (!Object.keys(out.patternProperties as Obj).length) delete out.patternProperties;
    for (const p of Object.keys(pats).filter((k) => ANY_NAME.includes(k))) {
      const props = Object.fromEntries(
        Object.entries((out.properties as Obj) ?? {}).map(([n, v]) => [
          n,
          this.tryMerge(v as Schema, pats[p] as Schema, `${where}/properties/${n}`),
        ]),
      );
      if (Object.keys(props).length) out.properties = props;
      out.additionalProperties = this.tryMerge(
        has(out, "additionalProperties") ? (out.additionalProperties as Schema) : true,
        pats[p] as Schema,
        `${where}/patternProperties/${p}`,
      );
    }
    return out;
  }

  private children(key: string, value: unknown, where: string): unknown {
    if (MAPS.includes(key) && isObject(value)) {
      return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, this.node(v, `${where}/${key}/${k}`)]));
    }
    if (LISTS.includes(key) && Array.isArray(value)) return value.map((v, i) => this.node(v, `${where}/${key}/${i}`));
    if (ONE.includes(key)) return this.node(value, `${where}/${key}`);
    return value;
  }

  private draftSpellings(schema: Obj, where: string): Obj {
    const s: Obj = { ...schema };
    if (has(s, "dependencies")) {
      const deps = s.dependencies;
      delete s.dependencies;
      if (!isObject(deps)) throw new SchemaError(`schema keyword 'dependencies' at ${where} must be an object`);
      for (const [name, dep] of Object.entries(deps)) {
        const target = Array.isArray(dep) ? "dependentRequired" : "dependentSchemas";
        const current = (s[target] as Obj) ?? {};
        if (has(current, name))
          throw new SchemaError(`schema keywords 'dependencies' and '${target}' at ${where} both name '${name}'`);
        s[target] = { ...current, [name]: dep };
      }
    }
    if (Array.isArray(s.items)) {
      if (has(s, "prefixItems")) throw new SchemaError(`schema keywords 'items' (a list) and 'prefixItems' at ${where} conflict`);
      const tuple = s.items;
      delete s.items;
      s.prefixItems = tuple;
      if (has(s, "additionalItems")) {
        s.items = s.additionalItems;
        delete s.additionalItems;
      }
    } else if (has(s, "additionalItems")) {
      delete s.additionalItems;
    }
    for (const [exclusive, bound] of [
      ["exclusiveMinimum", "minimum"],
      ["exclusiveMaximum", "maximum"],
    ]) {
      if (typeof s[exclusive] === "boolean") {
        const on = s[exclusive];
        delete s[exclusive];
        if (on && has(s, bound)) {
          s[exclusive] = s[bound];
          delete s[bound];
        }
      }
    }
    if (typeof s.id === "string") delete s.id;
    if (has(s, "definitions") && has(s, "$defs"))
      throw new SchemaError(`schema at ${where} has both 'definitions' and '$defs': use one`);
    return s;
  }

  private refSiblings(schema: Obj, where: string): Schema {
    const rest = without(schema, "$ref", ...DEFS);
    const keep = only(schema, ["$ref", ...DEFS]);
    if (!Object.keys(rest).length) return schema;
    if (this.draft !== null && this.draft <= 7) {
      const names = Object.keys(rest)
        .map((k) => `'${k}'`)
        .join(", ");
      this.warn(`applied ${names} beside '$ref', which draft-0${this.draft} ignores (ajv applies them)`, where);
    }
    const target = this.resolve(schema.$ref, where);
    const merged = this.merge(rest, target, where);
    return merged === false ? false : { ...without(keep, "$ref"), ...(merged as Obj) };
  }

  // ---- $ref --------------------------------------------------------------------------------------

  private resolve(ref: unknown, where: string): Schema {
    if (typeof ref !== "string" || !(ref === "#" || ref.startsWith("#/"))) {
      throw new SchemaError(`schema keyword '$ref' at ${where}: only local references (#/...) are supported`);
    }
    const known = this.refs.get(ref);
    if (known !== undefined) return known;
    if (this.resolving.includes(ref)) {
      throw new SchemaError(
        `schema keyword '$ref' at ${where}: '${ref}' refers to itself through allOf or a $ref with siblings, which cannot be merged`,
      );
    }
    const target = jsonPointer(this.root, ref);
    if (target === undefined) throw new SchemaError(`schema keyword '$ref' at ${where}: '${ref}' points to nothing`);
    this.resolving.push(ref);
    try {
      this.refs.set(ref, this.node(target, ref));
    } finally {
      this.resolving.pop();
    }
    return this.refs.get(ref)!;
  }

  private deref(schema: Schema, where: string): Schema {
    while (isObject(schema) && has(schema, "$ref") && Object.keys(schema).every((k) => k === "$ref" || DEFS.includes(k))) {
      schema = this.resolve(schema.$ref, where);
    }
    return schema;
  }

  // ---- allOf -------------------------------------------------------------------------------------

  merge(a: Schema, b: Schema, where: string): Schema {
    if (isEmpty(a)) return b;
    if (isEmpty(b)) return a;
    if (same(a, b)) return a;
    if (this.merging.length >= MAX_DEPTH) {
      throw new SchemaError(
        `schema at ${where}: allOf and $ref merge deeper than ${MAX_DEPTH} levels (a recursive $ref under allOf?)`,
      );
    }
    this.merging.push(where);
    try {
      return this.mergeSchemas(this.deref(a, where), this.deref(b, where), where);
    } finally {
      this.merging.pop();
    }
  }

  private mergeSchemas(a: Schema, b: Schema, where: string): Schema {
    if (a === false || b === false) return false;
    if (a === true) return b;
    if (b === true || same(a, b)) return a;
    const out: Obj = { ...a };
    for (const [key, value] of Object.entries(b)) {
      if (!has(out, key)) {
        out[key] = value;
        continue;
      }
      const mine = out[key];
      const numbers = typeof mine === "number" && typeof value === "number";
      if (key === "type") {
        out[key] = this.mergeTypes(typesOf(a) ?? [], typesOf(b) ?? [], where);
      } else if (key === "enum" || key === "const") {
        const values = key === "enum" ? this.values(a) : [mine];
        const theirs = key === "enum" ? this.values(b) : [value];
        const both = values.filter((v) => theirs.some((w) => same(v, w)));
        if (!both.length) throw new Contradiction(`schema keyword '${key}' at ${where}: no value is in both lists`);
        out[key] = key === "enum" ? both : both[0];
      } else if (numbers && ["minimum", "minLength", "minItems", "minProperties", "exclusiveMinimum"].includes(key)) {
        out[key] = Math.max(mine, value);
      } else if (numbers && ["maximum", "maxLength", "maxItems", "maxProperties", "exclusiveMaximum"].includes(key)) {
        out[key] = Math.min(mine, value);
      } else if (key === "required" && Array.isArray(mine) && Array.isArray(value)) {
        out[key] = unique_([...mine, ...value]);
      } else if (key === "uniqueItems") {
        out[key] = Boolean(mine) || Boolean(value);
      } else if (["properties", "additionalProperties", "patternProperties"].includes(key)) {
        // below, together
      } else if (["items", "propertyNames", "unevaluatedItems", "unevaluatedProperties"].includes(key)) {
        out[key] = this.tryMerge(mine as Schema, value as Schema, `${where}/${key}`);
      } else if ((key === "$defs" || key === "definitions" || key === "dependentSchemas") && isObject(mine) && isObject(value)) {
        out[key] = { ...mine, ...value };
      } else if (key === "dependentRequired" && isObject(mine) && isObject(value)) {
        out[key] = Object.fromEntries(
          Object.keys({ ...mine, ...value }).map((k) => [
            k,
            unique_([...((mine[k] as string[]) ?? []), ...((value[k] as string[]) ?? [])]),
          ]),
        );
      } else if ((key === "anyOf" || key === "oneOf") && Array.isArray(mine) && Array.isArray(value)) {
        out[key] = this.cross(mine as Schema[], value as Schema[], `${where}/${key}`);
      } else if (key === "prefixItems" && Array.isArray(mine) && Array.isArray(value)) {
        if (mine.length !== value.length) {
          throw new SchemaError(
            `schema keyword 'prefixItems' at ${where}: cannot merge tuples of ${mine.length} and ${value.length} items`,
          );
        }
        out[key] = mine.map((x, i) => this.tryMerge(x as Schema, value[i] as Schema, `${where}/prefixItems/${i}`));
      } else if (key === "multipleOf" && numbers) {
        out[key] = this.mergeMultiple(mine, value, where);
      } else if (!same(mine, value)) {
        throw new SchemaError(
          `schema keyword '${key}' at ${where}: cannot merge two different values ` +
            `(${cut(pyJson(mine), 60)} and ${cut(pyJson(value), 60)})`,
        );
      }
    }
    if (["properties", "additionalProperties", "patternProperties"].some((k) => has(a, k) || has(b, k))) {
      this.mergeProperties(a, b, out, where);
    }
    return this.finish(out, where);
  }

  private values(schema: Obj): unknown[] {
    return has(schema, "enum") ? (schema.enum as unknown[]) : has(schema, "const") ? [schema.const] : [];
  }

  private mergeTypes(a: unknown[], b: unknown[], where: string): unknown {
    if (!a.length || !b.length) return a.length ? a : b;
    const both = a.filter((t) => b.includes(t) || (t === "integer" && b.includes("number")));
    both.push(...b.filter((t) => t === "integer" && a.includes("number") && !both.includes(t)));
    if (!both.length)
      throw new Contradiction(`schema keyword 'type' at ${where}: no type is in both ${pyList(a)} and ${pyList(b)}`);
    return oneOrList(both);
  }

  private mergeMultiple(x: number, y: number, where: string): number {
    if (x === y) return x;
    const [big, small] = x >= y ? [x, y] : [y, x];
    if (Number.isInteger(big) && Number.isInteger(small) && big % small === 0) return big;
    throw new SchemaError(`schema keyword 'multipleOf' at ${where}: cannot merge multipleOf ${x} and ${y}`);
  }

  private cross(xs: Schema[], ys: Schema[], where: string): Schema[] {
    if (xs.length * ys.length > MAX_BRANCHES) {
      throw new SchemaError(
        `schema at ${where}: merging gives ${xs.length * ys.length} branches, over the limit of ${MAX_BRANCHES}`,
      );
    }
    const out: Schema[] = [];
    for (const x of xs)
      for (const y of ys) {
        const m = this.tryMerge(x, y, where);
        if (m !== false) out.push(m);
      }
    if (!out.length) throw new Contradiction(`schema at ${where}: no branch holds with the other's`);
    return out;
  }

  private tryMerge(x: Schema, y: Schema, where: string): Schema {
    try {
      return this.merge(x, y, where);
    } catch (err) {
      if (err instanceof Contradiction) return false;
      throw err;
    }
  }

  private propertySchema(schema: Obj, name: string): Schema {
    const props = isObject(schema.properties) ? schema.properties : {};
    if (has(props, name)) return props[name] as Schema;
    const matched = Object.entries(isObject(schema.patternProperties) ? schema.patternProperties : {})
      .filter(([p]) => search(p, name))
      .map(([, s]) => s as Schema);
    if (matched.length) {
      let out: Schema = true;
      for (const s of matched) out = this.merge(out, s, "#");
      return out;
    }
    const extra = has(schema, "additionalProperties") ? (schema.additionalProperties as Schema) : true;
    return extra === true ? {} : extra;
  }

  private mergeProperties(a: Obj, b: Obj, out: Obj, where: string): void {
    if (has(a, "patternProperties") && has(b, "patternProperties") && !same(a.patternProperties, b.patternProperties)) {
      throw new SchemaError(`schema keyword 'patternProperties' at ${where}: cannot merge two different values`);
    }
    const names = unique_([...Object.keys((a.properties as Obj) ?? {}), ...Object.keys((b.properties as Obj) ?? {})]);
    const props: Obj = {};
    for (const name of names) {
      const merged = this.tryMerge(this.propertySchema(a, name), this.propertySchema(b, name), `${where}/properties/${name}`);
      if (merged === false && ((out.required as string[]) ?? []).includes(name)) {
        throw new Contradiction(
          `schema keyword 'required' at ${where}: '${name}' is required but no value of it holds in every allOf part`,
        );
      }
      props[name] = merged;
    }
    if (Object.keys(props).length) out.properties = props;
    const extraA = has(a, "additionalProperties") ? (a.additionalProperties as Schema) : true;
    const extraB = has(b, "additionalProperties") ? (b.additionalProperties as Schema) : true;
    const extra = this.tryMerge(extraA, extraB, `${where}/additionalProperties`);
    if (extra === true) delete out.additionalProperties;
    else out.additionalProperties = extra;
  }

  // ---- not, conditionals -------------------------------------------------------------------------

  private negation(schema: Obj, where: string): Schema {
    const neg = this.deref(schema.not as Schema, `${where}/not`);
    schema = without(schema, "not");
    if (neg === false) return schema;
    if (isEmpty(neg)) return false;
    const n = neg as Obj;
    const keys = Object.keys(n)
      .filter((k) => !ANNOTATIONS.has(k))
      .sort()
      .join(",");
    const types = typesOf(schema);
    if (keys === "type") {
      const banned = typesOf(n) ?? [];
      const allowed = (types ?? ["string", "number", "integer", "boolean", "null", "array", "object"]).filter(
        (t) => !banned.includes(t) && !(t === "integer" && banned.includes("number")),
      );
      if ((types ?? ["number"]).includes("number") && banned.includes("integer") && !banned.includes("number")) {
        throw new SchemaError(`schema keyword 'not' at ${where}: a number that is not an integer cannot be written exactly`);
      }
      if (!allowed.length) return false;
      return { ...schema, type: oneOrList(allowed) };
    }
    if (keys === "required" && Array.isArray(n.required)) {
      // only an object can lack a required name (on any other value `required` holds)
      if (types !== null && !types.includes("object")) return false;
      schema = { ...schema, type: "object" };
      const own = (schema.required as unknown[]) ?? [];
      const absent = [...new Set(n.required as unknown[])].filter((name) => !own.includes(name));
      if (!absent.length) return false;
      return this.choose(
        schema,
        absent.map((name) => ({ properties: { [name as string]: false } })),
        where,
      ); // one absent
    }
    if (keys === "anyOf" && Array.isArray(n.anyOf)) {
      // none of them: each negated
      let out: Schema = schema;
      for (const [i, part] of (n.anyOf as Schema[]).entries()) {
        out = this.negation({ ...(out as Obj), not: part }, `${where}/not/anyOf/${i}`);
        if (out === false) return false;
      }
      return out;
    }
    if (keys === "allOf" && Array.isArray(n.allOf) && n.allOf.length) {
      // one of them fails
      const branches = (n.allOf as Schema[])
        .map((part, i) => this.negation({ not: part }, `${where}/not/allOf/${i}`))
        .filter((b) => b !== false);
      if (!branches.length) return false;
      if (branches.some((b) => isEmpty(b))) return schema; // a part whose negation always holds
      return this.choose(schema, branches, where);
    }
    if (keys === "enum" || keys === "const") {
      const banned = this.values(n);
      if (has(schema, "enum") || has(schema, "const")) {
        const kept = this.values(schema).filter((v) => !banned.some((w) => same(v, w)));
        if (!kept.length) return false;
        return { ...without(schema, "enum", "const"), enum: kept };
      }
      if (types?.length === 1 && types[0] === "boolean") {
        const kept = [true, false].filter((v) => !banned.some((w) => same(v, w)));
        return kept.length ? { ...schema, enum: kept } : false;
      }
      if (types?.length === 1 && types[0] === "null") return banned.some((w) => w === null) ? false : schema;
    }
    throw new SchemaError(
      `schema keyword 'not' at ${where}: only 'not' of a type, of required names, of values of a ` +
        "boolean or listed type, or of anyOf or allOf of those is supported",
    );
  }

  /** `schema` where one of `branches` holds too (the twin's choose). */
  private choose(schema: Obj, branches: Schema[], where: string): Schema {
    return this.merge(schema, branches.length > 1 ? { anyOf: branches } : branches[0], where);
  }

  private conditionals(schema: Obj, where: string): Schema {
    const branches: Schema[][] = [];
    const dependentRequired = (schema.dependentRequired as Record<string, string[]>) ?? {};
    const dependentSchemas = (schema.dependentSchemas as Record<string, Schema>) ?? {};
    schema = without(schema, "dependentRequired", "dependentSchemas");
    for (const [name, names] of Object.entries(dependentRequired)) {
      branches.push([{ properties: { [name]: false } }, { required: [name, ...names] }]);
    }
    for (const [name, sub] of Object.entries(dependentSchemas)) {
      const withIt = this.merge({ required: [name] }, sub, `${where}/dependentSchemas/${name}`);
      branches.push([{ properties: { [name]: false } }, ...(withIt !== false ? [withIt] : [])]);
    }
    if (has(schema, "if")) {
      const cond = this.deref(schema.if as Schema, `${where}/if`);
      const then = has(schema, "then") ? (schema.then as Schema) : true;
      const other = has(schema, "else") ? (schema.else as Schema) : true;
      schema = without(schema, "if", "then", "else");
      if (isEmpty(cond)) {
        branches.push([then]);
      } else if (cond === false) {
        branches.push([other]);
      } else {
        const c = cond as Obj;
        if (Object.keys(c).join(",") !== "required" || !Array.isArray(c.required) || c.required.length !== 1) {
          throw new SchemaError(`schema keyword 'if' at ${where}: only a condition of one required name is supported`);
        }
        const name = c.required[0] as string;
        const yes = this.merge({ required: [name] }, then, `${where}/then`);
        const no = this.merge({ properties: { [name]: false } }, other, `${where}/else`);
        branches.push([yes, no].filter((x) => x !== false));
      }
    } else {
      schema = without(schema, "then", "else");
    }
    let out: Schema = schema;
    for (const choice of branches) {
      if (!choice.length) return false;
      out = this.choose(out as Obj, choice, where);
      if (out === false) return false;
    }
    return out;
  }

  // ---- anyOf / oneOf, properties -----------------------------------------------------------------

  private distribute(schema: Obj, where: string): Schema {
    for (const key of ["anyOf", "oneOf"]) {
      if (!has(schema, key)) continue;
      const list = schema[key];
      if (!Array.isArray(list) || !list.length)
        throw new SchemaError(`schema keyword '${key}' at ${where} must be a non-empty list of schemas`);
      const own = without(schema, key, ...DEFS);
      if (!Object.keys(own).length) continue;
      const branches: Schema[] = [];
      list.forEach((b, i) => {
        const m = this.tryMerge(own, b as Schema, `${where}/${key}/${i}`);
        if (m !== false) branches.push(m);
      });
      if (!branches.length)
        throw new Contradiction(`schema keyword '${key}' at ${where}: no branch holds with the keywords beside it`);
      schema = { ...only(schema, DEFS), [key]: branches };
    }
    if (has(schema, "anyOf") && has(schema, "oneOf")) {
      const crossed = this.cross(schema.anyOf as Schema[], schema.oneOf as Schema[], where);
      schema = { ...without(schema, "anyOf", "oneOf"), anyOf: crossed };
    }
    return schema;
  }

  /** The values of an enum of other types than `type` beside it dropped (the twin's typed_values). */
  private typedValues(schema: Obj, where: string): Obj {
    const types = typesOf(schema);
    if (
      types === null ||
      !(has(schema, "enum") || has(schema, "const")) ||
      (has(schema, "enum") && !Array.isArray(schema.enum))
    ) {
      return schema;
    }
    const values = this.values(schema);
    const kept = values.filter((v) => types.some((t) => typeOf(v) === t || (t === "number" && typeOf(v) === "integer")));
    if (!kept.length) {
      throw new Contradiction(
        `schema keyword '${has(schema, "enum") ? "enum" : "const"}' at ${where}: no value is of the ` +
          `type ${pyJson(schema.type)}`,
      );
    }
    return kept.length === values.length ? schema : { ...schema, enum: kept }; // (a const is kept or refused)
  }

  /**
   * xgrammar enforces no `required` beside patternProperties, counts a repeated unlisted name once each
   * time for minProperties, and gives a listed name that a pattern matches either schema, where a
   * validator applies both (the twin's only_listed). Where any of these matters, the object is generated
   * with its listed properties only: the required names listed, each listed name given its patterns'
   * schemas, patternProperties dropped, additionalProperties false.
   */
  private onlyListed(schema: Obj, where: string): Obj {
    const required = [...new Set(((schema.required as unknown[]) ?? []).filter((n): n is string => typeof n === "string"))];
    const patterns = isObject(schema.patternProperties) ? schema.patternProperties : {};
    const hasPatterns = Object.keys(patterns).length > 0;
    const unlisted = (has(schema, "additionalProperties") ? schema.additionalProperties : true) !== false || hasPatterns;
    const low = schema.minProperties;
    const counted = typeof low === "number" && low > required.length + 1; // one unlisted name can always stand in for more
    const own = isObject(schema.properties) ? schema.properties : {};
    const matched = Object.keys(patterns).some((p) => Object.keys(own).some((n) => search(p, n)));
    if (!((hasPatterns && (required.length || matched)) || (unlisted && counted))) return schema;
    const props: Obj = {};
    for (const name of new Set([...Object.keys(own), ...required])) {
      const sub = this.propertySchema(schema, name);
      props[name] = has(own, name) ? this.withPatterns(schema, name, sub, where) : sub;
    }
    this.warn(
      "generated only the listed and required properties (xgrammar enforces neither required nor " +
        "listed names' schemas beside patternProperties, nor distinct names for minProperties)",
      where,
    );
    return { ...without(schema, "patternProperties"), properties: props, additionalProperties: false };
  }

  /** propertyNames beside the keywords that give values to names (the twin's property_names). */
  private propertyNames(schema: Obj, where: string): Obj {
    if (!has(schema, "propertyNames")) return schema;
    if (isObject(schema.propertyNames) && !Object.keys(schema.propertyNames).length) return without(schema, "propertyNames");
    if (!isObject(schema.propertyNames)) return schema; // false: prune allows no property
    const at = `${where}/propertyNames`;
    const names = this.deref(schema.propertyNames as Schema, at);
    let props: Obj = isObject(schema.properties) ? schema.properties : {};
    const required = ((schema.required as unknown[]) ?? []).filter((n): n is string => typeof n === "string");
    for (const name of unique_([...required, ...Object.keys(props)])) {
      if (this.nameAllowed(names, name, at)) continue;
      if (required.includes(name)) {
        throw new Contradiction(`schema keyword 'propertyNames' at ${where}: the required name '${name}' is not an allowed name`);
      }
      props = without(props, name);
    }
    const rest = without(schema, "propertyNames");
    if (has(schema, "properties")) rest.properties = props;
    const values = has(schema, "additionalProperties") ? schema.additionalProperties : true;
    const patterns = isObject(schema.patternProperties) && Object.keys(schema.patternProperties).length > 0;
    const listedAny = Object.keys(props).length > 0;
    if ((values === false || listedAny || required.length) && !patterns) return rest; // only listed names are generated
    if (!patterns && isEmpty(values) && !listedAny) return schema; // names alone: xgrammar enforces them exactly
    const listed = this.nameList(names, at);
    if (listed !== null) {
      const out = without(rest, "patternProperties");
      const own = Object.fromEntries(
        Object.entries(props).map(([n, sub]) => [n, this.withPatterns(schema, n, sub as Schema, where)]),
      );
      const more = Object.fromEntries(listed.filter((n) => !has(props, n)).map((n) => [n, this.propertySchema(schema, n)]));
      return { ...out, properties: { ...own, ...more }, additionalProperties: false };
    }
    const pattern = isObject(names) ? names.pattern : undefined;
    if (
      !patterns &&
      isObject(names) &&
      Object.keys(names).every((k) => k === "type" || k === "pattern") &&
      (names.type ?? "string") === "string" &&
      typeof pattern === "string"
    ) {
      try {
        strings.checkPlainPattern(pattern);
      } catch (err) {
        if (!(err instanceof strings.PatternError)) throw err;
        throw new SchemaError(
          `schema keyword 'propertyNames' at ${where}: pattern '${pattern}' beside additionalProperties: ${err.message}`,
        );
      }
      return { ...rest, patternProperties: { [pattern]: values === true ? {} : values }, additionalProperties: false };
    }
    throw new SchemaError(
      `schema keyword 'propertyNames' at ${where}: names it allows beside a schema for their values ` +
        "(additionalProperties or patternProperties) are enforced only as a list of names or one pattern",
    );
  }

  /** A listed property's schema with the patternProperties its name matches merged in. */
  private withPatterns(schema: Obj, name: string, sub: Schema, where: string): Schema {
    for (const [pattern, extra] of Object.entries(isObject(schema.patternProperties) ? schema.patternProperties : {})) {
      if (search(pattern, name)) sub = this.tryMerge(sub, extra as Schema, `${where}/properties/${name}`);
    }
    return sub;
  }

  /** Whether the propertyNames schema `names` allows `name`; SchemaError where it cannot tell. */
  private nameAllowed(names: Schema, name: string, where: string): boolean {
    names = this.deref(names, where);
    if (typeof names === "boolean") return names;
    const known = ["type", "enum", "const", "pattern", "minLength", "maxLength", "anyOf", "oneOf", "not"];
    const unknown = Object.keys(names)
      .filter((k) => !known.includes(k))
      .sort();
    if (unknown.length) {
      throw new SchemaError(`schema keyword 'propertyNames' at ${where}: cannot check a name against keyword '${unknown[0]}'`);
    }
    const types = typesOf(names);
    const length = [...name].length;
    return (
      (types === null || types.includes("string")) &&
      (!has(names, "enum") || (names.enum as unknown[]).includes(name)) &&
      (!has(names, "const") || names.const === name) &&
      (!has(names, "pattern") || search(names.pattern as string, name)) &&
      length >= ((names.minLength as number) ?? 0) &&
      (!has(names, "maxLength") || length <= (names.maxLength as number)) &&
      (!has(names, "anyOf") || (names.anyOf as Schema[]).some((b) => this.nameAllowed(b, name, where))) &&
      (!has(names, "oneOf") || (names.oneOf as Schema[]).filter((b) => this.nameAllowed(b, name, where)).length === 1) &&
      (!has(names, "not") || !this.nameAllowed(names.not as Schema, name, where))
    );
  }

  /** Every name the propertyNames schema `names` allows where they are finitely many; null for a pattern's names. */
  private nameList(names: Schema, where: string): string[] | null {
    const candidates = (node: Schema): unknown[] | null => {
      node = this.deref(node, where);
      if (!isObject(node)) return null;
      if (has(node, "const")) return [node.const];
      if (has(node, "enum")) return [...(node.enum as unknown[])];
      const branches = ((node.anyOf as Schema[] | undefined)?.length ? node.anyOf : node.oneOf) as Schema[] | undefined;
      if (branches?.length) {
        const found = branches.map(candidates);
        return found.some((f) => f === null) ? null : found.flatMap((f) => f!);
      }
      return null;
    };
    const found = candidates(names);
    if (found === null) return null;
    const listed = unique_(found.filter((n): n is string => typeof n === "string")).filter((n) =>
      this.nameAllowed(names, n, where),
    );
    if (listed.length > MAX_NAMES) {
      throw new SchemaError(
        `schema keyword 'propertyNames' at ${where}: allows ${listed.length} names beside a schema ` +
          `for their values, over the limit of ${MAX_NAMES}`,
      );
    }
    return listed;
  }

  /** Each pattern's schema merged with those of the patterns its names may contain (the twin's overlapping_patterns). */
  private overlappingPatterns(schema: Obj, where: string): Obj {
    const patterns = schema.patternProperties;
    if (!isObject(patterns) || Object.keys(patterns).length < 2) return schema;
    const out: Obj = {};
    for (const [p, own] of Object.entries(patterns)) {
      let sub = own as Schema;
      for (const [q, other] of Object.entries(patterns)) {
        if (q !== p && sub !== false && !same(sub, other) && strings.patternsOverlap(p, q)) {
          sub = this.tryMerge(sub, other as Schema, `${where}/patternProperties/${p}`);
        }
      }
      if (sub === false) this.warn("did not generate names of a pattern that other patterns' schemas contradict", where);
      else out[p] = sub;
    }
    return Object.keys(out).length ? { ...schema, patternProperties: out } : without(schema, "patternProperties");
  }

  private listedProperties(schema: Obj, where: string): Obj {
    schema = this.overlappingPatterns(this.onlyListed(schema, where), where);
    let props = schema.properties;
    const required = (schema.required as unknown[]) ?? [];
    const extra = has(schema, "additionalProperties") ? schema.additionalProperties : true;
    const missing = required.filter((n) => typeof n === "string" && !has(isObject(props) ? props : {}, n)) as string[];
    if (missing.length && extra === false && !has(schema, "patternProperties")) {
      throw new Contradiction(
        `schema keyword 'required' at ${where}: '${missing[0]}' is required but not in properties, and additionalProperties is false`,
      );
    }
    if (missing.length && extra !== false) {
      const listed: Obj = { ...((props as Obj) ?? {}) };
      for (const name of missing) listed[name] = this.propertySchema(schema, name);
      props = listed;
      schema = { ...schema, properties: listed };
    }
    if (isObject(props) && Object.keys(props).length && extra !== false && !has(schema, "patternProperties")) {
      if (has(schema, "additionalProperties")) this.warn("generated only listed properties beside additionalProperties", where);
      schema = { ...schema, additionalProperties: false };
    }
    if (
      !(isObject(props) && Object.keys(props).length) &&
      !has(schema, "additionalProperties") &&
      !has(schema, "patternProperties") &&
      (has(schema, "minProperties") || has(schema, "maxProperties"))
    ) {
      schema = { ...schema, additionalProperties: {} }; // xgrammar reads none as none at all when it counts
    }
    // the names an object can have (a false property only stays listed to be refused)
    const possible = Object.entries((schema.properties as Obj) ?? {}).filter(([, sub]) => sub !== false).length;
    if (
      schema.additionalProperties === false &&
      !has(schema, "patternProperties") &&
      typeof schema.minProperties === "number" &&
      schema.minProperties > possible
    ) {
      throw new Contradiction(
        `schema keyword 'minProperties' at ${where}: ${schema.minProperties} properties are required and fewer are allowed`,
      );
    }
    if (
      typeof schema.minProperties === "number" &&
      Number.isInteger(schema.minProperties) &&
      schema.minProperties <= new Set(required).size
    ) {
      schema = without(schema, "minProperties");
    }
    if (
      schema.additionalProperties === false &&
      !has(schema, "patternProperties") &&
      typeof schema.maxProperties === "number" &&
      Number.isInteger(schema.maxProperties) &&
      schema.maxProperties >= possible
    ) {
      schema = without(schema, "maxProperties");
    }
    for (const [name, sub] of Object.entries((schema.properties as Obj) ?? {})) {
      if (sub === false && !required.includes(name)) schema = { ...schema, properties: without(schema.properties as Obj, name) };
    }
    return schema;
  }

  // ---- $refs into dropped keywords ---------------------------------------------------------------

  /** `root` with every $ref pointing into it: a target under a dropped keyword is copied, normalized, into $defs. */
  relocate(root: Schema): Schema {
    if (!isObject(root)) return root;
    const moved = new Map<string, string>();
    const home = has(root, "definitions") ? "definitions" : "$defs";
    for (;;) {
      const lost = unique_(refsIn(root)).filter((r) => !moved.has(r) && jsonPointer(root, r) === undefined);
      if (!lost.length) return root;
      const defs: Obj = { ...((root[home] as Obj) ?? {}) };
      for (const ref of lost) {
        const name = `lantern_ref_${moved.size}`;
        moved.set(ref, `#/${home}/${name}`);
        defs[name] = this.resolve(ref, this.where);
      }
      root = withRefs({ ...root, [home]: defs }, moved) as Obj;
    }
  }

  // ---- false subschemas --------------------------------------------------------------------------

  pruneAll(root: Schema): Schema {
    let out: Schema;
    for (;;) {
      out = this.prune(root);
      const found = new Set<string>();
      if (isObject(out)) {
        for (const key of DEFS)
          for (const [name, sub] of Object.entries((out[key] as Obj) ?? {})) if (sub === false) found.add(`#/${key}/${name}`);
      }
      if ([...found].every((r) => this.falseRefs.has(r))) break;
      this.falseRefs = new Set([...this.falseRefs, ...found]);
    }
    if (isObject(out)) {
      for (const key of DEFS)
        if (isObject(out[key])) out[key] = Object.fromEntries(Object.entries(out[key] as Obj).filter(([, v]) => v !== false));
    }
    return out;
  }

  private prune(node: Schema): Schema {
    if (!isObject(node)) return node;
    if (typeof node.$ref === "string" && this.falseRefs.has(node.$ref)) return false;
    let out: Obj = { ...node };
    for (const key of DEFS) {
      if (isObject(out[key]))
        out[key] = Object.fromEntries(Object.entries(out[key] as Obj).map(([k, v]) => [k, this.prune(v as Schema)]));
    }
    if (isObject(out.properties)) {
      const props: Obj = {};
      for (const [name, raw] of Object.entries(out.properties)) {
        const sub = this.prune(raw as Schema);
        if (sub === false && ((out.required as unknown[]) ?? []).includes(name)) return false;
        if (sub !== false) props[name] = sub;
      }
      out.properties = props;
    }
    if (isObject(out.patternProperties)) {
      const pats = Object.fromEntries(Object.entries(out.patternProperties).map(([k, v]) => [k, this.prune(v as Schema)]));
      if (Object.values(pats).some((v) => v === false)) out.additionalProperties = false;
      out.patternProperties = Object.fromEntries(Object.entries(pats).filter(([, v]) => v !== false));
      if (!Object.keys(out.patternProperties as Obj).length) delete out.patternProperties;
    }
    for (const key of ["anyOf", "oneOf"]) {
      if (Array.isArray(out[key])) {
        const kept = (out[key] as Schema[]).map((b) => this.prune(b)).filter((b) => b !== false);
        if (!kept.length) return false;
        out[key] = kept;
      }
    }
    if (Array.isArray(out.prefixItems)) {
      let items = (out.prefixItems as Schema[]).map((v) => this.prune(v));
      const end = items.indexOf(false);
      if (end >= 0) {
        if (((out.minItems as number) ?? 0) > end) return false;
        items = items.slice(0, end);
        out.maxItems = Math.min(has(out, "maxItems") ? (out.maxItems as number) : end, end);
      }
      out.prefixItems = items;
    }
    for (const key of ["items", "additionalProperties", "propertyNames", "unevaluatedItems", "unevaluatedProperties"]) {
      if (isObject(out[key])) out[key] = this.prune(out[key] as Schema);
    }
    if (out.items === false && ((out.minItems as number) ?? 0) > ((out.prefixItems as unknown[]) ?? []).length) return false;
    if (out.propertyNames === false) out = { ...without(out, "propertyNames"), maxProperties: 0 };
    return out;
  }
}

function refsIn(node: unknown): string[] {
  if (Array.isArray(node)) return node.flatMap(refsIn);
  if (!isObject(node)) return [];
  const own = typeof node.$ref === "string" ? [node.$ref] : [];
  return [
    ...own,
    ...Object.entries(node)
      .filter(([k]) => k !== "enum" && k !== "const")
      .flatMap(([, v]) => refsIn(v)),
  ];
}

function withRefs(node: unknown, moved: Map<string, string>): unknown {
  if (Array.isArray(node)) return node.map((v) => withRefs(v, moved));
  if (!isObject(node)) return node;
  return Object.fromEntries(
    Object.entries(node).map(([k, v]) => [
      k,
      k === "$ref" && typeof v === "string" ? (moved.get(v) ?? v) : k === "enum" || k === "const" ? v : withRefs(v, moved),
    ]),
  );
}

/** `schema` in Lantern's dialect (the header says what each step does) and the warnings for what it ignored. */
export function normalize(schema: unknown, where = "#"): [Schema, string[]] {
  const n = new Normalizer(schema, where);
  const out = n.pruneAll(n.close(n.relocate(n.node(schema, where)), where));
  if (out === false) throw n.contradiction ?? new Contradiction(`schema at ${where}: no value satisfies it`);
  return [out, n.warnings()];
}
