"""The context-length check: a request no backend's context can hold is the client's mistake.

It is answered 400 ``context_length_exceeded`` (OpenAI's code, which the ``openai`` client does
not retry) before limits are reserved or the SLO's feasibility is judged — whatever the SLO.
Without it, a long prompt under a tight default SLO was shed as ``503 slo_infeasible`` (which
clients retry) and got its 400 only from the engine under a loose one.

**The window.** Each backend's ``max_model_len``, from its model card (``GET /v1/models``; vLLM
and the emulated engine both publish it), read the first time a request for its model needs it,
then re-read in the background every :data:`REFRESH_S` (a pool reload builds new backends,
which are asked afresh). A card that cannot be read is asked for again after :data:`RETRY_S`;
until then the window is unknown and the engine alone decides, as before. A model's window is
the largest of its healthy backends' (the router may pick any of them).

**Certain or not.** The gateway counts prompt tokens without the engine's tokenizer
(:mod:`gateway.tokens`). The count is exact for token-id prompts, and for engines that count
the same way (the emulated engine says so in its card); ``max_tokens`` alone at or beyond the
window is certain too (a prompt has at least one token). Those are refused here. A text prompt
on a real engine is only estimated (about four characters a token): an estimate beyond the
window is no proof, so the request is neither refused nor shed as SLO-infeasible — the engine's
tokenizer decides, and its own 400 passes through.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final
from weakref import WeakKeyDictionary

from gateway.app.backends import Backend, ModelGroup
from gateway.app.upstream import Upstream, UpstreamError
from gateway.errors import ApiError

log = logging.getLogger(__name__)

CONTEXT_LENGTH_EXCEEDED: Final = "context_length_exceeded"
CARD_TIMEOUT_S: Final = 2.0
RETRY_S: Final = 30.0
"""How long a backend whose card could not be read goes without the check before it is asked
again (one request then waits for the answer, at most :data:`CARD_TIMEOUT_S`)."""
REFRESH_S: Final = 300.0
"""How old a known card may be before it is read again, in the background (an engine restarted
with another ``--max-model-len`` under the same address is seen within this time)."""


@dataclass(frozen=True, slots=True)
class ContextWindow:
    """What a model's healthy backends can hold."""

    tokens: int
    """The largest ``max_model_len`` among them: prompt plus output, per sequence."""
    exact: bool
    """Every one of them counts prompt tokens as :mod:`gateway.tokens` does."""


@dataclass(frozen=True, slots=True)
class _Card:
    max_model_len: int | None  # None: unknown (no card, or none for this model)
    exact: bool
    read_at: float

    @property
    def known(self) -> bool:
        return self.max_model_len is not None

    def fresh(self, now: float) -> bool:
        return now - self.read_at < (REFRESH_S if self.known else RETRY_S)


_cards: WeakKeyDictionary[Backend, _Card] = WeakKeyDictionary()
_reading: WeakKeyDictionary[Backend, asyncio.Future[_Card]] = WeakKeyDictionary()


async def context_window(group: ModelGroup, upstream: Upstream) -> ContextWindow | None:
    """The window of ``group``'s healthy backends; None when any of theirs is unknown."""
    backends = [b for b in group.backends if b.view.healthy]
    if not backends:
        return None  # routing answers this one (503 no_healthy_backend)
    now = time.monotonic()
    cards = [_cards.get(b) for b in backends]
    if any(c is None or not c.fresh(now) for c in cards):
        cards = list(await asyncio.gather(*(_card(b, upstream, now) for b in backends)))
    known = [c for c in cards if c is not None and c.known]
    if len(known) < len(backends):
        return None
    return ContextWindow(max(c.max_model_len or 0 for c in known), all(c.exact for c in known))


async def _card(backend: Backend, upstream: Upstream, now: float) -> _Card:
    """The backend's card: a known one at once (re-read in the background once stale), an
    unknown one after reading it (again, once :data:`RETRY_S` has passed)."""
    card = _cards.get(backend)
    if card is not None and card.known:
        if not card.fresh(now):
            _read(backend, upstream)
        return card
    if card is not None and card.fresh(now):
        return card
    # shielded: a client that leaves must not cancel the read the others wait for
    return await asyncio.shield(_read(backend, upstream))


def _read(backend: Backend, upstream: Upstream) -> asyncio.Future[_Card]:
    """The read of the backend's card under way, started if none is: one per backend, however
    many requests wait for it (``_reading`` holds the task until it is done)."""
    reading = _reading.get(backend)
    if reading is None:
        reading = asyncio.ensure_future(_read_card(backend, upstream))
        _reading[backend] = reading
    return reading


async def _read_card(backend: Backend, upstream: Upstream) -> _Card:
    try:
        url = f"{backend.spec.root_url}/v1/models"
        try:
            document = json.loads(await upstream.get_text(url, CARD_TIMEOUT_S))
        except (UpstreamError, ValueError) as exc:
            log.info("backend %s: no model card, context length unknown (%s)", backend.name, exc)
            previous = _cards.get(backend)
            if previous is not None and previous.known:  # a refresh that failed: keep it
                card = dataclasses.replace(previous, read_at=time.monotonic())
                _cards[backend] = card
                return card
            document = None
        card = _parse_card(document, backend)
        _cards[backend] = card
        return card
    finally:
        _reading.pop(backend, None)


def _parse_card(document: Any, backend: Backend) -> _Card:
    """The card of ``backend``'s model in a ``/v1/models`` answer (vLLM's shape)."""
    entries = document.get("data") if isinstance(document, dict) else None
    entry = next(
        (e for e in entries or () if isinstance(e, dict) and e.get("id") == backend.spec.model),
        None,
    )
    length = entry.get("max_model_len") if entry is not None else None
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        return _Card(None, False, time.monotonic())
    extension = entry.get("tiergate") if entry is not None else None
    emulated = isinstance(extension, dict) and extension.get("emulated") is True
    return _Card(length, backend.spec.kind == "emulated" or emulated, time.monotonic())


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
