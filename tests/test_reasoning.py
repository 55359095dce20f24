"""The reasoning split (a `<think>` block returned as reasoning_content): the rule on known answers,
its independence from how the text is cut into deltas, and the browser's twin on one generated
corpus. No model needed; the runtimes' wiring is tested with Qwen3's template in test_qwen_template.py."""

import random

import pytest
from test_structured import run_typescript

from lantern.chat_template import reasoning_tags
from lantern.server.reasoning import ReasoningSplitter, opens_in_prompt, split, template_kwargs

TAGS = ["<think>", "</think>"]


@pytest.mark.parametrize(
    "text, in_reasoning, want",
    [
        ("<think>\nweigh it\n</think>\n\nYes.", False, ("weigh it", "Yes.")),
        ("weigh it\n</think>\n\nYes.", True, ("weigh it", "Yes.")),  # the prompt opened the block
        ("Yes, no block.", False, ("", "Yes, no block.")),
        ("\n\nYes.", False, ("", "\n\nYes.")),  # content with no block keeps its newlines
        ("Yes. </think> stays", False, ("", "Yes. </think> stays")),  # a close tag in content is text
        ("<think>\ncut off mid-thou", False, ("cut off mid-thou", "")),  # max_tokens inside the block
        ("<think>\nends at </thi", False, ("ends at </thi", "")),
        ("<thin", False, ("", "<thin")),  # the start of an open tag that never completed
        ("<think></think>", False, ("", "")),
        ("<think>\n\n</think>\n\n", False, ("", "")),
        ("<think>a\n\nb</think>c\nd\n", False, ("a\n\nb", "c\nd\n")),  # inner newlines stay
        (" <think>x</think>y", False, ("", " <think>x</think>y")),  # the block must come first
    ],
)
def test_the_rule_on_known_answers(text, in_reasoning, want):
    assert split(text, TAGS, in_reasoning) == want


def corpus(n: int, seed: int = 0) -> list[tuple[str, bool]]:
    """Random answers built from the pieces that matter: tags, partial tags, newlines, text."""
    rng = random.Random(seed)
    pieces = ["<think>", "</think>", "<", "</", "</thi", "<thi", "\n", "\n\n", " ", "word", "é", "🚀", ">", "think"]
    return [("".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))), rng.random() < 0.3) for _ in range(n)]


def cuts(text: str, rng: random.Random) -> list[str]:
    points = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
    edges = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(edges, edges[1:])]


def pushed(pieces: list[str], in_reasoning: bool) -> list[list[str]]:
    s = ReasoningSplitter(TAGS, in_reasoning)
    return [list(s.push(p)) for p in pieces] + [list(s.finish())]


def test_any_cut_into_deltas_gives_the_same_split():
    rng = random.Random(1)
    for text, in_reasoning in corpus(2000):
        whole = split(text, TAGS, in_reasoning)
        for _ in range(3):
            parts = pushed(cuts(text, rng), in_reasoning)
            assert ("".join(r for r, _ in parts), "".join(c for _, c in parts)) == whole, repr(text)


KWARGS = [
    (None, TAGS, False),
    ({}, TAGS, True),
    ({"enable_thinking": True}, TAGS, False),
    ({"enable_thinking": True}, TAGS, True),
    ({"enable_thinking": False}, TAGS, True),
    ({"enable_thinking": True}, None, True),
    ({"custom": [1, "a"]}, None, False),
    ({"messages": []}, None, False),
    ({"add_generation_prompt": False}, TAGS, False),
]


def python_kwargs(kwargs, tags, strict):
    try:
        return template_kwargs(kwargs, tags, strict)
    except ValueError as err:
        return {"error": f"InvalidRequestError: {err}"}


def test_the_browser_twin_splits_and_checks_alike(report):
    rng = random.Random(2)
    splits = [(cuts(text, rng), in_reasoning) for text, in_reasoning in corpus(600, seed=3)]
    prompts = ["<|im_start|>assistant\n<think>\n", "<|im_start|>assistant\n", "<think>\n\n</think>\n\n", "x<think> \t\r\n"]
    got = run_typescript(
        "reasoning.ts",
        {
            "splits": [{"tags": TAGS, "inReasoning": r, "pieces": p} for p, r in splits],
            "kwargs": [{"kwargs": k, "tags": t, "strict": s} for k, t, s in KWARGS],
            "prompts": [{"prompt": p, "tags": TAGS} for p in prompts],
        },
    )
    assert got["splits"] == [pushed(p, r) for p, r in splits]
    assert got["kwargs"] == [python_kwargs(*case) for case in KWARGS]
    assert got["prompts"] == [opens_in_prompt(p, TAGS) for p in prompts] == [True, False, False, True]
    report(f"reasoning split: {len(splits)} cut answers and {len(KWARGS)} chat_template_kwargs cases, browser = server")


def test_tags_come_from_the_template():
    assert reasoning_tags("{{ '<think>\\n' }}{{ x.split('</think>') }}") == TAGS
    assert reasoning_tags("{{ messages }}") is None and reasoning_tags(None) is None
