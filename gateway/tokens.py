"""Prompt tokens without a tokenizer: the stand-in the gateway and the emulated engine share.

The gateway estimates a prompt's size for admission and routing before any engine sees it, and
the emulated engine has no model to tokenize with; both count the same way, so the gateway's
estimate of an emulated engine's prompt is exact:

* about four characters per token (OpenAI's rule of thumb for English): ``ceil(chars / 4)``,
  at least 1; a prompt given as token ids counts its ids;
* a chat counts each message plus :data:`CHAT_TOKENS_PER_MESSAGE` for the chat template's role
  markers, plus :data:`CHAT_REPLY_PRIMER_TOKENS` for the assistant header the template appends.
"""

from __future__ import annotations

from collections.abc import Sequence

CHARS_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_REPLY_PRIMER_TOKENS = 3

CompletionPrompt = str | list[str] | list[int] | list[list[int]]
"""OpenAI's ``prompt`` of ``/v1/completions``: text, token ids, or a batch of either."""


def count_text_tokens(text: str) -> int:
    """Prompt tokens of ``text`` under the ~4-characters-per-token stand-in (at least 1)."""
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def count_chat_tokens(contents: Sequence[str]) -> int:
    """Prompt tokens of a chat: each message's text plus the template's per-message overhead."""
    total = CHAT_REPLY_PRIMER_TOKENS
    for text in contents:
        total += CHAT_TOKENS_PER_MESSAGE + (-(-len(text) // CHARS_PER_TOKEN))
    return total


def count_prompt_tokens(prompt: CompletionPrompt) -> list[int]:
    """Tokens of each prompt of a completion request (one entry per prompt of a batch; an empty
    list of token ids counts 0, an empty batch has no entry)."""
    if isinstance(prompt, str):
        return [count_text_tokens(prompt)]
    if prompt and isinstance(prompt[0], int):
        return [len(prompt)]
    counts = []
    for part in prompt:
        if isinstance(part, str):
            counts.append(count_text_tokens(part))
        elif isinstance(part, list):
            counts.append(len(part))
    return counts
