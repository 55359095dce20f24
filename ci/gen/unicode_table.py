#!/usr/bin/env python3
"""Writes compiler/contracts/unicode_categories.json: the Unicode general category of every code point of the Basic
Multilingual Plane on which Python's unicodedata and Node's RegExp (`\\p{gc=..}` with the u flag, as
ajv reads a pattern) agree. The pattern parser (webruntime/src/strings.ts, which both runtimes run) reads it
for `\\p{..}` and `\\P{..}`; a code point the two engines disagree on, or
that is unassigned in either, is in no category there, and the parsers treat it as "maybe" in every
one (a newer Unicode may assign it). tests/test_structured_exact.py checks the file against the
Python and Node it runs with.

    .venv/bin/python ci/gen/unicode_table.py    # rewrites compiler/contracts/unicode_categories.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import unicodedata
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "compiler" / "contracts" / "unicode_categories.json"

# The two-letter categories an assigned code point of the BMP can have (Cs, the surrogates, is no
# character of a string; Cn is "unassigned").
CATEGORIES = [
    "Lu",
    "Ll",
    "Lt",
    "Lm",
    "Lo",
    "Mn",
    "Mc",
    "Me",
    "Nd",
    "Nl",
    "No",
    "Pc",
    "Pd",
    "Ps",
    "Pe",
    "Pi",
    "Pf",
    "Po",
    "Sm",
    "Sc",
    "Sk",
    "So",
    "Zs",
    "Zl",
    "Zp",
    "Cc",
    "Cf",
    "Co",
]
# ECMA-262's names for the General_Category values (Unicode's PropertyValueAliases.txt), each to the
# categories it covers.
NAMES = {
    "L": ("Letter", "Lu Ll Lt Lm Lo"),
    "LC": ("Cased_Letter", "Lu Ll Lt"),
    "Lu": ("Uppercase_Letter", "Lu"),
    "Ll": ("Lowercase_Letter", "Ll"),
    "Lt": ("Titlecase_Letter", "Lt"),
    "Lm": ("Modifier_Letter", "Lm"),
    "Lo": ("Other_Letter", "Lo"),
    "M": ("Mark", "Mn Mc Me"),
    "Mn": ("Nonspacing_Mark", "Mn"),
    "Mc": ("Spacing_Mark", "Mc"),
    "Me": ("Enclosing_Mark", "Me"),
    "N": ("Number", "Nd Nl No"),
    "Nd": ("Decimal_Number", "Nd"),
    "Nl": ("Letter_Number", "Nl"),
    "No": ("Other_Number", "No"),
    "P": ("Punctuation", "Pc Pd Ps Pe Pi Pf Po"),
    "Pc": ("Connector_Punctuation", "Pc"),
    "Pd": ("Dash_Punctuation", "Pd"),
    "Ps": ("Open_Punctuation", "Ps"),
    "Pe": ("Close_Punctuation", "Pe"),
    "Pi": ("Initial_Punctuation", "Pi"),
    "Pf": ("Final_Punctuation", "Pf"),
    "Po": ("Other_Punctuation", "Po"),
    "S": ("Symbol", "Sm Sc Sk So"),
    "Sm": ("Math_Symbol", "Sm"),
    "Sc": ("Currency_Symbol", "Sc"),
    "Sk": ("Modifier_Symbol", "Sk"),
    "So": ("Other_Symbol", "So"),
    "Z": ("Separator", "Zs Zl Zp"),
    "Zs": ("Space_Separator", "Zs"),
    "Zl": ("Line_Separator", "Zl"),
    "Zp": ("Paragraph_Separator", "Zp"),
    "C": ("Other", "Cc Cf Cs Co Cn"),
    "Cc": ("Control", "Cc"),
    "Cf": ("Format", "Cf"),
    "Cs": ("Surrogate", "Cs"),
    "Co": ("Private_Use", "Co"),
    "Cn": ("Unassigned", "Cn"),
}
ALIASES = {"Combining_Mark": "M", "digit": "Nd", "punct": "P", "cntrl": "Cc"}

NODE = r"""
const cats = JSON.parse(process.argv[1]).map((c) => [c, new RegExp(`^\\p{gc=${c}}$`, "u")]);
const out = [];
for (let c = 0; c <= 0xffff; c++) {
  if (c >= 0xd800 && c <= 0xdfff) { out.push(""); continue; }
  const ch = String.fromCharCode(c);
  out.push((cats.find(([, re]) => re.test(ch)) ?? ["Cn"])[0]);
}
console.log(JSON.stringify({ unicode: process.versions.unicode, cats: out }));
"""


def ranges(codes: list[int]) -> str:
    out: list[list[int]] = []
    for c in codes:
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return " ".join(f"{lo:x}" if lo == hi else f"{lo:x}-{hi:x}" for lo, hi in out)


def main() -> int:
    node = json.loads(
        subprocess.run(["node", "-e", NODE, json.dumps(CATEGORIES)], check=True, capture_output=True, text=True).stdout
    )
    agreed: dict[str, list[int]] = {c: [] for c in CATEGORIES}
    differ = 0
    for code in range(0x10000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        py, js = unicodedata.category(chr(code)), node["cats"][code]
        if py == js and py in agreed:
            agreed[py].append(code)
        elif py != js:
            differ += 1
    table = {
        "about": "Written by ci/gen/unicode_table.py: each general category's code points of the BMP, in hex ranges, "
        "where Python's unicodedata and Node's RegExp agree; any other code point is unknown (unassigned or "
        "read differently). `names` maps every name ECMA-262 accepts to the categories it covers.",
        "unicode": {"python": unicodedata.unidata_version, "node": node["unicode"]},
        "categories": {c: ranges(agreed[c]) for c in CATEGORIES},
        "names": {
            **{short: cover.split() for short, (_, cover) in NAMES.items()},
            **{long: cover.split() for _, (long, cover) in NAMES.items()},
            **{alias: NAMES[short][1].split() for alias, short in ALIASES.items()},
        },
    }
    OUT.write_text(json.dumps(table, indent=1) + "\n")
    print(
        f"{OUT.name}: Unicode {table['unicode']}, {differ} code points read differently, {sum(map(len, agreed.values()))} agreed",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
