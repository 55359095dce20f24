"""Real-world JSON Schemas, rewritten into the one dialect Lantern's grammar checks read.

Schemas arrive in every draft (04 to 2020-12), with vendor keywords and annotations, and with
`allOf`, `not` and conditionals that xgrammar does not enforce. ``normalize`` returns a schema of the
same meaning in Draft 2020-12 with only the keywords schema_support.json lists, plus the warnings a
user should see (what was ignored); or StructuredOutputError naming what it cannot rewrite exactly.
structured.check_schema then checks and lowers the result as before.

What it does, node by node (bottom-up):
- drafts: `dependencies` becomes dependentRequired / dependentSchemas, array-form `items` with
  `additionalItems` becomes prefixItems / items, boolean exclusiveMinimum / exclusiveMaximum become
  numbers; `$ref` siblings apply (draft-04/06/07 say to ignore them, jsonschema does, ajv does not:
  applied, the answer is valid for both, and a warning says so);
- annotations (schema_support.json's `annotations`) are dropped; keywords in `refused` are refused by
  name; any other keyword is unknown, so an annotation as JSON Schema says: dropped, with a warning;
- `allOf` (and a `$ref` with siblings) is merged into one schema: properties and required unioned,
  bounds and lengths tightened, types and enums intersected, subschemas merged recursively, `$ref`s
  resolved first; a subschema no value satisfies becomes `false` where it stands (a contradiction),
  and only a schema false as a whole is refused, naming its first contradiction;
- `not` of a type, of one required name, or of listed values (an enum, booleans, null);
  dependentRequired and dependentSchemas and if/then/else (only with a one-name `required`
  condition) become a choice of branches;
- ajv-formats' number formats (int32, int64, float, double) become the bounds they check, and
  patternProperties every name matches (".*") apply to listed and unlisted properties;
- a node's own keywords beside anyOf / oneOf are merged into each branch (xgrammar reads either the
  branches or the node, not both); a branch that contradicts them is dropped;
- once all is merged (close): a required property that `properties` does not list is listed, with the
  value additionalProperties or a matching patternProperties allows (xgrammar allows no unlisted
  property); listed properties with additionalProperties true or a schema: unlisted properties are not
  generated (xgrammar would let a listed name through again with any value), with a warning;
  uniqueItems over items the grammar cannot list: at most one item, with a warning; propertyNames
  beside properties, additionalProperties or patternProperties (xgrammar then enforces the names and
  no value) checked on the listed names and dropped where only listed names are generated, listed
  out where it allows a list of names, turned into patternProperties where it is one pattern, else
  refused;
- false subschemas are removed where xgrammar refuses them (prune), and $refs into dropped keywords
  are pointed at copies in $defs (relocate).

The browser twin is webruntime/src/normalize.ts; tests/test_schema_normalize.py holds the two equal.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TypeGuard

from ..errors import LanternError
from . import string_grammar, unique_grammar

SUPPORT = json.loads((Path(__file__).with_name("schema_support.json")).read_text())
KEYWORDS = set(SUPPORT["keywords"])
ANNOTATIONS = set(SUPPORT["annotations"])
REFUSED = set(SUPPORT["refused"])
ENFORCED_FORMATS = set(SUPPORT["formats"]) | set(SUPPORT["format_patterns"])
VALIDATOR_FORMATS = set(SUPPORT["validator_formats"])
MAX_BRANCHES = SUPPORT["normalize_limits"]["branches"]
MAX_NODES = SUPPORT["normalize_limits"]["nodes"]
MAX_NAMES = SUPPORT["normalize_limits"]["names"]
FORMAT_NUMBERS = SUPPORT["format_numbers"]
MAX_DEPTH = 64
ANY_NAME = ("", ".*", "^.*", "^")  # patterns every property name matches


class SchemaError(LanternError):
    """A schema Lantern cannot rewrite exactly; structured.py turns it into StructuredOutputError."""


class Contradiction(SchemaError):
    """Parts of a schema that no value satisfies together (a branch with it is dropped; a whole schema
    with it is refused)."""


_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_ONE = (
    "items",
    "additionalProperties",
    "unevaluatedProperties",
    "unevaluatedItems",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
)
_DRAFTS = {"draft-04": 4, "draft-06": 6, "draft-07": 7, "2019-09": 2019, "2020-12": 2020}
_NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_SCALARS = ("string", "number", "integer", "boolean", "null")
_TYPES = (*_SCALARS, "array", "object")


def draft_of(schema) -> int | None:
    """The draft a root schema's `$schema` names (4, 6, 7, 2019, 2020), or None."""
    uri = schema.get("$schema") if isinstance(schema, dict) else None
    if isinstance(uri, str):
        for name, draft in _DRAFTS.items():
            if name in uri:
                return draft
    return None


def _type_of(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names[type(value)]


def _types(schema: dict) -> list | None:
    t = schema.get("type")
    return [t] if isinstance(t, str) else list(t) if isinstance(t, list) else None


def _canon(value):
    """``value`` with integral floats as integers, so equal JSON values dump alike (1 and 1.0 too, 2**53 and
    2.0**53: JavaScript reads both as one number)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_canon(v) for v in value]
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in value.items()}
    return value


def _same(a, b) -> bool:
    """JSON equality: 1 == 1.0, but True != 1 (the twin's `same`)."""
    return json.dumps(_canon(a), sort_keys=True) == json.dumps(_canon(b), sort_keys=True)


def _number(value) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _json_pointer(root, ref: str):
    node = root
    for part in ref[2:].split("/") if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


class _Normalizer:
    def __init__(self, root, where: str):
        self.root, self.where = root, where
        self.draft = draft_of(root)
        self.ignored: dict[str, list[str]] = {}  # what was ignored -> the places
        self.refs: dict[str, object] = {}  # normalized targets of $refs, for merges
        self.resolving: list[str] = []
        self.contradiction: Contradiction | None = None  # the first, for a schema that is false as a whole
        self.false_refs: set[str] = set()
        self.merging: list[str] = []
        self.nodes = 0

    def warn(self, what: str, where: str) -> None:
        places = self.ignored.setdefault(what, [])
        if where not in places:
            places.append(where)

    def warnings(self) -> list[str]:
        return [
            f"{what} at {places[0]}" + (f" and {len(places) - 1} more places" if len(places) > 1 else "")
            for what, places in self.ignored.items()
        ]

    # ---- one node ---------------------------------------------------------------------------

    def node(self, schema, where: str):
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise SchemaError(f"schema at {self.where}: more than {MAX_NODES} subschemas after resolving allOf and $ref")
        if isinstance(schema, bool):
            return schema
        if not isinstance(schema, dict):
            raise SchemaError(f"schema at {where} must be an object or a boolean, not {_type_of(schema)}")
        schema = self.draft_spellings(schema, where)
        for t in [schema["type"]] if isinstance(schema.get("type"), str) else schema.get("type") or []:
            if t not in _TYPES:
                raise SchemaError(
                    f"schema keyword 'type' at {where}: {json.dumps(t)} is not a JSON Schema type ({', '.join(_TYPES)})"
                )
        out, doubled = {}, None
        for key, value in schema.items():
            if key == "not" and isinstance(value, dict) and set(value) - ANNOTATIONS == {"not"}:
                doubled = self.node(value["not"], f"{where}/not/not")  # a double negation: its schema, merged below
                continue
            if key in REFUSED:
                raise SchemaError(f"schema keyword '{key}' at {where} is not supported: Lantern cannot enforce it in a grammar")
            if key in ANNOTATIONS:
                continue
            if key not in KEYWORDS:
                self.warn(f"ignored the unknown keyword '{key}'", where)
                continue
            if key == "format":
                if isinstance(value, str) and value not in ENFORCED_FORMATS and value not in VALIDATOR_FORMATS:
                    self.warn(f"ignored format '{value}' (no validator checks it)", where)
                    continue
            out[key] = self.children(key, value, where)
        if "allOf" in out and not (isinstance(out["allOf"], list) and out["allOf"]):
            raise SchemaError(f"schema keyword 'allOf' at {where} must be a non-empty list of schemas")
        try:
            if "$ref" in out:
                out = self.ref_siblings(out, where)
                if out is False:
                    return False
            for i, part in enumerate(out.pop("allOf", None) or []):
                out = self.merge(out, part, f"{where}/allOf/{i}")
                if out is False:
                    return False
            if doubled is not None:
                out = self.merge(out, doubled, f"{where}/not/not")
                if out is False:
                    return False
            return self.finish(out, where)
        except Contradiction as err:  # no value satisfies this node: it is `false` where it stands
            self.contradiction = self.contradiction or err
            return False

    def finish(self, schema, where: str):
        """The rewrites after a node's parts are merged: conditionals, not, anyOf/oneOf, values of a type,
        properties."""
        if schema is False or schema is True:
            return schema
        schema = self.conditionals(dict(schema), where)  # a copy: the rewrites below pop keywords
        if schema is not False and "not" in schema:
            schema = self.negation(schema, where)
        if schema is not False:
            schema = self.distribute(schema, where)
        if isinstance(schema, dict):
            schema = self.number_format(self.any_name_pattern(self.typed_values(schema, where), where), where)
        if isinstance(schema, dict) and schema.get("minItems") and not {"items", "prefixItems"} & set(schema):
            schema = {**schema, "items": {}}  # xgrammar reads no `items` as no items at all
        return schema

    def close(self, schema, where: str):
        """The restrictions a grammar needs, once everything is merged (applied earlier, they would change
        what a merge means): required names listed, unlisted properties not generated beside listed ones,
        uniqueItems over unlistable items as at most one item. A node no value satisfies becomes false."""
        if not isinstance(schema, dict):
            return schema
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key in _MAPS and isinstance(value, dict):
                out[key] = {k: self.close(v, f"{where}/{key}/{k}") for k, v in value.items()}
            elif key in _LISTS and isinstance(value, list):
                out[key] = [self.close(v, f"{where}/{key}/{i}") for i, v in enumerate(value)]
            elif key in _ONE:
                out[key] = self.close(value, f"{where}/{key}")
            else:
                out[key] = value
        try:
            if out.get("uniqueItems") is True:
                out = self.unique_items(out, where)
            return self.listed_properties(self.property_names(out, where), where)
        except Contradiction as err:
            self.contradiction = self.contradiction or err
            return False

    def typed_values(self, schema: dict, where: str) -> dict:
        """xgrammar generates every value of an enum or const whatever `type` says beside it (`"x"` for
        an enum of "x" and 1 of type integer): the values of other types are dropped."""
        types = _types(schema)
        if types is None or not ("enum" in schema or "const" in schema) or not isinstance(schema.get("enum", []), list):
            return schema
        values = self.values(schema)
        kept = [v for v in values if any(_type_of(v) == t or (t == "number" and _type_of(v) == "integer") for t in types)]
        if not kept:
            key = "enum" if "enum" in schema else "const"
            raise Contradiction(f"schema keyword '{key}' at {where}: no value is of the type {json.dumps(schema['type'])}")
        return schema if len(kept) == len(values) else {**schema, "enum": kept}  # (a const is kept or refused)

    def number_format(self, schema: dict, where: str):
        """ajv-formats' number formats (int32, int64, float, double) as the bounds they check; on a
        schema of other types they check nothing."""
        fmt = schema.get("format")
        lowered = FORMAT_NUMBERS.get(fmt) if isinstance(fmt, str) else None
        types = _types(schema)
        if lowered is None or not types:
            return schema
        rest = {k: v for k, v in schema.items() if k != "format"}
        if not any(t in ("number", "integer") for t in types):
            return rest
        numeric = [t for t in types if t in ("number", "integer")]
        if len(numeric) == len(types):
            return self.merge(rest, lowered, where)
        others = [t for t in types if t not in numeric]  # the format checks nothing on these
        other = {k: v for k, v in rest.items() if k not in _NUMBER_KEYWORDS}
        return {
            "anyOf": [
                self.merge({**rest, "type": numeric if len(numeric) > 1 else numeric[0]}, lowered, where),
                {**other, "type": others if len(others) > 1 else others[0]},
            ]
        }

    def unique_items(self, schema: dict, where: str) -> dict:
        """uniqueItems over items the grammar cannot list (strings, objects): at most one item, which is
        always unique; a $ref to listed items followed."""
        items = schema.get("items")
        if isinstance(items, dict) and "$ref" in items and items["$ref"] not in self.resolving:
            items = self.deref(items, where)
        try:
            unique_grammar.item_values(items)
            return {**schema, "items": items} if "items" in schema else schema
        except unique_grammar.UniqueItemsError:
            if "prefixItems" in schema or schema.get("minItems", 0) > 1:
                return schema  # refused by name later
        self.warn("generated at most one item for uniqueItems over items that cannot be listed", where)
        return {**{k: v for k, v in schema.items() if k != "uniqueItems"}, "maxItems": min(schema.get("maxItems", 1), 1)}

    def any_name_pattern(self, schema: dict, where: str):
        """patternProperties whose pattern every name matches (".*"): its schema holds for listed and
        unlisted properties alike."""
        pats = schema.get("patternProperties")
        if not isinstance(pats, dict) or not any(p in ANY_NAME for p in pats):
            return schema
        out = {**schema, "patternProperties": {p: v for p, v in pats.items() if p not in ANY_NAME}}
        if not out["patternProperties"]:
            del out["patternProperties"]
        for p in (p for p in pats if p in ANY_NAME):
            props = {n: self.try_merge(v, pats[p], f"{where}/properties/{n}") for n, v in (out.get("properties") or {}).items()}
            if props:
                out["properties"] = props
            out["additionalProperties"] = self.try_merge(
                out.get("additionalProperties", True), pats[p], f"{where}/patternProperties/{p}"
            )
        return out

    def children(self, key: str, value, where: str):
        """A keyword's value with its subschemas normalized."""
        if key in _MAPS and isinstance(value, dict):
            return {k: self.node(v, f"{where}/{key}/{k}") for k, v in value.items()}
        if key in _LISTS and isinstance(value, list):
            return [self.node(v, f"{where}/{key}/{i}") for i, v in enumerate(value)]
        if key in _ONE:
            return self.node(value, f"{where}/{key}")
        return value

    def draft_spellings(self, schema: dict, where: str) -> dict:
        """Draft-04/06/07/2019-09 spellings in their 2020-12 meaning."""
        s = dict(schema)
        if "dependencies" in s:
            deps = s.pop("dependencies")
            if not isinstance(deps, dict):
                raise SchemaError(f"schema keyword 'dependencies' at {where} must be an object")
            for name, dep in deps.items():
                target = "dependentRequired" if isinstance(dep, list) else "dependentSchemas"
                s.setdefault(target, {})
                if name in s[target]:
                    raise SchemaError(f"schema keywords 'dependencies' and '{target}' at {where} both name '{name}'")
                s[target] = {**s[target], name: dep}
        if isinstance(s.get("items"), list):  # draft-04 to 2019-09: a tuple
            if "prefixItems" in s:
                raise SchemaError(f"schema keywords 'items' (a list) and 'prefixItems' at {where} conflict")
            s["prefixItems"] = s.pop("items")
            if "additionalItems" in s:
                s["items"] = s.pop("additionalItems")
        elif "additionalItems" in s:
            del s["additionalItems"]  # ignored unless items is a list, in every draft that has it
        for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if isinstance(s.get(exclusive), bool):  # draft-04: a flag on minimum / maximum
                if s.pop(exclusive) and bound in s:
                    s[exclusive] = s.pop(bound)
        if isinstance(s.get("id"), str):  # draft-04's $id
            s.pop("id")
        if "definitions" in s and "$defs" in s:
            raise SchemaError(f"schema at {where} has both 'definitions' and '$defs': use one")
        return s

    def ref_siblings(self, schema: dict, where: str):
        """Keywords beside $ref applied with it (as allOf). Draft-04/06/07 say to ignore them, and
        jsonschema does, but ajv applies them: the answer holds under both readings."""
        rest = {k: v for k, v in schema.items() if k not in ("$ref", "$defs", "definitions")}
        keep = {k: v for k, v in schema.items() if k in ("$ref", "$defs", "definitions")}
        if not rest:
            return schema
        if self.draft is not None and self.draft <= 7:
            self.warn(
                f"applied {', '.join(repr(k) for k in rest)} beside '$ref', which draft-0{self.draft} ignores (ajv applies them)",
                where,
            )
        target = self.resolve(schema["$ref"], where)
        merged = self.merge(rest, target, where)
        return merged if merged is False else {**{k: v for k, v in keep.items() if k != "$ref"}, **merged}

    # ---- $ref ------------------------------------------------------------------------------

    def resolve(self, ref, where: str):
        """The normalized schema a local $ref points to."""
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise SchemaError(f"schema keyword '$ref' at {where}: only local references (#/...) are supported")
        if ref in self.refs:
            return self.refs[ref]
        if ref in self.resolving:
            raise SchemaError(
                f"schema keyword '$ref' at {where}: '{ref}' refers to itself through allOf or a "
                "$ref with siblings, which cannot be merged"
            )
        target = _json_pointer(self.root, ref)
        if target is None:
            raise SchemaError(f"schema keyword '$ref' at {where}: '{ref}' points to nothing")
        self.resolving.append(ref)
        try:
            self.refs[ref] = self.node(target, ref)
        finally:
            self.resolving.pop()
        return self.refs[ref]

    def deref(self, schema, where: str):
        """A normalized node's $ref followed (such a node holds $ref alone, or with the $defs it carries)."""
        while isinstance(schema, dict) and "$ref" in schema and not set(schema) - {"$ref", "$defs", "definitions"}:
            schema = self.resolve(schema["$ref"], where)
        return schema

    # ---- allOf --------------------------------------------------------------------------------

    def merge(self, a, b, where: str):
        """One schema that holds exactly where both hold (False where none can)."""
        if a is True or a == {}:
            return b
        if b is True or b == {}:
            return a
        if _same(a, b):  # two uses of one $ref, too: merged without following it (it may recurse)
            return a
        if len(self.merging) >= MAX_DEPTH:
            raise SchemaError(
                f"schema at {where}: allOf and $ref merge deeper than {MAX_DEPTH} levels (a recursive $ref under allOf?)"
            )
        self.merging.append(where)
        try:
            return self.merge_schemas(self.deref(a, where), self.deref(b, where), where)
        finally:
            self.merging.pop()

    def merge_schemas(self, a, b, where: str):
        if a is False or b is False:
            return False
        if a is True or b is True or _same(a, b):
            return b if a is True else a
        out = dict(a)
        for key, value in b.items():
            if key not in out:
                out[key] = value
                continue
            mine = out[key]
            numbers = _number(mine) and _number(value)
            if key == "type":
                out[key] = self.merge_types(_types(a) or [], _types(b) or [], where)
            elif key in ("enum", "const"):
                values = self.values(a) if key == "enum" else [mine]
                theirs = self.values(b) if key == "enum" else [value]
                both = [v for v in values if any(_same(v, w) for w in theirs)]
                if not both:
                    raise Contradiction(f"schema keyword '{key}' at {where}: no value is in both lists")
                out[key] = both if key == "enum" else both[0]
            elif numbers and key in ("minimum", "minLength", "minItems", "minProperties", "exclusiveMinimum"):
                out[key] = max(mine, value)
            elif numbers and key in ("maximum", "maxLength", "maxItems", "maxProperties", "exclusiveMaximum"):
                out[key] = min(mine, value)
            elif key == "required" and isinstance(mine, list) and isinstance(value, list):
                out[key] = list(dict.fromkeys([*mine, *value]))
            elif key == "uniqueItems":
                out[key] = bool(mine) or bool(value)
            elif key in ("properties", "additionalProperties", "patternProperties"):
                pass  # below, together
            elif key in ("items", "propertyNames", "unevaluatedItems", "unevaluatedProperties"):
                out[key] = self.try_merge(mine, value, f"{where}/{key}")  # false: no item, no property
            elif key in ("$defs", "definitions", "dependentSchemas") and isinstance(mine, dict) and isinstance(value, dict):
                out[key] = {**mine, **value}
            elif key == "dependentRequired" and isinstance(mine, dict) and isinstance(value, dict):
                out[key] = {k: list(dict.fromkeys([*mine.get(k, []), *value.get(k, [])])) for k in {**mine, **value}}
            elif key in ("anyOf", "oneOf") and isinstance(mine, list) and isinstance(value, list):
                out[key] = self.cross(mine, value, f"{where}/{key}")
            elif key == "prefixItems" and isinstance(mine, list) and isinstance(value, list):
                if len(mine) != len(value):
                    raise SchemaError(
                        f"schema keyword 'prefixItems' at {where}: cannot merge tuples of {len(mine)} and {len(value)} items"
                    )
                out[key] = [self.try_merge(x, y, f"{where}/prefixItems/{i}") for i, (x, y) in enumerate(zip(mine, value))]
            elif key == "multipleOf" and numbers:
                out[key] = self.merge_multiple(mine, value, where)
            elif not _same(mine, value):  # pattern, format, if/then/else...: equal or refused
                raise SchemaError(
                    f"schema keyword '{key}' at {where}: cannot merge two different values "
                    f"({json.dumps(mine, ensure_ascii=False)[:60]} and "
                    f"{json.dumps(value, ensure_ascii=False)[:60]})"
                )
        if any(k in a or k in b for k in ("properties", "additionalProperties", "patternProperties")):
            self.merge_properties(a, b, out, where)
        return self.finish(out, where)

    def values(self, schema: dict) -> list:
        return schema["enum"] if "enum" in schema else [schema["const"]] if "const" in schema else []

    def merge_types(self, a: list, b: list, where: str):
        if not a or not b:
            return a or b
        both = [t for t in a if t in b or (t == "integer" and "number" in b)]
        both += [t for t in b if t == "integer" and "number" in a and t not in both]
        if not both:
            raise Contradiction(f"schema keyword 'type' at {where}: no type is in both {a} and {b}")
        return both[0] if len(both) == 1 else both

    def merge_multiple(self, x, y, where: str):
        x, y = _canon(x), _canon(y)
        if x == y:
            return x
        big, small = (x, y) if x >= y else (y, x)
        if isinstance(big, int) and isinstance(small, int) and big % small == 0:
            return big
        raise SchemaError(f"schema keyword 'multipleOf' at {where}: cannot merge multipleOf {x} and {y}")

    def cross(self, xs: list, ys: list, where: str) -> list:
        if len(xs) * len(ys) > MAX_BRANCHES:
            raise SchemaError(f"schema at {where}: merging gives {len(xs) * len(ys)} branches, over the limit of {MAX_BRANCHES}")
        out = [m for x in xs for y in ys if (m := self.try_merge(x, y, where)) is not False]
        if not out:
            raise Contradiction(f"schema at {where}: no branch holds with the other's")
        return out

    def try_merge(self, x, y, where: str):
        try:
            return self.merge(x, y, where)
        except Contradiction:
            return False  # that combination admits no value

    def property_schema(self, schema: dict, name: str):
        """What `schema` allows for a property ``name`` (JSON Schema's meaning: unlisted is allowed)."""
        if name in (schema.get("properties") or {}):
            return schema["properties"][name]
        matched = [s for p, s in (schema.get("patternProperties") or {}).items() if _search(p, name)]
        if matched:
            out = True
            for s in matched:
                out = self.merge(out, s, "#")
            return out
        extra = schema.get("additionalProperties", True)
        return {} if extra is True else extra

    def merge_properties(self, a: dict, b: dict, out: dict, where: str) -> None:
        if "patternProperties" in a and "patternProperties" in b and not _same(a["patternProperties"], b["patternProperties"]):
            raise SchemaError(f"schema keyword 'patternProperties' at {where}: cannot merge two different values")
        names = list(dict.fromkeys([*(a.get("properties") or {}), *(b.get("properties") or {})]))
        props = {}
        for name in names:
            merged = self.try_merge(self.property_schema(a, name), self.property_schema(b, name), f"{where}/properties/{name}")
            if merged is False:
                if name in out.get("required", []):
                    raise Contradiction(
                        f"schema keyword 'required' at {where}: '{name}' is required but no value of it holds in every allOf part"
                    )
                merged = False
            props[name] = merged
        if props:
            out["properties"] = props
        extra_a, extra_b = a.get("additionalProperties", True), b.get("additionalProperties", True)
        extra = self.try_merge(extra_a, extra_b, f"{where}/additionalProperties")
        if extra is True:
            out.pop("additionalProperties", None)
        else:
            out["additionalProperties"] = extra

    # ---- not, conditionals ---------------------------------------------------------------------

    def negation(self, schema: dict, where: str):
        """`not` where a grammar is exact: of a type, of required names (an object lacking one of them), of
        scalar values beside scalar types, and of anyOf (each negated) or allOf (one of them negated: a
        branch each) of those. (A `not` of a `not` is merged as its schema, in ``node``.)"""
        neg = self.deref(schema.pop("not"), f"{where}/not")
        if neg is False:
            return schema
        if neg is True or neg == {}:
            return False
        keys = set(neg) - ANNOTATIONS
        if keys == {"type"}:
            banned = _types(neg) or []
            allowed = [
                t
                for t in (_types(schema) or ["string", "number", "integer", "boolean", "null", "array", "object"])
                if t not in banned and not (t == "integer" and "number" in banned)
            ]
            if "number" in (_types(schema) or ["number"]) and "integer" in banned and "number" not in banned:
                raise SchemaError(f"schema keyword 'not' at {where}: a number that is not an integer cannot be written exactly")
            if not allowed:
                return False
            return {**schema, "type": allowed[0] if len(allowed) == 1 else allowed}
        if keys == {"required"} and isinstance(neg["required"], list):
            # only an object can lack a required name (on any other value `required` holds)
            types = _types(schema)
            if types is not None and "object" not in types:
                return False
            schema = {**schema, "type": "object"}
            absent = [n for n in dict.fromkeys(neg["required"]) if n not in (schema.get("required") or [])]
            if not absent:
                return False
            return self.choose(schema, [{"properties": {name: False}} for name in absent], where)  # one absent
        if keys == {"anyOf"} and isinstance(neg["anyOf"], list):  # none of them: each negated
            for i, part in enumerate(neg["anyOf"]):
                schema = self.negation({**schema, "not": part}, f"{where}/not/anyOf/{i}")
                if schema is False:
                    return False
            return schema
        if keys == {"allOf"} and isinstance(neg["allOf"], list) and neg["allOf"]:  # one of them fails
            branches = [
                b
                for i, part in enumerate(neg["allOf"])
                if (b := self.negation({"not": part}, f"{where}/not/allOf/{i}")) is not False
            ]
            if not branches:
                return False
            if {} in branches:  # a part whose negation always holds
                return schema
            return self.choose(schema, branches, where)
        if keys in ({"enum"}, {"const"}):
            banned = self.values(neg)
            if "enum" in schema or "const" in schema:
                kept = [v for v in self.values(schema) if not any(_same(v, w) for w in banned)]
                if not kept:
                    return False
                rest = {k: v for k, v in schema.items() if k not in ("enum", "const")}
                return {**rest, "enum": kept}
            if _types(schema) == ["boolean"]:
                kept = [v for v in (True, False) if not any(_same(v, w) for w in banned)]
                return {**schema, "enum": kept} if kept else False
            if _types(schema) == ["null"]:
                return False if any(w is None for w in banned) else schema
        raise SchemaError(
            f"schema keyword 'not' at {where}: only 'not' of a type, of required names, of values of a "
            "boolean or listed type, or of anyOf or allOf of those is supported"
        )

    def conditionals(self, schema: dict, where: str):
        """dependentRequired, dependentSchemas and if/then/else as a choice of branches (anyOf)."""
        branches: list[list] = []
        for name, names in (schema.pop("dependentRequired", None) or {}).items():
            branches.append([{"properties": {name: False}}, {"required": [name, *names]}])
        for name, sub in (schema.pop("dependentSchemas", None) or {}).items():
            with_it = self.merge({"required": [name]}, sub, f"{where}/dependentSchemas/{name}")
            branches.append([{"properties": {name: False}}, *([with_it] if with_it is not False else [])])
        if "if" in schema:
            cond = self.deref(schema.pop("if"), f"{where}/if")
            then, other = schema.pop("then", True), schema.pop("else", True)
            if cond is True or cond == {}:
                branches.append([then])
            elif cond is False:
                branches.append([other])
            else:
                if set(cond) != {"required"} or not isinstance(cond["required"], list) or len(cond["required"]) != 1:
                    raise SchemaError(f"schema keyword 'if' at {where}: only a condition of one required name is supported")
                name = cond["required"][0]
                yes = self.merge({"required": [name]}, then, f"{where}/then")
                no = self.merge({"properties": {name: False}}, other, f"{where}/else")
                branches.append([b for b in (yes, no) if b is not False])
        else:
            for key in ("then", "else"):
                schema.pop(key, None)  # without `if` they mean nothing
        for choice in branches:
            if not choice:
                return False
            schema = self.choose(schema, choice, where)
            if schema is False:
                return False
        return schema

    def choose(self, schema: dict, branches: list, where: str):
        """``schema`` where one of ``branches`` holds too (an anyOf, crossed with any anyOf it has)."""
        return self.merge(schema, {"anyOf": branches} if len(branches) > 1 else branches[0], where)

    # ---- anyOf / oneOf, properties -----------------------------------------------------------------

    def distribute(self, schema: dict, where: str):
        """A node's own keywords merged into each anyOf / oneOf branch."""
        for key in ("anyOf", "oneOf"):
            if key not in schema:
                continue
            if not isinstance(schema[key], list) or not schema[key]:
                raise SchemaError(f"schema keyword '{key}' at {where} must be a non-empty list of schemas")
            own = {k: v for k, v in schema.items() if k not in (key, "$defs", "definitions")}
            if not own or not any(k != key for k in own):
                continue
            branches = [m for i, b in enumerate(schema[key]) if (m := self.try_merge(own, b, f"{where}/{key}/{i}")) is not False]
            if not branches:
                raise Contradiction(f"schema keyword '{key}' at {where}: no branch holds with the keywords beside it")
            schema = {**{k: v for k, v in schema.items() if k in ("$defs", "definitions")}, key: branches}
        if "anyOf" in schema and "oneOf" in schema:
            schema = {
                **{k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")},
                "anyOf": self.cross(schema.pop("anyOf"), schema.pop("oneOf"), where),
            }
        return schema

    def only_listed(self, schema: dict, where: str) -> dict:
        """xgrammar enforces no `required` beside patternProperties, counts a repeated unlisted name once
        each time for minProperties (`{"a": 1, "a": 2}` for two; a parser keeps one), and gives a listed
        name that a pattern matches either its listed schema or its pattern's, where a validator applies
        both (`{"a": 1}` for `a` listed as a string and `^[a-z]$` of integers). Where any of these
        matters, the object is generated with its listed properties only: the required names listed,
        each listed name given its patterns' schemas, patternProperties dropped, additionalProperties false."""
        required = [n for n in dict.fromkeys(schema.get("required") or []) if isinstance(n, str)]
        patterns = schema.get("patternProperties") or {}
        unlisted = schema.get("additionalProperties", True) is not False or bool(patterns)
        low = schema.get("minProperties")
        counted = _number(low) and low > len(required) + 1  # one unlisted name can always stand in for more
        matched = any(_search(p, n) for p in patterns for n in schema.get("properties") or {})
        if not ((patterns and (required or matched)) or (unlisted and counted)):
            return schema
        props = {}
        for name in dict.fromkeys([*(schema.get("properties") or {}), *required]):
            sub = self.property_schema(schema, name)
            if name in (schema.get("properties") or {}):
                sub = self.with_patterns(schema, name, sub, where)
            props[name] = sub
        self.warn(
            "generated only the listed and required properties (xgrammar enforces neither required nor "
            "listed names' schemas beside patternProperties, nor distinct names for minProperties)",
            where,
        )
        return {
            **{k: v for k, v in schema.items() if k != "patternProperties"},
            "properties": props,
            "additionalProperties": False,
        }

    def property_names(self, schema: dict, where: str) -> dict:
        """propertyNames beside the keywords that give values to names: xgrammar then generates names
        that propertyNames allows with any value, ignoring properties, additionalProperties and
        patternProperties. So the listed and required names are checked against it, and it is dropped
        where only they are generated (listed_properties closes an object with listed properties); it is
        listed out where it allows a list of names, and turned into patternProperties where it is one
        pattern; anything else is refused."""
        names = schema.get("propertyNames", True)
        if names == {}:
            return {k: v for k, v in schema.items() if k != "propertyNames"}
        if not isinstance(names, dict):
            return schema  # false: prune allows no property
        names = self.deref(names, f"{where}/propertyNames")
        props = schema["properties"] if isinstance(schema.get("properties"), dict) else {}
        required = [n for n in schema.get("required") or [] if isinstance(n, str)]
        for name in dict.fromkeys([*required, *props]):
            if not self.name_allowed(names, name, f"{where}/propertyNames"):
                if name in required:
                    raise Contradiction(
                        f"schema keyword 'propertyNames' at {where}: the required name '{name}' is not an allowed name"
                    )
                props = {k: v for k, v in props.items() if k != name}
        rest = {k: v for k, v in schema.items() if k != "propertyNames"}
        if "properties" in schema:
            rest["properties"] = props
        values = schema.get("additionalProperties", True)
        patterns = schema.get("patternProperties")
        if (values is False or props or required) and not patterns:
            return rest  # only listed names are generated
        if not patterns and values in (True, {}) and not props:
            return schema  # names alone: xgrammar enforces them exactly
        listed = self.name_list(names, f"{where}/propertyNames")
        if listed is not None:
            out = {k: v for k, v in rest.items() if k != "patternProperties"}
            out["properties"] = {
                **{n: self.with_patterns(schema, n, sub, where) for n, sub in props.items()},
                **{n: self.property_schema(schema, n) for n in listed if n not in props},
            }
            out["additionalProperties"] = False
            return out
        pattern = names.get("pattern")
        if (
            not patterns
            and set(names) <= {"type", "pattern"}
            and names.get("type", "string") == "string"
            and isinstance(pattern, str)
        ):
            try:
                string_grammar.check_plain_pattern(pattern)
            except string_grammar.PatternError as err:
                raise SchemaError(
                    f"schema keyword 'propertyNames' at {where}: pattern '{pattern}' beside additionalProperties: {err}"
                ) from None
            return {**rest, "patternProperties": {pattern: {} if values is True else values}, "additionalProperties": False}
        raise SchemaError(
            f"schema keyword 'propertyNames' at {where}: names it allows beside a schema for their "
            "values (additionalProperties or patternProperties) are enforced only as a list of names "
            "or one pattern"
        )

    def with_patterns(self, schema: dict, name: str, sub, where: str):
        """A listed property's schema with the patternProperties its name matches merged in."""
        for pattern, extra in (schema.get("patternProperties") or {}).items():
            if _search(pattern, name):
                sub = self.try_merge(sub, extra, f"{where}/properties/{name}")
        return sub

    def name_allowed(self, names, name: str, where: str) -> bool:
        """Whether the propertyNames schema ``names`` allows ``name``; SchemaError where it cannot tell."""
        names = self.deref(names, where)
        if isinstance(names, bool):
            return names
        known = {"type", "enum", "const", "pattern", "minLength", "maxLength", "anyOf", "oneOf", "not"}
        if set(names) - known:
            raise SchemaError(
                f"schema keyword 'propertyNames' at {where}: cannot check a name against keyword "
                f"'{sorted(set(names) - known)[0]}'"
            )
        types = _types(names)
        return (
            (types is None or "string" in types)
            and ("enum" not in names or name in names["enum"])
            and ("const" not in names or names["const"] == name)
            and ("pattern" not in names or _search(names["pattern"], name))
            and len(name) >= names.get("minLength", 0)
            and ("maxLength" not in names or len(name) <= names["maxLength"])
            and ("anyOf" not in names or any(self.name_allowed(b, name, where) for b in names["anyOf"]))
            and ("oneOf" not in names or sum(self.name_allowed(b, name, where) for b in names["oneOf"]) == 1)
            and ("not" not in names or not self.name_allowed(names["not"], name, where))
        )

    def name_list(self, names, where: str) -> list[str] | None:
        """Every name the propertyNames schema ``names`` allows, where they are finitely many (at most
        normalize_limits.names); None where it allows a pattern's names."""

        def candidates(node):
            node = self.deref(node, where)
            if not isinstance(node, dict):
                return None
            if "const" in node:
                return [node["const"]]
            if "enum" in node:
                return list(node["enum"])
            branches = node.get("anyOf") or node.get("oneOf")
            if branches:
                found = [candidates(b) for b in branches]
                return None if any(f is None for f in found) else [n for f in found for n in f]
            return None

        found = candidates(names)
        if found is None:
            return None
        listed = [n for n in dict.fromkeys(n for n in found if isinstance(n, str)) if self.name_allowed(names, n, where)]
        if len(listed) > MAX_NAMES:
            raise SchemaError(
                f"schema keyword 'propertyNames' at {where}: allows {len(listed)} names beside a schema "
                f"for their values, over the limit of {MAX_NAMES}"
            )
        return listed

    def overlapping_patterns(self, schema: dict, where: str) -> dict:
        """xgrammar gives a name that one pattern generates (matching it in full) that pattern's schema
        alone, where a validator also applies every other pattern found in the name (`{"ab": "x"}` for
        `^a` of integers and `^ab` of strings). So each pattern's schema is merged with those of the
        patterns its names may contain (string_grammar.patterns_overlap), and a pattern whose merge
        admits no value is not generated."""
        patterns = schema.get("patternProperties")
        if not isinstance(patterns, dict) or len(patterns) < 2:
            return schema
        out = {}
        for p, sub in patterns.items():
            for q, other in patterns.items():
                if q != p and sub is not False and not _same(sub, other) and string_grammar.patterns_overlap(p, q):
                    sub = self.try_merge(sub, other, f"{where}/patternProperties/{p}")
            if sub is False:
                self.warn("did not generate names of a pattern that other patterns' schemas contradict", where)
            else:
                out[p] = sub
        return {**schema, "patternProperties": out} if out else {k: v for k, v in schema.items() if k != "patternProperties"}

    def listed_properties(self, schema: dict, where: str) -> dict:
        """Required names listed in properties; unlisted properties not generated beside listed ones."""
        schema = self.overlapping_patterns(self.only_listed(schema, where), where)
        props = schema.get("properties")
        required = schema.get("required") or []
        extra = schema.get("additionalProperties", True)
        missing = [n for n in required if isinstance(n, str) and n not in (props if isinstance(props, dict) else {})]
        if missing and extra is False and "patternProperties" not in schema:  # (a local contradiction)
            raise Contradiction(
                f"schema keyword 'required' at {where}: '{missing[0]}' is required but not in "
                "properties, and additionalProperties is false"
            )
        if missing and extra is not False:
            props = dict(props or {})
            for name in missing:
                props[name] = self.property_schema(schema, name)
            schema = {**schema, "properties": props}
        if isinstance(props, dict) and props and extra is not False and "patternProperties" not in schema:
            if "additionalProperties" in schema:
                self.warn("generated only listed properties beside additionalProperties", where)
            schema = {**schema, "additionalProperties": False}
        if (
            not props
            and "additionalProperties" not in schema
            and "patternProperties" not in schema
            and ("minProperties" in schema or "maxProperties" in schema)
        ):
            schema = {**schema, "additionalProperties": {}}  # xgrammar reads none as none at all when it counts
        # the names an object can have (a false property only stays listed to be refused)
        possible = [n for n, sub in (schema.get("properties") or {}).items() if sub is not False]
        if (
            schema.get("additionalProperties") is False
            and "patternProperties" not in schema
            and _number(schema.get("minProperties"))
            and schema["minProperties"] > len(possible)
        ):
            raise Contradiction(
                f"schema keyword 'minProperties' at {where}: {schema['minProperties']} properties "
                "are required and fewer are allowed"
            )
        if isinstance(schema.get("minProperties"), int) and schema["minProperties"] <= len(set(required)):
            schema = {k: v for k, v in schema.items() if k != "minProperties"}  # implied: xgrammar would count
        if (
            schema.get("additionalProperties") is False
            and "patternProperties" not in schema
            and isinstance(schema.get("maxProperties"), int)
            and schema["maxProperties"] >= len(possible)
        ):
            schema = {k: v for k, v in schema.items() if k != "maxProperties"}
        for name, sub in list((schema.get("properties") or {}).items()):
            if sub is False and name not in required:
                schema = {**schema, "properties": {k: v for k, v in schema["properties"].items() if k != name}}
        return schema

    # ---- $refs into dropped keywords -----------------------------------------------------------------

    def relocate(self, root):
        """``root`` with every $ref it holds pointing into it: a target under a keyword the rewrite dropped
        (`"$ref": "#/constraints/name"`, a vendor keyword) is copied, normalized, into $defs (or the root's
        `definitions`) and the $ref pointed there."""
        if not isinstance(root, dict):
            return root
        moved: dict[str, str] = {}
        home = "definitions" if "definitions" in root else "$defs"
        while True:
            lost = [r for r in dict.fromkeys(_refs(root)) if r not in moved and _json_pointer(root, r) is None]
            if not lost:
                return root
            defs = dict(root.get(home) or {})
            for ref in lost:
                name = f"lantern_ref_{len(moved)}"
                moved[ref] = f"#/{home}/{name}"
                defs[name] = self.resolve(ref, self.where)
            root = _with_refs({**root, home: defs}, moved)

    # ---- false subschemas ------------------------------------------------------------------------

    def prune_all(self, root):
        """``root`` with no `false` subschema left where xgrammar refuses one (everywhere but items): a
        false property is dropped (its object is false when it is required), a false branch dropped, a
        false tuple item ends the tuple, a $ref to a false definition is false; to a fixpoint."""
        while True:
            out = self.prune(root)
            found = {
                f"#/{key}/{name}"
                for key in ("$defs", "definitions")
                if isinstance(out, dict)
                for name, sub in (out.get(key) or {}).items()
                if sub is False
            }
            if found <= self.false_refs:
                break
            self.false_refs |= found
        if isinstance(out, dict):
            for key in ("$defs", "definitions"):
                if isinstance(out.get(key), dict):
                    out[key] = {k: v for k, v in out[key].items() if v is not False}
        return out

    def prune(self, node):
        if not isinstance(node, dict):
            return node
        if node.get("$ref") in self.false_refs:
            return False
        out = dict(node)
        for key in ("$defs", "definitions"):
            if isinstance(out.get(key), dict):
                out[key] = {k: self.prune(v) for k, v in out[key].items()}
        if isinstance(out.get("properties"), dict):
            props = {}
            for name, sub in out["properties"].items():
                sub = self.prune(sub)
                if sub is False and name in (out.get("required") or []):
                    return False
                if sub is not False:
                    props[name] = sub
            out["properties"] = props
        if isinstance(out.get("patternProperties"), dict):
            pats = {k: self.prune(v) for k, v in out["patternProperties"].items()}
            if any(v is False for v in pats.values()):
                out["additionalProperties"] = False  # what a false pattern forbids is never generated
            out["patternProperties"] = {k: v for k, v in pats.items() if v is not False}
            if not out["patternProperties"]:
                del out["patternProperties"]
        for key in ("anyOf", "oneOf"):
            if isinstance(out.get(key), list):
                kept = [b for b in map(self.prune, out[key]) if b is not False]
                if not kept:
                    return False
                out[key] = kept
        if isinstance(out.get("prefixItems"), list):
            items = [self.prune(v) for v in out["prefixItems"]]
            if False in items:
                end = items.index(False)
                if out.get("minItems", 0) > end:
                    return False
                items = items[:end]
                out["maxItems"] = min(out.get("maxItems", end), end)
            out["prefixItems"] = items
        for key in ("items", "additionalProperties", "propertyNames", "unevaluatedItems", "unevaluatedProperties"):
            if isinstance(out.get(key), dict):
                out[key] = self.prune(out[key])
        if out.get("items") is False and out.get("minItems", 0) > len(out.get("prefixItems") or []):
            return False
        if out.get("propertyNames") is False:
            out = {k: v for k, v in out.items() if k != "propertyNames"}
            out["maxProperties"] = 0
        return out


def _refs(node) -> list[str]:
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    if not isinstance(node, dict):
        return []
    own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
    return own + [r for k, v in node.items() if k not in ("enum", "const") for r in _refs(v)]


def _with_refs(node, moved: dict[str, str]):
    if isinstance(node, list):
        return [_with_refs(v, moved) for v in node]
    if not isinstance(node, dict):
        return node
    return {
        k: (moved.get(v, v) if k == "$ref" and isinstance(v, str) else v if k in ("enum", "const") else _with_refs(v, moved))
        for k, v in node.items()
    }


def _search(pattern: str, name: str) -> bool:
    try:
        return re.search(string_grammar.with_classes(pattern), name) is not None
    except re.error:
        return False


def normalize(schema, where: str = "#") -> tuple[object, list[str]]:
    """``schema`` in Lantern's dialect (see the module's doc) and the warnings for what it ignored."""
    n = _Normalizer(schema, where)
    out = n.prune_all(n.close(n.relocate(n.node(schema, where)), where))
    if out is False:
        raise n.contradiction or Contradiction(f"schema at {where}: no value satisfies it")
    return out, n.warnings()
