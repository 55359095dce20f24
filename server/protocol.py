"""The OpenAI request and response shapes, once for Python (pydantic).

The TypeScript twin is webruntime/src/protocol.ts; tests validate the browser engine's real
responses against these models, so the two cannot drift apart silently.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..package import GENERATION_FIELDS as _GEN


class FunctionCall(BaseModel):
    name: str
    arguments: str  # a JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolCallDelta(ToolCall):
    index: int


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None


class FunctionDefinition(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class ResponseFormat(BaseModel):
    """OpenAI's text/json_object/json_schema, WebLLM's json_object + schema, Lantern's grammar and regex.

    Checked in depth (schema keywords, EBNF syntax) by lantern.server.structured.
    """

    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema", "grammar", "regex"]
    json_schema: dict[str, Any] | None = None  # {name, schema, strict}
    grammar: str | None = None
    pattern: str | None = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """The sampling fields both endpoints share (bounds as in OpenAI's API reference)."""

    model_config = ConfigDict(extra="allow")  # clients send fields such as `user`; they are ignored

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    # None: the artifact's default, else OpenAI's (ModelEngine.sampling); ranges: package.GENERATION_FIELDS
    temperature: float | None = Field(None, ge=_GEN["temperature"][1], le=_GEN["temperature"][2])
    top_p: float | None = Field(None, ge=_GEN["top_p"][1], le=_GEN["top_p"][2])
    top_k: int | None = Field(None, ge=_GEN["top_k"][1])
    repetition_penalty: float | None = Field(None, ge=_GEN["repetition_penalty"][1], le=_GEN["repetition_penalty"][2])
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    n: int = Field(1, ge=1, le=1)

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, v):
        for k, b in (v or {}).items():
            if not k.isdigit():
                raise ValueError(f"logit_bias keys are token ids, got {k!r}")
            if not -100 <= b <= 100:
                raise ValueError(f"logit_bias[{k}] must be in [-100, 100]")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else v or []
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return v

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    # extra chat-template variables, as vLLM and llama.cpp's server take them (Qwen3's enable_thinking)
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(SamplingFields):
    prompt: str
    echo: bool = False


FinishReason = Literal["stop", "length", "abort", "tool_calls"]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class Logprobs(BaseModel):
    content: list[TokenLogprob]


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # Lantern's timing extension, the same in the browser engine
    ttft_ms: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    tpot_ms: float
    # prompt tokens whose KV entries were reused (not prefilled again): Lantern's field, and OpenAI's
    cached_prompt_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None

    @model_validator(mode="after")
    def _openai_cached_tokens(self):
        if self.prompt_tokens_details is None:
            self.prompt_tokens_details = PromptTokensDetails(cached_tokens=self.cached_prompt_tokens)
        return self


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    # a reasoning model's <think> block (lantern.reasoning), as vLLM and llama.cpp's server return it
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: Logprobs | None = None


class ChatCompletion(BaseModel):
    model_config = ConfigDict(extra="allow")  # `lantern_route` etc.

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: Logprobs | None = None


class ChatCompletionChunk(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None
    logprobs: None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "lantern"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
