"""The chat turn: `ChatTurn` makes one chat completion's answer from the generation's steps, as
stream chunks or as one body: the reasoning split off into `reasoning_content`, tool calls parsed from
the whole text, and the schema rewrite's warnings on the answer. The route that starts it is
routes.chat_completions."""

from __future__ import annotations

import time
from typing import Any

from . import reasoning
from .engine import Step, new_id
from .protocol import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
    FinishReason,
    Logprobs,
    ToolCall,
    ToolCallDelta,
)
from .slots import ModelSlot
from .structured import parse_tool_calls


class ChatTurn:
    """One chat completion's answer, streamed or whole: the reasoning split off, tool calls parsed from
    the whole text (they arrive whole in the last chunk)."""

    def __init__(
        self,
        slot: ModelSlot,
        req: ChatCompletionRequest,
        prompt_text: str,
        calling: bool,
        strict: bool,
        warnings: tuple[str, ...] = (),
    ):
        self.slot, self.calling, self.logprobs_on = slot, calling, req.logprobs
        # what the schema's rewrite ignored (unknown keywords, ...): on the answer, the first chunk of a stream
        self.extra: dict[str, Any] = {"lantern_warnings": list(warnings)} if warnings else {}
        self.id, self.created = new_id("chatcmpl"), int(time.time())
        self.streamed: list[str] = []  # content so far, for the tool calls in the last chunk
        assert slot.generator is not None  # slot_for admits only a loaded model
        tags = slot.generator.reasoning_tags
        self.splitter = (
            reasoning.ReasoningSplitter(tags, reasoning.opens_in_prompt(prompt_text, tags)) if tags and not strict else None
        )

    def split(self, step: Step) -> tuple[str | None, str]:
        """(reasoning, content) deltas of a step's text."""
        if self.splitter is None:
            return None, step.delta
        r, c = self.splitter.push(step.delta)
        if step.finish is not None:
            r2, c2 = self.splitter.finish()
            r, c = r + r2, c + c2
        return r, c

    def split_calls(self, text: str) -> tuple[str | None, list[ToolCall] | None, FinishReason | None]:
        """Content, tool calls and the finish reason override for the whole generated text."""
        if not self.calling:
            return text, None, None
        content, calls = parse_tool_calls(text)
        return content, [ToolCall(**c) for c in calls] or None, "tool_calls" if calls else None

    def chunk(self, step: Step, first: bool) -> ChatCompletionChunk:
        thought, text = self.split(step)
        self.streamed.append(text)
        delta = Delta(role="assistant" if first else None, content=text, reasoning_content=thought or None)
        finish = step.finish
        if self.calling and step.finish is not None:
            content, calls, calls_finish = self.split_calls("".join(self.streamed))
            if calls:
                sent = "".join(self.streamed[:-1])
                delta.content = (content or "")[len(sent) :] if (content or "").startswith(sent) else ""
                delta.tool_calls = [ToolCallDelta(index=i, **c.model_dump()) for i, c in enumerate(calls)]
                finish = calls_finish
        # lantern_route: an extra field (extra="allow"), as the browser's router adds it (router.ts)
        return ChatCompletionChunk(
            id=self.id,
            created=self.created,
            model=self.slot.name,  # type: ignore[call-arg]
            usage=step.usage,
            choices=[
                ChunkChoice(
                    delta=delta,
                    finish_reason=finish,
                    logprobs=Logprobs(content=step.logprobs) if self.logprobs_on and step.logprobs else None,
                )
            ],
            lantern_route="cloud",
            **(self.extra if first else {}),
        )

    def final(self, steps: list[Step]) -> ChatCompletion:
        lps = [lp for s in steps for lp in (s.logprobs or [])]
        parts = [self.split(s) for s in steps]
        thought = "".join(r or "" for r, _ in parts) if self.splitter else None
        content, calls, finish = self.split_calls("".join(c for _, c in parts))
        last = steps[-1]
        assert last.usage is not None and last.finish is not None  # the terminal step of a request that ran
        # lantern_route: an extra field (extra="allow"), as the browser's router adds it (router.ts)
        return ChatCompletion(  # type: ignore[call-arg]
            id=self.id,
            created=self.created,
            model=self.slot.name,
            usage=last.usage,
            lantern_route="cloud",
            **self.extra,
            choices=[
                Choice(
                    message=AssistantMessage(content=content, reasoning_content=thought, tool_calls=calls),
                    finish_reason=finish or last.finish,
                    logprobs=Logprobs(content=lps) if self.logprobs_on else None,
                )
            ],
        )
