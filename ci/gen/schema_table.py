"""Write the table of JSON-schema keywords in docs/structured-output.md from compiler/contracts/schema_support.json.

    .venv/bin/python ci/gen/schema_table.py          # rewrite the table in docs/structured-output.md
    .venv/bin/python ci/gen/schema_table.py --check  # exit 1 if the docs' table is out of date

The table sits between the two marker comments in docs/structured-output.md; tests/test_structured_exact.py runs the check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START, END = "<!-- schema-keywords: written by ci/gen/schema_table.py -->", "<!-- /schema-keywords -->"


def table(support: dict) -> str:
    """The markdown table: one row per group of keywords, then the refused ones."""
    lines = ["| keywords | in OpenAI's strict mode | how Lantern enforces them |", "| --- | --- | --- |"]
    for row in support["keyword_table"]:
        names = ", ".join(f"`{k}`" for k in row["keywords"])
        lines.append(f"| {names} | {'yes' if row['openai'] else 'no'} | {row['enforced'].replace('|', '&#124;')} |")
    refused = ", ".join(f"`{k}`" for k in support["refused"])
    lines.append(f"| {refused} | no | refused: 400 / `InvalidRequestError` naming the keyword and where it is |")
    lines.append(
        "| any keyword not above | no | unknown, so an annotation (JSON Schema 2020-12): ignored, and the "
        "response names it in `lantern_warnings` |"
    )
    return "\n".join(lines)


def doc_with_table(doc: str, support: dict) -> str:
    head, rest = doc.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table(support)}\n{END}{tail}"


def main() -> int:
    support = json.loads((ROOT / "compiler" / "contracts" / "schema_support.json").read_text())
    path = ROOT / "docs" / "structured-output.md"
    doc = path.read_text()
    new = doc_with_table(doc, support)
    if "--check" in sys.argv[1:]:
        if new != doc:
            print("docs/structured-output.md's schema keyword table is out of date: run .venv/bin/python ci/gen/schema_table.py")
            return 1
        return 0
    path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
