"""Request bodies the emulated engine accepts: OpenAI's, plus vLLM's ``priority``, ``vllm_xargs``,
``min_tokens`` and ``ignore_eos``.

Unknown fields are accepted and ignored, as vLLM does (sampling parameters change nothing when
the text is filler). Types of the fields that matter are checked; a bad body is a 400.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.engine_sim.mapping import RequestMappingError, count_chat_tokens, count_text_tokens


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
    priority: int = 0
    vllm_xargs: dict[str, Any] | None = None

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
    prompt: str | list[str] | list[int] | list[list[int]]

    def prompt_tokens(self) -> int:
        prompt = self.prompt
        if isinstance(prompt, str):
            return count_text_tokens(prompt)
        if not prompt:
            raise RequestMappingError("prompt must not be empty", "prompt")
        first = prompt[0]
        if isinstance(first, int):
            return len(prompt)
        if len(prompt) > 1:
            raise RequestMappingError(
                "the emulated engine serves one prompt per request, got a batch", "prompt"
            )
        if isinstance(first, str):
            return count_text_tokens(first)
        if not first:
            raise RequestMappingError("prompt must not be empty", "prompt")
        return len(first)


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
