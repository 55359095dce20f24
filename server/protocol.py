"""The OpenAI request and response shapes, once for Python (pydantic).

The TypeScript twin is webruntime/src/protocol.ts; tests validate the browser engine's real
responses against these models, so the two cannot drift apart silently. A request is first held to
the rules of request_rules.json (request_rules.py, the browser's request_rules.ts reads the same file), so
its 400 says what the browser's InvalidRequestError says; pydantic then types what passed.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator
from pydantic_core import PydanticCustomError

from .. import request_rules

_SHARED, _CHAT = request_rules.RULES["shared"], request_rules.RULES["endpoints"]["chat"]


def _field(rule: dict) -> Any:
    """A pydantic Field with a table rule's default and bounds (for the OpenAPI schema: the table's
    own checks run first, so pydantic never words an error about them)."""
    bounds = {"ge": rule["min"]} if "min" in rule else {}
    if "max" in rule:
        bounds["le"] = rule["max"]
    return Field(rule.get("default"), **bounds)


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

    # developer: OpenAI's, a system message to the chat template (request_rules.template_messages)
    role: Literal["system", "developer", "user", "assistant", "tool"]
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


class SchemaDefaults(BaseModel):
    """Bounds for a schema's unbounded strings and arrays, and the DRY penalty of an answer under a
    response_format (request_rules.json's schema_defaults)."""

    maxLength: int = _field(_CHAT["schema_defaults"]["fields"]["maxLength"])  # noqa: N815 (the schema keyword)
    maxItems: int = _field(_CHAT["schema_defaults"]["fields"]["maxItems"])  # noqa: N815
    dryMultiplier: float = _field(_CHAT["schema_defaults"]["fields"]["dryMultiplier"])  # noqa: N815


class StreamOptions(BaseModel):
    include_usage: bool = _field(_SHARED["stream_options"]["fields"]["include_usage"])


class SpeculationOptions(BaseModel):
    """Lantern's ``speculation`` request field (speculation.py)."""

    mode: str = _field(_SHARED["speculation"]["fields"]["mode"])
    max_tokens: int = _field(_SHARED["speculation"]["fields"]["max_tokens"])


class SamplingFields(BaseModel):
    """The sampling fields both endpoints share (rules, bounds and defaults: request_rules.json)."""

    model_config = ConfigDict(extra="allow")  # clients send fields such as `user`; they are ignored
    endpoint: ClassVar[str | None] = None  # whose rules apply besides the shared ones ("chat", "completions")

    model: str | None = _field(_SHARED["model"])
    stream: bool = _field(_SHARED["stream"])
    stream_options: StreamOptions = Field(default_factory=StreamOptions)
    max_tokens: int | None = _field(_SHARED["max_tokens"])
    max_completion_tokens: int | None = _field(_SHARED["max_completion_tokens"])
    # None: the artifact's default, else OpenAI's (Generator.sampling)
    temperature: float | None = _field(_SHARED["temperature"])
    top_p: float | None = _field(_SHARED["top_p"])
    top_k: int | None = _field(_SHARED["top_k"])
    repetition_penalty: float | None = _field(_SHARED["repetition_penalty"])
    frequency_penalty: float = _field(_SHARED["frequency_penalty"])
    presence_penalty: float = _field(_SHARED["presence_penalty"])
    dry_multiplier: float | None = _field(_SHARED["dry_multiplier"])  # None: Generator.sampling decides
    dry_base: float = _field(_SHARED["dry_base"])
    dry_allowed_length: int = _field(_SHARED["dry_allowed_length"])
    dry_penalty_last_n: int = _field(_SHARED["dry_penalty_last_n"])
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = _field(_SHARED["seed"])
    logprobs: bool = _field(_SHARED["logprobs"])
    top_logprobs: int | None = _field(_SHARED["top_logprobs"])
    n: int = _field(_SHARED["n"])
    speculation: SpeculationOptions = Field(default_factory=SpeculationOptions)
    _sent: frozenset[str] = PrivateAttr(default=frozenset())  # the fields the JSON gave (not null)
    # the server's own (not in request_rules.json: the browser engine takes an AbortSignal): seconds
    # until the request ends with finish_reason "timeout" (504 unstreamed), its wait in the queue included
    timeout: float | None = Field(None, gt=0, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _request_rules(cls, data: Any) -> Any:
        """The table's rules on the JSON as sent (nulls dropped, defaults filled); a broken rule is a
        validation error of its own type, which the app answers with the rule's message as it is."""
        if isinstance(data, BaseModel):  # a request already parsed
            return data
        try:
            return request_rules.checked(data, cls.endpoint)
        except request_rules.RuleError as err:
            context = {"message": err.message, "param": err.param}
            raise PydanticCustomError("request_rule", "{message}", context) from None

    @model_validator(mode="wrap")
    @classmethod
    def _remember_sent(cls, data: Any, handler):
        """Which fields the JSON itself gave, before the table's defaults fill the rest (``sent``)."""
        model = handler(data)
        if isinstance(data, dict):
            model._sent = frozenset(k for k, v in data.items() if v is not None)
        return model

    def sent(self, name: str) -> bool:
        """Whether the request as sent gave ``name`` (a default the rules filled in is not)."""
        return name in self._sent

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class ChatCompletionRequest(SamplingFields):
    endpoint: ClassVar[str | None] = "chat"

    messages: list[ChatMessage] = Field(min_length=1)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = _field(_CHAT["parallel_tool_calls"])
    # extra chat-template variables, as vLLM and llama.cpp's server take them (Qwen3's enable_thinking)
    chat_template_kwargs: dict[str, Any] | None = None
    # Lantern's bounds for a schema's unbounded strings and arrays
    schema_defaults: SchemaDefaults = Field(default_factory=SchemaDefaults)


class CompletionRequest(SamplingFields):
    endpoint: ClassVar[str | None] = "completions"

    prompt: str
    echo: bool = _field(request_rules.RULES["endpoints"]["completions"]["echo"])

    @model_validator(mode="after")
    def _no_chat_constraints(self) -> CompletionRequest:
        """Chat's constraints are refused here, not ignored as other unknown fields are: the answer
        would not hold to them."""
        for param in ("response_format", "tools", "tool_choice"):
            if param in (self.model_extra or {}):
                raise PydanticCustomError(
                    "request_rule",
                    "{message}",
                    {"message": f"{param} is a /v1/chat/completions field; /v1/completions answers plain text", "param": param},
                )
        return self


# "timeout": `lantern serve` only, a request past its `timeout` (a stream then ends with an error event)
FinishReason = Literal["stop", "length", "abort", "tool_calls", "timeout"]


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


class CompletionTokensDetails(BaseModel):
    """OpenAI's names for guessed tokens (its predicted outputs): drafts the answer took, and drafts
    checked and dropped."""

    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class DraftCounts(BaseModel):
    proposed: int  # drafts checked in a forward pass
    accepted: int  # drafts the answer took


class SpeculationUsage(BaseModel):
    """What speculation did in one answer (speculation.py): each source's drafts, and the forward passes
    after the prompt's (without speculation: one per token)."""

    grammar: DraftCounts
    lookup: DraftCounts
    draft: DraftCounts  # the draft model's (an artifact built with --draft)
    forward_passes: int


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
    # Lantern's: where the llamacpp engine speculated (absent: it did not), and OpenAI's totals of it
    speculation: SpeculationUsage | None = None
    completion_tokens_details: CompletionTokensDetails | None = None

    @model_validator(mode="after")
    def _openai_details(self):
        if self.prompt_tokens_details is None:
            self.prompt_tokens_details = PromptTokensDetails(cached_tokens=self.cached_prompt_tokens)
        if self.speculation is not None and self.completion_tokens_details is None:
            drafts = (self.speculation.grammar, self.speculation.lookup, self.speculation.draft)
            accepted = sum(d.accepted for d in drafts)
            self.completion_tokens_details = CompletionTokensDetails(
                accepted_prediction_tokens=accepted, rejected_prediction_tokens=sum(d.proposed for d in drafts) - accepted
            )
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


class _Response(BaseModel):
    """The fields of every completion and stream chunk, in OpenAI's order: each kind narrows
    ``object`` and ``choices`` (and may require ``usage``)."""

    id: str
    object: str
    created: int
    model: str
    choices: list
    usage: Usage | None = None


class ChatCompletion(_Response):
    model_config = ConfigDict(extra="allow")  # `lantern_route` etc.

    object: Literal["chat.completion"] = "chat.completion"
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


class ChatCompletionChunk(_Response):
    model_config = ConfigDict(extra="allow")

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChunkChoice]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None
    logprobs: None = None


class Completion(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


_EMBEDDINGS = request_rules.RULES["endpoints"]["embeddings"]


class EmbeddingRequest(BaseModel):
    """POST /v1/embeddings (OpenAI's shape; ``truncate`` is Lantern's). The table's rules run first."""

    model_config = ConfigDict(extra="allow")

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = _field(_EMBEDDINGS["encoding_format"])
    dimensions: int | None = None
    truncate: bool = _field(_EMBEDDINGS["truncate"])

    @model_validator(mode="before")
    @classmethod
    def _request_rules(cls, data: Any) -> Any:
        if isinstance(data, BaseModel):
            return data
        try:
            return request_rules.checked(data, "embeddings")
        except request_rules.RuleError as err:
            raise PydanticCustomError("request_rule", "{message}", {"message": err.message, "param": err.param}) from None

    def token_limit(self) -> None:
        return None  # nothing is generated (admission.Server.slot_for asks every request)

    def inputs(self) -> list[str] | list[list[int]]:
        """The input as a list of texts or of token lists."""
        value: Any = self.input  # the request rules checked its shape: one of the four
        if isinstance(value, str):
            return [value]
        if value and all(isinstance(t, int) for t in value):
            return [list(value)]  # one token list
        return list(value)


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # base64: the float32 values' little-endian bytes, as OpenAI sends them


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


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
