"""The context-length check: a request no backend's context can hold is the client's mistake.

It is answered 400 ``context_length_exceeded`` (OpenAI's code, which the ``openai`` client does
not retry) before limits are reserved or the SLO's feasibility is judged — whatever the SLO.
Without it, a long prompt under a tight default SLO was shed as ``503 slo_infeasible`` (which
clients retry) and got its 400 only from the engine under a loose one.

**The window.** Each backend's ``max_model_len``, as the pool learned it from the engine: its
config info on ``/metrics``, else its model card (``GET /v1/models``; vLLM and the emulated
engine both publish it), which the load scrapes read at a backend's first scrape and again
now and then (:mod:`gateway.app.backend_scrapes`). Nothing is read on a request's path. Until
a backend's card has been read (the first scrape after start or a pool reload), or while
neither its config info nor its card gives a length, its window is unknown and the engine
alone decides, as before. A model's
window is the largest of its healthy backends' (the router may pick any of them).

**Certain or not.** The gateway counts prompt tokens without the engine's tokenizer
(:mod:`gateway.tokens`). The count is exact for token-id prompts, and for engines that count
the same way (the emulated engine says so in its card); ``max_tokens`` alone at or beyond the
window is certain too (a prompt has at least one token). Those are refused here. A text prompt
on a real engine is only estimated (about four characters a token): an estimate beyond the
window is no proof, so the request is neither refused nor shed as SLO-infeasible — the engine's
tokenizer decides, and its own 400 passes through.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from gateway.app.backends import ModelGroup
from gateway.errors import ApiError

CONTEXT_LENGTH_EXCEEDED: Final = "context_length_exceeded"


@dataclass(frozen=True, slots=True)
class ContextWindow:
    """What a model's healthy backends can hold."""

    tokens: int
    """The largest ``max_model_len`` among them: prompt plus output, per sequence."""
    exact: bool
    """Every one of them counts prompt tokens as :mod:`gateway.tokens` does."""


def context_window(group: ModelGroup) -> ContextWindow | None:
    """The window of ``group``'s healthy backends, from what the pool knows of them; None when
    any of theirs is unknown (a card not read yet, or no length in it)."""
    tokens, exact, healthy = 0, True, False
    for backend in group.backends:
        if not backend.view.healthy:
            continue
        healthy = True
        length, card = backend.max_model_len, backend.card
        if length is None or card is None:  # no card yet: whether it counts exactly is unknown
            return None
        tokens = max(tokens, length)
        exact = exact and (card.emulated or backend.spec.kind == "emulated")
    return ContextWindow(tokens, exact) if healthy else None  # none healthy: routing's 503


def check_context(
    window: ContextWindow,
    prompts: Sequence[int],
    max_tokens: int | None,
    *,
    exact_prompt: bool,
    prompt_param: str,
    output_param: str,
) -> bool:
    """Whether the request fits ``window``: raises :class:`ApiError` 400 when it certainly does
    not; returns False when only an estimate says it does not (the engine decides), True when
    it fits.

    A sequence needs ``prompt + max_tokens`` tokens, or ``prompt + 1`` without ``max_tokens``
    (vLLM's rule, and the emulated engine's).
    """
    limit = window.tokens
    longest = max(prompts, default=1)
    output = max_tokens or 1
    if longest + output <= limit:
        return True
    if max_tokens is not None and max_tokens >= limit:
        raise _exceeded(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{max_tokens} tokens in the completion, which leaves no room for a prompt. Please "
            f"reduce {output_param}.",
            output_param,
        )
    if exact_prompt or window.exact:
        raise _exceeded(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{longest + output} tokens ({longest} in the {prompt_param}, {output} in the "
            f"completion). Please reduce the length of the {prompt_param} or completion.",
            prompt_param,
        )
    return False


def _exceeded(message: str, param: str) -> ApiError:
    return ApiError(400, message, code=CONTEXT_LENGTH_EXCEEDED, param=param)
