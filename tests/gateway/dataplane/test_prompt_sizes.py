"""The body stage counts a prompt once (``prompt_sizes``): the same numbers as counting the
total and each sequence's length apart, for every prompt shape."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.app.schemas import ChatBody, CompletionBody


@pytest.mark.parametrize(
    "prompt",
    ["hello there, general", ["a b c", "d"], [1, 2, 3], [[1, 2], [3, 4, 5, 6]]],
)
def test_completion_sizes_match_the_separate_counts(prompt: Any) -> None:
    body = CompletionBody.model_validate({"model": "m", "prompt": prompt})
    tokens, lengths = body.prompt_sizes()
    assert lengths == body.prompt_lengths() and tokens == body.prompt_tokens()
    assert tokens == max(1, sum(max(1, n) for n in lengths))


def test_completion_batch_has_one_length_per_sequence() -> None:
    body = CompletionBody.model_validate({"model": "m", "prompt": [[1, 2], [3, 4, 5, 6]]})
    assert body.prompt_sizes() == (6, [2, 4])


def test_chat_sizes_are_one_sequence_of_the_chat_count() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    body = ChatBody.model_validate({"model": "m", "messages": messages})
    tokens, lengths = body.prompt_sizes()
    assert tokens == body.prompt_tokens() > 0 and lengths == [tokens] == body.prompt_lengths()
