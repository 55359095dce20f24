"""JSONSchemaBench through Lantern's structured output (the `--jsonschemabench DIR` mode of
ci/bench/bench_structured.py; a benchmark, not a test).

For every schema of DIR (`<split>.jsonl` and `<split>.tests.jsonl`, as in ../shared/jsonschemabench):
- declared: whether Lantern accepts it (the server's checks and xgrammar's compile against the model's
  vocabulary, with the default schema_defaults), its compile time, and llguidance's verdict on the same
  schema in the same run (llguidance runs in its own virtual environment under the cache, not in Lantern's);
- instances, no model: each of the benchmark's test instances of an accepted schema, written the way Lantern
  writes JSON (one line, OpenAI's separators, the schema's key order), through the grammar: a valid one the
  grammar refuses is over-constrained, an invalid one it accepts is under-constrained (an invalid answer
  Lantern could give);
- answers (with an artifact): `--answers N` schemas of each split answered greedily by the model, each
  answer validated by jsonschema (Draft 2020-12, formats checked): valid, invalid, closed (cut by
  max_tokens and closed by Lantern: valid JSON, cut short; compliance counts only valid) or cut;
  the mask time per token;
- with `--browser` as well, the same schemas answered by the browser engine (the `wasm` device, 2
  threads, in headless Chromium: its own schema rewrite, grammar and sampler), validated alike, and how
  many of its answers are the server's text;
- with `--twice`, every answer asked for again right after (its prompt now in the engine's prefix cache),
  on the server and in the browser: how many second answers differ from the first (issue 49: the same
  request at temperature 0 must give the same answer, cache hit or not).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema

from lantern.server.protocol import ChatCompletionRequest
from lantern.server.grammars import schema_ebnf
from lantern.server.structured import StructuredOutputError, response_format_spec

LLGUIDANCE = "llguidance==1.9.1"
LAYOUT = {"ensure_ascii": False, "separators": (", ", ": ")}


def load(folder: Path) -> list[dict]:
    """Every schema of the folder: {split, id, schema, tests}, in file order."""
    rows = []
    for path in sorted(folder.glob("*.jsonl")):
        if path.name.endswith(".tests.jsonl"):
            continue
        tests_path = path.with_name(path.name[: -len(".jsonl")] + ".tests.jsonl")
        tests = {}
        if tests_path.exists():
            for line in filter(None, tests_path.read_text().split("\n")):  # not splitlines: U+2028 is text
                row = json.loads(line)
                tests[row["id"]] = row["tests"]
        for line in filter(None, path.read_text().split("\n")):
            row = json.loads(line)
            rows.append(
                {
                    "split": path.name[: -len(".jsonl")],
                    "id": row["id"],
                    "schema": row["schema"],
                    "tests": tests.get(row["id"], []),
                }
            )
    return rows


def request_for(schema, max_tokens: int = 384, schema_defaults: dict | None = None) -> dict:
    """The benchmark's request; ``schema_defaults`` (--schema-defaults) None: the server's."""
    text = json.dumps(schema)
    shown = text if len(text) <= 3000 else text[:3000] + " ..."
    return {
        "messages": [
            {"role": "system", "content": "You answer with one JSON value that satisfies the user's JSON Schema."},
            {"role": "user", "content": f"JSON Schema:\n{shown}\nWrite one example."},
        ],
        "response_format": {"type": "json_schema", "json_schema": {"name": "bench", "schema": schema}},
        "temperature": 0,
        "max_tokens": max_tokens,
        **({"schema_defaults": schema_defaults} if schema_defaults is not None else {}),
    }


def lantern_declared(rows: list[dict], generator, schema_defaults: dict | None = None) -> None:
    """Sets row["lantern"] (None: accepted, else the refusal), row["compile_s"] and row["spec"]."""
    for row in rows:
        start = time.perf_counter()
        try:
            req = ChatCompletionRequest(**request_for(row["schema"], schema_defaults=schema_defaults))
            fmt = req.response_format.model_dump(exclude_none=True)  # as the server reads it
            row["spec"] = response_format_spec(fmt, req.schema_defaults.model_dump())
            row["compiled"] = generator.compile_grammar(row["spec"])
            row["lantern"] = None
        except StructuredOutputError as err:
            row["lantern"] = str(err)
        except Exception as err:  # noqa: BLE001 (a crash is a result too: it is printed)
            row["lantern"] = f"crash: {type(err).__name__}: {err}"
        row["compile_s"] = time.perf_counter() - start


_LLG_SCRIPT = r"""
import json, sys
from llguidance import LLMatcher
out = []
for line in sys.stdin:
    schema = json.loads(line)
    try:
        err = LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(json.dumps(schema)))
    except Exception as e:
        err = str(e) or type(e).__name__
    out.append(err or None)
print(json.dumps(out))
"""


def llguidance_env() -> Path:
    """A virtual environment with llguidance, made once under the cache."""
    cache = Path(os.environ.get("LANTERN_CACHE", Path.home() / ".cache" / "lantern"))
    env = cache / "bench-llguidance"
    python = env / "bin" / "python"
    if not python.exists():
        print(f"installing {LLGUIDANCE} into {env} (once) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", LLGUIDANCE], check=True)
    return python


def llguidance_declared(rows: list[dict]) -> None:
    """Sets row["llguidance"]: None where llguidance accepts the schema, else its error."""
    text = "".join(json.dumps(r["schema"]) + "\n" for r in rows)
    out = subprocess.run([str(llguidance_env()), "-c", _LLG_SCRIPT], input=text, capture_output=True, text=True, check=True)
    for row, err in zip(rows, json.loads(out.stdout)):
        row["llguidance"] = err


# ---- instances ----------------------------------------------------------------------------------


def _resolve(schema, root, depth: int = 0):
    """``schema`` with a local $ref followed (a few levels)."""
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#") and depth < 16:
        node = root
        for part in schema["$ref"][1:].split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return schema
        schema, depth = node, depth + 1
    return schema


def _property_order(schema, root, keys: set) -> tuple[list, dict]:
    """The property names a schema lists, in its order, and their subschemas (following $ref, allOf and the
    first anyOf/oneOf branch that lists a key of the instance)."""
    schema = _resolve(schema, root)
    if not isinstance(schema, dict):
        return [], {}
    names, subs = [], {}
    own = schema.get("properties")
    if isinstance(own, dict):
        for k, v in own.items():
            names.append(k)
            subs[k] = v
    for part in schema.get("allOf") or []:
        n, s = _property_order(part, root, keys)
        names += [k for k in n if k not in subs]
        subs = {**s, **subs}
    for key in ("anyOf", "oneOf"):
        for part in schema.get(key) or []:
            n, s = _property_order(part, root, keys)
            if keys & set(n):
                names += [k for k in n if k not in subs]
                subs = {**s, **subs}
                break
    return names, subs


def in_schema_order(value, schema, root):
    """``value`` with each object's keys in the order its schema lists them (others after, as they came)."""
    if isinstance(value, dict):
        names, subs = _property_order(schema, root, set(value))
        order = [k for k in names if k in value] + [k for k in value if k not in names]
        extra = _resolve(schema, root).get("additionalProperties") if isinstance(_resolve(schema, root), dict) else None
        return {k: in_schema_order(value[k], subs.get(k, extra if isinstance(extra, dict) else {}), root) for k in order}
    if isinstance(value, list):
        s = _resolve(schema, root)
        items = s.get("items") if isinstance(s, dict) else None
        prefix = s.get("prefixItems") if isinstance(s, dict) else None
        out = []
        for i, v in enumerate(value):
            sub = (
                prefix[i]
                if isinstance(prefix, list) and i < len(prefix)
                else items[i]
                if isinstance(items, list) and i < len(items)
                else items
            )
            out.append(in_schema_order(v, sub if isinstance(sub, dict) else {}, root))
        return out
    return value


def check_instances(rows: list[dict]) -> None:
    """Sets row["instances"]: a list of (valid, accepted, text) for an accepted schema's test instances."""
    import xgrammar
    from xgrammar.testing import _is_grammar_accept_string

    for row in rows:
        row["instances"] = []
        if row["lantern"] is not None or not row["tests"]:
            continue
        spec = row["spec"]
        grammar = xgrammar.Grammar.from_ebnf(schema_ebnf(spec.source))
        for test in row["tests"]:
            text = json.dumps(in_schema_order(test["data"], row["schema"], row["schema"]), **LAYOUT)
            row["instances"].append((test["valid"], bool(_is_grammar_accept_string(grammar, text)), text))


def mask_times(rows: list[dict], generator, tokens_each: int = 48) -> None:
    """Sets row["mask_us"]: the mean time to compute the token mask (and accept the token), per token,
    over the first ``tokens_each`` tokens of the first valid test instance the grammar accepts,
    tokenized as the model writes it."""
    for row in rows:
        text = next((t for valid, accepted, t in row.get("instances", []) if valid and accepted), None)
        if text is None:
            continue
        mask = generator.grammars.matcher(row["compiled"])
        done, start = 0, time.perf_counter()
        for token in generator.encode(text)[:tokens_each]:
            if not mask.allowed()[token]:
                break  # a tokenization the grammar does not take token by token: the time so far is kept
            mask.accept(token)
            done += 1
        row["mask_us"] = (time.perf_counter() - start) * 1e6 / max(1, done)
        print(f"\rmask times {row['id'][:40]:40} {row['mask_us']:10.0f} us", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)


# ---- answers ------------------------------------------------------------------------------------


def _pattern(validator, pattern, instance, schema):
    """jsonschema's `pattern`, with the `regex` module (which reads \\p{..} as ajv does) where Python's re
    cannot read the pattern."""
    if not validator.is_type(instance, "string"):
        return
    try:
        found = re.search(pattern, instance)
    except re.error:
        import regex  # a dependency of transformers

        found = regex.search(pattern, instance)
    if not found:
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls = jsonschema.validators.extend(cls, {"pattern": _pattern})
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def answer(generator, row: dict, max_tokens: int, schema_defaults: dict | None = None) -> None:
    from lantern.server.engine import Stop

    req = ChatCompletionRequest(**request_for(row["schema"], max_tokens, schema_defaults))
    prompt = generator.encode(generator.render_chat([m.model_dump(exclude_none=True) for m in req.messages]))
    steps = []
    start = time.perf_counter()
    generator.generate(prompt, req, Stop(), steps.append, grammar=row["compiled"])
    row["answer_s"] = time.perf_counter() - start
    text = "".join(s.delta for s in steps)
    last = steps[-1]
    row["tokens"] = last.usage.completion_tokens if last.usage else 0
    row["answer_text"] = text  # a cut answer's text too: what the model looped on
    row["answer"], row["answer_error"] = verdict(row["schema"], text, last.finish)


def verdict(schema, text: str, finish: str) -> tuple[str, str | None]:
    """An answer's class and its first validation error: valid; invalid; closed (max_tokens cut it and
    Lantern closed it, server/closing.py: valid JSON, cut short); cut (max_tokens left it unfinished)."""
    try:
        errors = sorted(validator(schema).iter_errors(json.loads(text)), key=str)
    except json.JSONDecodeError:
        if finish == "length":
            return "cut", None
        errors = ["not JSON"]
    if errors:
        return "invalid", str(errors[0])[:300]
    return ("closed" if finish == "length" else "valid"), None


def picked_for_answers(rows: list[dict], per_split: int) -> list[dict]:
    """The first ``per_split`` accepted schemas of each split."""
    picked, seen = [], Counter()
    for row in rows:
        if row["lantern"] is None and seen[row["split"]] < per_split:
            seen[row["split"]] += 1
            picked.append(row)
    return picked


def run_answers(
    rows: list[dict],
    generator,
    per_split: int,
    max_tokens: int,
    schema_defaults: dict | None = None,
    twice: bool = False,
) -> None:
    """Answer the picked schemas, 4 at a time; ``twice``: each client asks its schema again at once (the
    prompt found in the cache, beside other clients' requests), row["answer_again"] the second text."""
    picked = picked_for_answers(rows, per_split)
    done = 0

    def ask(row: dict) -> None:
        answer(generator, row, max_tokens, schema_defaults)
        if twice:
            again = dict(row)  # answer() writes its results into the row it is given
            answer(generator, again, max_tokens, schema_defaults)
            row["answer_again"] = again["answer_text"]

    with ThreadPoolExecutor(4) as pool:  # the llamacpp engine decodes these in shared steps
        for _ in pool.map(ask, picked):
            done += 1
            print(f"\ranswers {done}/{len(picked)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)


# One request on the page's engine: its answer, or the error it was refused with.
ASK = """async (req) => {
  try {
    const r = await engine.chat.completions.create(req);
    return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason, tokens: r.usage.completion_tokens };
  } catch (e) {
    return { error: `${e.name}: ${e.message}` };
  }
}"""


def browser_answers(
    rows: list[dict],
    artifact: Path,
    per_split: int,
    max_tokens: int,
    schema_defaults: dict | None = None,
    twice: bool = False,
) -> None:
    """The same schemas answered by the browser engine (`wasm` device, 2 threads, headless Chromium), one
    at a time: row["browser_answer"] is valid, invalid, cut or refused (the browser refused a schema
    the server accepted), with row["browser_text"] and row["browser_s"]; ``twice``: each asked again
    at once (llama.cpp finds the prompt in its cache), row["browser_again"] the second text."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from browser import chromium, lantern_server

    picked = picked_for_answers(rows, per_split)
    with lantern_server([artifact]) as (base, _), chromium(webgpu=False) as browser:
        page = browser.new_page()
        page.goto(base + "/engine.html")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        page.evaluate("([m, o]) => load(m, o)", [f"/models/{artifact.name}/", {"device": "wasm", "threads": 2}])
        for done, row in enumerate(picked, 1):
            start = time.perf_counter()
            got = page.evaluate(ASK, request_for(row["schema"], max_tokens, schema_defaults))
            row["browser_s"] = time.perf_counter() - start
            if "error" in got:
                row["browser_answer"], row["browser_error"] = "refused", got["error"][:300]
            else:
                row["browser_text"], row["browser_tokens"] = got["text"], got["tokens"]
                row["browser_answer"], row["browser_error"] = verdict(row["schema"], got["text"], got["finish"])
                if twice:
                    row["browser_again"] = page.evaluate(ASK, request_for(row["schema"], max_tokens, schema_defaults)).get("text")
            print(f"\rbrowser answers {done}/{len(picked)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)


# ---- report -------------------------------------------------------------------------------------


def pct(n: int, d: int) -> str:
    return f"{n / d:5.0%}" if d else "    -"


def report(rows: list[dict], answers: bool) -> None:
    by_split = defaultdict(list)
    for r in rows:
        by_split[r["split"]].append(r)
    head = f"{'split':16} {'n':>4} {'lantern':>8} {'llguid.':>8}  {'inst ok':>8} {'over':>5} {'under':>6}"
    if answers:
        head += f"  {'answered':>8} {'valid':>5} {'invalid':>7} {'closed':>6} {'cut':>4} {'compliance':>10}"
    print(head)
    for split, rs in [*sorted(by_split.items()), ("all", rows)]:
        n = len(rs)
        ours = sum(r["lantern"] is None for r in rs)
        theirs = sum(r.get("llguidance", "x") is None for r in rs)
        inst = [i for r in rs for i in r.get("instances", [])]
        over = sum(v and not a for v, a, _ in inst)
        under = sum(a and not v for v, a, _ in inst)
        line = (
            f"{split:16} {n:4} {pct(ours, n):>8} {pct(theirs, n) if 'llguidance' in rs[0] else '-':>8}  "
            f"{len(inst) - over - under:4}/{len(inst):<4} {over:5} {under:6}"
        )
        if answers:
            a = Counter(r.get("answer") for r in rs if "answer" in r)
            k = sum(a.values())
            line += f"  {k:8} {a['valid']:5} {a['invalid']:7} {a['closed']:6} {a['cut']:4} {pct(a['valid'], k):>10}"
        print(line)
    print(f"{'split':16} {'compile ms mean':>16} {'mask us/token mean':>19}")
    for split, rs in [*sorted(by_split.items()), ("all", rows)]:
        ms = [r["compile_s"] * 1000 for r in rs if r["lantern"] is None]
        us = [r["mask_us"] for r in rs if "mask_us" in r]
        print(f"{split:16} {statistics.mean(ms) if ms else 0:16.0f} {statistics.mean(us) if us else 0:19.0f}")
    compile_ms = sorted(r["compile_s"] * 1000 for r in rows if r["lantern"] is None)
    if compile_ms:
        p = lambda q: compile_ms[min(len(compile_ms) - 1, int(q * len(compile_ms)))]  # noqa: E731
        print(f"compile time of accepted schemas: p50 {p(0.5):.0f} ms, p99 {p(0.99):.0f} ms, max {compile_ms[-1]:.0f} ms")
    if answers:
        answered = [r for r in rows if "answer" in r]
        if answered:
            ms = [r["answer_s"] * 1000 / max(1, r["tokens"]) for r in answered]
            print(f"answers: {len(answered)}, median {statistics.median(ms):.0f} ms a token (4 at once)")
        again = [r for r in answered if "answer_again" in r]
        if again:
            differ = [r["id"] for r in again if r["answer_again"] != r["answer_text"]]
            print(f"server answers asked twice: {len(again) - len(differ)} of {len(again)} the same{repeat_note(differ)}")
    in_browser = [r for r in rows if "browser_answer" in r]
    if in_browser:
        print(
            f"{'browser (wasm)':16} {'answered':>8} {'valid':>5} {'invalid':>7} {'closed':>6} {'cut':>4} {'refused':>7} "
            f"{'compliance':>10} {'same text':>9}"
        )
        for split, rs in [*sorted(by_split.items()), ("all", rows)]:
            rs = [r for r in rs if "browser_answer" in r]
            a = Counter(r["browser_answer"] for r in rs)
            same = sum(r.get("browser_text") == r.get("answer_text") for r in rs)
            print(
                f"{split:16} {len(rs):8} {a['valid']:5} {a['invalid']:7} {a['closed']:6} {a['cut']:4} {a['refused']:7} "
                f"{pct(a['valid'], len(rs)):>10} {same:9}"
            )
        ms = [r["browser_s"] * 1000 / max(1, r.get("browser_tokens", 1)) for r in in_browser]
        print(
            f"browser answers: {len(in_browser)}, median {statistics.median(ms):.0f} ms a token (one at a time, prompt included)"
        )
        again = [r for r in in_browser if "browser_again" in r]
        if again:
            differ = [r["id"] for r in again if r["browser_again"] != r["browser_text"]]
            print(f"browser answers asked twice: {len(again) - len(differ)} of {len(again)} the same{repeat_note(differ)}")
    reasons = Counter(_reason(r["lantern"]) for r in rows if r["lantern"] is not None)
    print("refusals by cause: " + ", ".join(f"{k} {v}" for k, v in reasons.most_common(25)))


def repeat_note(differ: list) -> str:
    return f"; differ: {', '.join(map(str, differ))}" if differ else ""


def _reason(message: str) -> str:
    import re

    m = re.match(r"schema keywords? '([^']+)'", message)
    if m and "is not supported by the grammar engine" in message:
        return f"unknown keyword {m[1]}"
    if m:
        return m[1]
    return message.split(":")[0][:60]


def main(
    folder: Path,
    artifact: Path | None,
    per_split: int,
    max_tokens: int,
    skip_llguidance: bool,
    only: list[str] | None,
    dump: Path | None,
    schema_defaults: dict | None = None,
    browser: bool = False,
    twice: bool = False,
) -> int:
    from lantern.server.engine import Generator

    rows = load(folder)
    if only:
        rows = [r for r in rows if r["split"] in only]
    generator = Generator(artifact, "llamacpp" if per_split else "auto")
    start = time.perf_counter()
    lantern_declared(rows, generator, schema_defaults)
    print(f"lantern: {len(rows)} schemas checked and compiled in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    if not skip_llguidance:
        llguidance_declared(rows)
    check_instances(rows)
    mask_times(rows, generator)
    if per_split:
        run_answers(rows, generator, per_split, max_tokens, schema_defaults, twice)
    if per_split and browser:
        browser_answers(rows, artifact, per_split, max_tokens, schema_defaults, twice)
    report(rows, bool(per_split))
    if dump:
        keep = (
            "split",
            "id",
            "lantern",
            "llguidance",
            "compile_s",
            "mask_us",
            "instances",
            "answer",
            "answer_error",
            "answer_text",
            "tokens",
            "answer_s",
            "answer_again",
            "browser_answer",
            "browser_error",
            "browser_text",
            "browser_s",
            "browser_again",
        )
        dump.write_text("\n".join(json.dumps({k: r[k] for k in keep if k in r}) for r in rows) + "\n")
    return 0
