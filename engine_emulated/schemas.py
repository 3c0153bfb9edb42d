"""Request bodies the emulated engine accepts: OpenAI's, plus vLLM's ``priority``, ``vllm_xargs``,
``min_tokens`` and ``ignore_eos``.

Unknown fields are accepted and ignored, as vLLM does (sampling parameters change nothing when
the text is filler). Types of the fields that matter are checked; a bad body is a 400.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engine_emulated.mapping import RequestMappingError
from gateway.tokens import CompletionPrompt, count_chat_tokens, count_prompt_tokens

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
XargValue = str | int | float | list[str | int | float]
"""What vLLM's API server accepts as a ``vllm_xargs`` value (anything else is its 400); what
the engine then makes of a ``tiergate_*`` value is :mod:`engine_common.protocol`'s rule."""


class _OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_OpenAIModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ContentPart(_OpenAIModel):
    type: str
    text: str | None = None


class ChatMessage(_OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        """The message's text (non-text parts such as images count as no text)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


class _GenerationRequest(_OpenAIModel):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    min_tokens: int = Field(default=0, ge=0)
    n: int = Field(default=1, ge=1, le=1, description="the emulated engine samples one choice")
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    priority: int = Field(default=0, ge=_INT64_MIN, le=_INT64_MAX)
    vllm_xargs: dict[str, XargValue] | None = None

    @field_validator("vllm_xargs")
    @classmethod
    def _msgpack_integers(cls, xargs: dict[str, XargValue] | None) -> dict[str, XargValue] | None:
        """vLLM's check (``SamplingParams._verify_extra_args``): its engine transport carries
        64-bit integers only."""
        for value in (xargs or {}).values():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, int) and not _INT64_MIN <= item < 2**64:
                    raise ValueError("extra_args integers must be between -2**63 and 2**64 - 1.")
        return xargs

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def prompt_tokens(self) -> int:
        raise NotImplementedError


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def prompt_tokens(self) -> int:
        return count_chat_tokens([m.text() for m in self.messages])


class CompletionRequest(_GenerationRequest):
    prompt: CompletionPrompt

    def prompt_tokens(self) -> int:
        counts = count_prompt_tokens(self.prompt)
        if len(counts) > 1:
            raise RequestMappingError(
                "the emulated engine serves one prompt per request, got a batch", "prompt"
            )
        if not counts or counts[0] == 0:
            raise RequestMappingError("prompt must not be empty", "prompt")
        return counts[0]


def describe_validation_error(exc: ValidationError) -> tuple[str, str | None]:
    """A one-line message naming the first offending field, and that field (OpenAI's
    ``param``); shared with the gateway's body checks (:mod:`gateway.app.schemas`)."""
    errors = exc.errors()
    first = errors[0]
    loc = ".".join(str(part) for part in first.get("loc", ()))
    message = f"{loc}: {first.get('msg', 'invalid value')}" if loc else first.get("msg", "")
    extra = len(errors) - 1
    if extra:
        message += f" (and {extra} more error{'s' if extra > 1 else ''})"
    return message, loc or None
