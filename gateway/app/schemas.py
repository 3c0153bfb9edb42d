"""What the gateway checks in a request body before spending anything on it.

Only the fields the gateway itself reads are validated (model, streaming, lengths, the prompt's
presence and shape); everything else passes through to the engine untouched, so new OpenAI or
vLLM parameters work without a gateway release.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.tokens import count_chat_tokens, count_prompt_tokens


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))

    def expected_output(self) -> int | None:
        return self.max_tokens

    def prompt_tokens(self) -> int:
        raise NotImplementedError


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        if not self.content:
            return ""
        return "".join(str(p.get("text") or "") for p in self.content)


class ChatBody(_Body):
    messages: list[_Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def expected_output(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def prompt_tokens(self) -> int:
        return count_chat_tokens([m.text() for m in self.messages])


class CompletionBody(_Body):
    prompt: str | list[str] | list[int] | list[list[int]]

    def prompt_tokens(self) -> int:
        # at least one token per prompt, and per request (an empty batch still costs a step)
        return max(1, sum(max(1, n) for n in count_prompt_tokens(self.prompt)))
