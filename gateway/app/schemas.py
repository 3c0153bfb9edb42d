"""What the gateway checks in a request body before spending anything on it.

The fields of OpenAI's API are checked with OpenAI's own types, strictly: a boolean is ``true``
or ``false`` (not ``"yes"``, not ``1``), a number is a finite JSON number within OpenAI's
documented range (not ``Infinity``, not ``"0.7"``), an integer is a whole JSON number (``5`` or
``5.0``, not ``"5"``). The same mistake is then the same 400 and ``code`` here as on the admin
API (:func:`gateway.errors.invalid_body`). ``null`` stays allowed where it was (not for
``stream``). Ranges are OpenAI's, narrowed to vLLM's where vLLM refuses more (``top_p`` 0).

Every other field passes through to the engine untouched, so new OpenAI or vLLM parameters
(``top_k``, ``min_tokens``, ``guided_json``, ...) work without a gateway release.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from gateway.bounds import MAX_OUTPUT_TOKENS
from gateway.tokens import count_chat_tokens, count_prompt_tokens


def _whole_number(value: Any) -> Any:
    """JSON has one number type: ``5.0`` is the integer 5 (JSON Schema's ``integer``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Integer = Annotated[StrictInt, BeforeValidator(_whole_number)]
"""A whole JSON number; strings, booleans and fractions are the wrong type."""
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
"""A finite JSON number (integers included); strings and booleans are the wrong type."""
OutputTokens = Annotated[Integer, Field(ge=1, le=MAX_OUTPUT_TOKENS)]
Penalty = Annotated[Number, Field(ge=-2.0, le=2.0)]


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
    n: Annotated[Integer, Field(ge=1)] | None = None
    seed: Integer | None = None
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

    @property
    def prompt_param(self) -> str:
        raise NotImplementedError

    @property
    def exact_prompt(self) -> bool:
        """Whether :meth:`prompt_lengths` is exact on any engine (token ids), not an estimate."""
        return False


class _Message(_OpenAIObject):
    role: StrictStr
    content: StrictStr | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        if not self.content:
            return ""
        return "".join(str(p.get("text") or "") for p in self.content)


class ChatBody(_Body):
    messages: list[_Message] = Field(min_length=1)
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

    @property
    def prompt_param(self) -> str:
        return "messages"


TokenIds = list[Integer]


class CompletionBody(_Body):
    prompt: StrictStr | list[StrictStr] | TokenIds | list[TokenIds]
    echo: StrictBool | None = None
    logprobs: Integer | None = None
    best_of: Integer | None = None
    suffix: StrictStr | None = None

    def prompt_tokens(self) -> int:
        # at least one token per prompt, and per request (an empty batch still costs a step)
        return max(1, sum(max(1, n) for n in self.prompt_lengths()))

    def prompt_lengths(self) -> list[int]:
        return count_prompt_tokens(self.prompt)

    @property
    def prompt_param(self) -> str:
        return "prompt"

    @property
    def exact_prompt(self) -> bool:
        return not isinstance(self.prompt, str) and all(
            not isinstance(part, str) for part in self.prompt
        )
