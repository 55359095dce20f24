"""The documentation's shape: README.md stays a short front page, and every relative link in README.md
and docs/*.md reaches a file or folder of the repository, and a heading where it names one (GitHub's
anchors). Reads the Markdown files only; no browser, no build."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 150

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)


def documents() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def prose(text: str) -> str:
    """The text without code blocks or code spans, where a `[x](y)` is not a link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: its text as rendered (code marks dropped, a link's text kept),
    lowercase, every character but letters, digits, spaces, '-' and '_' removed, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a Markdown file; a repeated one gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = anchor(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text())) if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """The relative links of one file that reach nothing in ``root``, each with why."""
    problems = []
    for target in relative_links(path):
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.is_relative_to(root):
            problems.append(f"{target}: outside the repository")
        elif not dest.exists():
            problems.append(f"{target}: no file or folder {dest.relative_to(root)}")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            problems.append(f"{target}: no heading with the anchor #{fragment} in {dest.relative_to(root)}")
    return problems


def test_the_readme_is_a_short_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines, more than {MAX_README_LINES}: move the detail into docs/"
    )


def test_anchors_follow_githubs_rules():
    """The anchor rule the link check relies on, on headings of the kinds the docs use."""
    assert anchor("Browsers: Chromium, Firefox and Safari's engine") == "browsers-chromium-firefox-and-safaris-engine"
    assert anchor("`lantern serve`: the cloud fallback") == "lantern-serve-the-cloud-fallback"
    assert anchor("A 1.5B model in the browser") == "a-15b-model-in-the-browser"
    assert anchor("Devices: WebGPU, or the CPU (llama.cpp in wasm)") == "devices-webgpu-or-the-cpu-llamacpp-in-wasm"
    assert anchor("snake_case and dash-ed") == "snake_case-and-dash-ed"


def test_the_link_check_finds_broken_links(tmp_path):
    """A missing file, a missing heading and a link out of the repository are reported; a link inside
    code is not a link, and a web address is not checked."""
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (tmp_path / "outside.md").write_text("# Outside\n")
    page = repo / "docs" / "page.md"
    page.write_text(
        "# Title\n\n## Its part\n\n[ok](#its-part) [self](page.md#title) [up](../docs/) "
        "[gone](nowhere.md) [bad](page.md#no-such-part) [out](../../outside.md) "
        "[web](https://example.com) `[code](nowhere.md)`\n\n```\n[fenced](nowhere-either.md)\n```\n"
    )
    assert relative_links(page) == [
        "#its-part",
        "page.md#title",
        "../docs/",
        "nowhere.md",
        "page.md#no-such-part",
        "../../outside.md",
    ]
    assert broken_links(page, repo) == [
        "nowhere.md: no file or folder docs/nowhere.md",
        "page.md#no-such-part: no heading with the anchor #no-such-part in docs/page.md",
        "../../outside.md: outside the repository",
    ]


def test_every_relative_link_in_the_docs_reaches_its_target():
    assert DOCS.is_dir() and list(DOCS.glob("*.md")), "docs/ holds the manual"
    problems = [f"{path.relative_to(ROOT)}: {p}" for path in documents() for p in broken_links(path)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_index_and_the_front_page_link_every_docs_file():
    """docs/README.md is the manual's index and README.md's Documentation list names every topic."""
    for index, prefix in ((DOCS / "README.md", ""), (README, "docs/")):
        linked = {t.partition("#")[0] for t in relative_links(index)}
        missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "README.md" and prefix + p.name not in linked]
        assert not missing, f"{index.relative_to(ROOT)} does not link {', '.join(missing)}"


def layout_rows() -> dict[str, str]:
    """docs/architecture.md's Layout table: each folder the first column names, with the row's text."""
    text = (DOCS / "architecture.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 3:
            for folder in re.findall(r"`([^`]+/)`", cells[0]):
                rows[folder] = cells[-1]
    return rows


def unnamed_modules(folder: str, row: str, rows: dict[str, str], root: Path = ROOT) -> list[str]:
    """The modules of ``folder`` (its .py and .ts files, webruntime's in src/; its packages without a row
    of their own) that ``row`` does not name, as `stem`, `file name` or `package/`."""
    named = set(re.findall(r"`([^`]+)`", row))
    base = root / folder
    code = base / "src" if (base / "src").is_dir() and not (base / "__init__.py").exists() else base
    files = [p for p in code.iterdir() if p.suffix in (".py", ".ts") and p.stem not in ("__init__", "__main__")]
    packages = [p for p in base.iterdir() if (p / "__init__.py").exists() and f"{folder}{p.name}/" not in rows]
    return sorted(
        [p.name for p in files if p.stem not in named and p.name not in named]
        + [f"{p.name}/" for p in packages if f"{p.name}/" not in named and p.name not in named]
    )


def test_the_layout_names_every_module():
    """The Layout table is kept by hand, so it is checked against the tree: every module of a folder it
    lists is named in that folder's row (tests/ is described as a whole)."""
    rows = layout_rows()
    assert {"compiler/", "models/", "server/", "webruntime/", "worker/", "ci/"} <= set(rows), sorted(rows)
    problems = [
        f"{folder}: {', '.join(missing)}"
        for folder, row in rows.items()
        if folder != "tests/"
        for missing in [unnamed_modules(folder, row, rows)]
        if missing
    ]
    assert not problems, "docs/architecture.md's Layout does not name:\n" + "\n".join(problems)


def test_the_layout_check_finds_an_unnamed_module(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for name in ("__init__.py", "alpha.py", "beta.py", "sub/__init__.py"):
        (tmp_path / "pkg" / name).write_text("")
    assert unnamed_modules("pkg/", "`alpha` and `sub/`", {}, tmp_path) == ["beta.py"]
    assert unnamed_modules("pkg/", "`alpha`", {"pkg/sub/": ""}, tmp_path) == ["beta.py"]
    assert unnamed_modules("pkg/", "`alpha`, `beta.py`", {}, tmp_path) == ["sub/"]


def command_options() -> dict[str, set[str]]:
    """Each `lantern` subcommand's long options, from the CLI's own parser (imports the compiler)."""
    import argparse

    from lantern.cli import make_parser

    [commands] = [a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {
        name: {o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
        for name, parser in commands.choices.items()
    }


def test_the_manual_names_every_option_of_each_command():
    """`lantern build`, `serve` and `validate`: every option their parser has is named in their docs page."""
    pages = {"build": "build.md", "serve": "server.md", "validate": "validate.md"}
    options = command_options()
    assert set(pages) <= set(options), sorted(options)
    problems = [
        f"docs/{page}: {option}"
        for command, page in pages.items()
        for option in sorted(options[command])
        if not re.search(re.escape(option) + r"(?![\w-])", (DOCS / page).read_text())
    ]
    assert not problems, "options `lantern --help` lists that the manual does not name:\n" + "\n".join(problems)


def test_the_family_table_matches_the_registry():
    """docs/families.md's table: one row per registered family, in order, with its config.json
    architectures and its GGUF architecture as models/__init__.py has them (the last column is prose)."""
    from lantern.models import FAMILIES

    text = (DOCS / "families.md").read_text()
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("| `")]
    table = [(re.findall(r"`([^`]+)`", r[0]), set(re.findall(r"`([^`]+)`", r[1])), re.findall(r"`([^`]+)`", r[2])) for r in rows]
    registry = [([f.name], set(f.architectures), [f.gguf.architecture]) for f in FAMILIES]
    assert table == registry
