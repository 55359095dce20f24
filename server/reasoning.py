"""Reasoning models (Qwen3, DeepSeek-R1 distills, SmolLM3): the answer's ``<think>…</think>`` block
comes back as ``reasoning_content``, as vLLM's and llama.cpp's servers return it.

The artifact names its tags (lantern.json ``model.reasoning_tags``, from the chat template at build
time). ``ReasoningSplitter`` turns the raw generated text into reasoning and content deltas while
it streams; the same text gives the same two strings however it is cut into deltas. Its twin is
webruntime/src/reasoning.ts (tests/test_reasoning.py runs both on one corpus).

The rule:
* The reasoning starts in the prompt (a template that ends the generation prompt with the open
  tag) or at the very start of the answer (the open tag first); otherwise the answer is content.
* It ends at the close tag; everything after it is content.
* Newlines around the reasoning and at the start of the content after it are dropped, as Qwen's
  template drops them when it renders the turn back (``strip('\\n')``, ``lstrip('\\n')``).
"""

from __future__ import annotations

# Template variables Lantern sets itself; a request's chat_template_kwargs may not override them.
RESERVED_TEMPLATE_KWARGS = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")


def template_kwargs(kwargs: dict | None, tags: list[str] | None, strict: bool) -> dict:
    """The extra template variables of a chat request (its ``chat_template_kwargs``).

    ``strict``: a grammar decides every token (response_format, or a required/named tool call), so a
    reasoning model does not think first: ``enable_thinking`` defaults to false, and true is refused.
    The twin of templateKwargs in webruntime/src/reasoning.ts. Raises ValueError naming the problem.
    """
    kwargs = dict(kwargs or {})
    for key in kwargs:
        if key in RESERVED_TEMPLATE_KWARGS:
            raise ValueError(f"chat_template_kwargs.{key} is set by Lantern and cannot be overridden")
    if tags and strict:
        if kwargs.get("enable_thinking") is True:
            raise ValueError(
                "chat_template_kwargs.enable_thinking cannot be true with response_format or a "
                "required tool call: the grammar constrains every token, reasoning included"
            )
        kwargs.setdefault("enable_thinking", False)
    return kwargs


def opens_in_prompt(prompt: str, tags: list[str]) -> bool:
    """Whether the rendered prompt already opened the reasoning (the answer starts inside it)."""
    return prompt.rstrip(" \t\r\n").endswith(tags[0])


class ReasoningSplitter:
    """push(raw delta) -> (reasoning delta, content delta); finish() flushes what was held back."""

    def __init__(self, tags: list[str], in_reasoning: bool):
        self.open, self.close = tags
        self.state = "reasoning" if in_reasoning else "start"
        self.fresh = True  # at the start of a segment: its leading newlines are dropped
        self.buffer = ""

    def push(self, text: str) -> tuple[str, str]:
        self.buffer += text
        return self._drain(final=False)

    def finish(self) -> tuple[str, str]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> tuple[str, str]:
        reasoning, content = "", ""
        while True:
            if self.state == "start":
                if self.buffer.startswith(self.open):
                    self.buffer = self.buffer[len(self.open) :]
                    self.state = "reasoning"
                elif self.open.startswith(self.buffer) and not final:
                    return reasoning, content  # could still become the open tag
                else:
                    self.state, self.fresh = "content", False
            elif self.state == "reasoning":
                if self.fresh:
                    self.buffer = self.buffer.lstrip("\n")
                    if not self.buffer:
                        return reasoning, content
                    self.fresh = False
                end = self.buffer.find(self.close)
                if end >= 0:
                    reasoning += self.buffer[:end].rstrip("\n")
                    self.buffer = self.buffer[end + len(self.close) :]
                    self.state, self.fresh = "content", True
                    continue
                if final:
                    reasoning += self.buffer.rstrip("\n")
                    self.buffer = ""
                    return reasoning, content
                safe = len(self.buffer) - held_back(self.buffer, [self.close])
                safe = len(self.buffer[:safe].rstrip("\n"))  # trailing newlines may precede the close tag
                reasoning += self.buffer[:safe]
                self.buffer = self.buffer[safe:]
                return reasoning, content
            else:
                if self.fresh:
                    self.buffer = self.buffer.lstrip("\n")
                    if not self.buffer:
                        return reasoning, content
                    self.fresh = False
                content += self.buffer
                self.buffer = ""
                return reasoning, content


def held_back(text: str, stops: list[str]) -> int:
    """Characters at the end of ``text`` that could still grow into one of ``stops`` (stop strings, a
    tool call's opening tag, a reasoning tag): the longest end that is a proper start of one."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return hold


def split(text: str, tags: list[str], in_reasoning: bool) -> tuple[str, str]:
    """(reasoning, content) of a whole answer."""
    splitter = ReasoningSplitter(tags, in_reasoning)
    r1, c1 = splitter.push(text)
    r2, c2 = splitter.finish()
    return r1 + r2, c1 + c2
