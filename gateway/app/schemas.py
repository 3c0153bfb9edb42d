"""What the gateway checks in a request body before spending anything on it.

The fields of OpenAI's API are checked with OpenAI's own types, strictly: a boolean is ``true``
or ``false`` (not ``"yes"``, not ``1``), a number is a finite JSON number within OpenAI's
documented range (not ``Infinity``, not ``"0.7"``), an integer is a whole JSON number (``5`` or
``5.0``, not ``"5"``). The same mistake is then the same 400 and ``code`` here as on the admin
API (:func:`gateway.errors.invalid_body`). ``null`` stays allowed where it was (not for
``stream``). Ranges are OpenAI's, narrowed to vLLM's where vLLM refuses more (``top_p`` 0).

A few values that OpenAI's types allow but vLLM refuses are refused here too, before a tenant's
limits or a backend are spent on them: a message ``role`` outside OpenAI's set, a content part
without a ``type``, an empty prompt (vLLM: "The decoder prompt cannot be empty"), a ``seed``
beyond 64 bits.

Every other field passes through to the engine untouched, so new OpenAI or vLLM parameters
(``top_k``, ``min_tokens``, ``guided_json``, ...) work without a gateway release.

The models' JSON Schemas are also the OpenAPI documentation of the `/v1` bodies
(:func:`gateway.app.app.document_v1`), as are the response shapes at the end of this module:
the gateway parses the raw body itself, so FastAPI never sees these models.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from gateway.bounds import MAX_OUTPUT_TOKENS
from gateway.tokens import count_chat_tokens, count_prompt_tokens


def _whole_number(value: Any) -> Any:
    """JSON has one number type: ``5.0`` is the integer 5 (JSON Schema's ``integer``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


WHOLE_NUMBER = BeforeValidator(_whole_number)
"""Makes a strict integer accept ``5.0``. Bounds go before it (``Annotated[StrictInt,
Field(ge=1), WHOLE_NUMBER]``): put after it, they still apply, but the JSON Schema (the OpenAPI
documentation) then shows them as pydantic's ``ge`` / ``le`` instead of ``minimum`` /
``maximum``, which JSON Schema ignores."""
Integer = Annotated[StrictInt, WHOLE_NUMBER]
"""A whole JSON number; strings, booleans and fractions are the wrong type."""
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
"""A finite JSON number (integers included); strings and booleans are the wrong type."""
OutputTokens = Annotated[StrictInt, Field(ge=1, le=MAX_OUTPUT_TOKENS), WHOLE_NUMBER]
Penalty = Annotated[Number, Field(ge=-2.0, le=2.0)]
Seed = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1), WHOLE_NUMBER]
"""vLLM's range (its sampler seeds a 64-bit generator): a larger seed is its 400."""
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
"""OpenAI's message roles; vLLM's chat template refuses any other."""


class OneOf:
    """``Annotated[StrictStr, OneOf("a", "b")]``: one of a few strings, documented as a JSON
    Schema ``enum``. Unlike a ``Literal``, a value of another type stays the wrong type (400
    ``invalid_type``, as everywhere); another string is ``invalid_value``."""

    def __init__(self, *choices: str) -> None:
        self.choices = choices
        *head, last = (repr(c) for c in choices)
        self._expected = f"{', '.join(head)} or {last}" if head else last

    def _check(self, value: str) -> str:
        if value not in self.choices:
            raise PydanticCustomError(
                "literal_error", "Input should be {expected}", {"expected": self._expected}
            )
        return value

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        out["enum"] = list(self.choices)
        return out


def worded(rule: str) -> WrapValidator:
    """Word a string's failure of the constraints before it (``pattern``, ``min_length``,
    ``max_length``: documented in the JSON Schema) as one ``rule`` a person can follow, instead
    of pydantic's "String should match pattern '^[A-Za-z0-9]...'". Still 400 ``invalid_value``;
    a value that is not a string stays ``invalid_type``."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            if any(e["type"] in _STRING_CONSTRAINTS for e in exc.errors()):
                raise PydanticCustomError("string_pattern_mismatch", rule) from None
            raise

    return WrapValidator(check)


_STRING_CONSTRAINTS = frozenset({"string_pattern_mismatch", "string_too_short", "string_too_long"})


class _OpenAIObject(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_OpenAIObject):
    include_usage: StrictBool | None = None


class _Body(_OpenAIObject):
    """The fields both endpoints share (OpenAI's ranges; ``n`` and the rest uncapped above, as
    vLLM serves more than OpenAI's caps)."""

    model: StrictStr = Field(min_length=1)
    stream: StrictBool = False  # not null: the gateway never took it, the emulated engine won't
    stream_options: StreamOptions | None = None
    max_tokens: OutputTokens | None = None
    temperature: Annotated[Number, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[Number, Field(gt=0.0, le=1.0)] | None = None  # 0 is vLLM's 400 anyway
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    n: Annotated[StrictInt, Field(ge=1), WHOLE_NUMBER] | None = None
    seed: Seed | None = None
    stop: StrictStr | list[StrictStr] | None = None
    logit_bias: dict[str, Number] | None = None
    user: StrictStr | None = None
    vllm_xargs: dict[str, Any] | None = None  # the gateway adds its keys to it: an object

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def expected_output(self) -> int | None:
        return self.max_tokens

    def output_param(self) -> str:
        """The field that set :meth:`expected_output` (named in a context-length error)."""
        return "max_tokens"

    def prompt_tokens(self) -> int:
        raise NotImplementedError

    def prompt_lengths(self) -> list[int]:
        """Each sequence's prompt tokens (a completion batch has several, each its own
        context)."""
        raise NotImplementedError

    def prompt_sizes(self) -> tuple[int, list[int]]:
        """:meth:`prompt_tokens` and :meth:`prompt_lengths` from one count (admission needs
        both, and counting is the costly part)."""
        raise NotImplementedError

    @property
    def prompt_param(self) -> str:
        raise NotImplementedError

    @property
    def exact_prompt(self) -> bool:
        """Whether :meth:`prompt_lengths` is exact on any engine (token ids), not an estimate."""
        return False


class ContentPart(_OpenAIObject):
    """A part of a message's content: ``{"type": "text", "text": ...}``, or another kind
    (``image_url``, ...) whose fields pass on to the engine; every part names its ``type``."""

    type: StrictStr
    text: StrictStr | None = None


class ChatMessage(_OpenAIObject):
    role: Annotated[StrictStr, OneOf(*ROLES)]
    content: StrictStr | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        if not self.content:
            return ""
        return "".join(p.text or "" for p in self.content)


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: OutputTokens | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Integer | None = None
    parallel_tool_calls: StrictBool | None = None

    def expected_output(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def output_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"

    def prompt_tokens(self) -> int:
        return count_chat_tokens([m.text() for m in self.messages])

    def prompt_lengths(self) -> list[int]:
        return [self.prompt_tokens()]

    def prompt_sizes(self) -> tuple[int, list[int]]:
        tokens = self.prompt_tokens()
        return tokens, [tokens]

    @property
    def prompt_param(self) -> str:
        return "messages"


Prompt = Annotated[StrictStr, Field(min_length=1)]
TokenIds = Annotated[list[Integer], Field(min_length=1)]


class CompletionBody(_Body):
    # No empty prompt, alone or in a batch, and no empty batch: vLLM refuses a prompt of no
    # tokens ("The decoder prompt cannot be empty"), and an empty text is one for most models.
    prompt: (
        Prompt
        | Annotated[list[Prompt], Field(min_length=1)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1)]
    )
    echo: StrictBool | None = None
    logprobs: Integer | None = None
    best_of: Integer | None = None
    suffix: StrictStr | None = None

    def prompt_tokens(self) -> int:
        return self.prompt_sizes()[0]

    def prompt_lengths(self) -> list[int]:
        return count_prompt_tokens(self.prompt)

    def prompt_sizes(self) -> tuple[int, list[int]]:
        lengths = self.prompt_lengths()
        # validation leaves no empty prompt; the floors keep the estimate positive regardless
        return max(1, sum(max(1, n) for n in lengths)), lengths

    @property
    def prompt_param(self) -> str:
        return "prompt"

    @property
    def exact_prompt(self) -> bool:
        return not isinstance(self.prompt, str) and all(
            not isinstance(part, str) for part in self.prompt
        )


# ---- what the engines answer (documentation: the gateway relays the engine's bytes) ----------
#
# OpenAI's shapes as vLLM fills them, permissive as a client should read them: every object
# allows more fields (vLLM adds ``stop_reason``, ``prompt_logprobs``, ``kv_transfer_params``...),
# and only what every OpenAI-compatible engine sends is required.


class Usage(_OpenAIObject):
    prompt_tokens: int
    completion_tokens: int | None = None  # vLLM's type allows null
    total_tokens: int


class AssistantMessage(_OpenAIObject):
    role: str
    content: str | None = None


class ChatChoice(_OpenAIObject):
    index: int
    message: AssistantMessage
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class ChatCompletion(_OpenAIObject):
    """``POST /v1/chat/completions`` without ``stream``: the whole answer."""

    id: str
    object: str  # "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ChatDelta(_OpenAIObject):
    role: str | None = None
    content: str | None = None


class ChatChunkChoice(_OpenAIObject):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class ChatCompletionChunk(_OpenAIObject):
    """One event of a streamed chat completion; the last one before ``[DONE]`` may have no
    choices and the ``usage`` (``stream_options.include_usage``)."""

    id: str
    object: str  # "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(_OpenAIObject):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class Completion(_OpenAIObject):
    """``POST /v1/completions``: the whole answer, or (streamed) one event of it, whose last
    one before ``[DONE]`` may have no choices and the ``usage``."""

    id: str
    object: str  # "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
