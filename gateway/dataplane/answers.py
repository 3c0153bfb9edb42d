"""What an engine answered, as dispatch and the relay read it: its errors in the gateway's
dialect, the checks that tell an event from garbage, the usage it reports, and the two ways an
attempt ends before its first token (failed, or refused).

One module for both stages, so that an error event reads the same whether it comes before the
first token (dispatch) or after it (the relay).
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

from gateway.errors import INVALID_REQUEST, ApiError

if TYPE_CHECKING:
    from gateway.app.proxy import Job


class UpstreamFailed(Exception):
    """An attempt failed (before its first token: try another backend).

    ``recorded``: the backend's breaker has been told already (a timeout); ``abandoned``: the
    attempt was given up because the breaker had opened, which says nothing new about it."""

    def __init__(self, message: str, *, recorded: bool = False, abandoned: bool = False) -> None:
        super().__init__(message)
        self.recorded = recorded
        self.abandoned = abandoned


class EngineRefused(Exception):
    """The engine refused the request in its stream's first event (a 4xx error event): the
    client's answer, as if the engine had answered that status."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


ENGINE_ERROR = "engine_error"
"""``code`` of an engine's server error that carried no string code of its own."""

MALFORMED = "the engine sent a malformed event (not an SSE data line with a JSON object)"


def engine_error(status: int | None, content: bytes) -> ApiError:
    """An engine's error answer (a body, or an SSE event's data) in the gateway's dialect.

    vLLM's ``{"error": {"message", "type": "BadRequestError", "param", "code": 400}}`` (or its
    older flat ``{"object": "error", ...}``, or FastAPI's ``{"detail": ...}``) keeps its
    message, ``param`` and status: ``status``, else the integer ``code`` of an SSE error event,
    else 400 for OpenAI's ``invalid_request_error``, else 500. ``type`` comes from the status
    (:func:`~gateway.errors.error_type`, as for every gateway error) and ``code`` is a string:
    the engine's own if it had one (OpenAI's engines do), else ``invalid_request`` for a 4xx
    and ``engine_error`` otherwise.
    """
    try:
        payload: object = json.loads(content)
    except (ValueError, RecursionError):  # not JSON (a proxy's HTML page): its text is the news
        payload = content.decode("utf-8", "replace").strip()
    return _engine_error_of(payload, status)


def _engine_error_of(payload: object, status: int | None) -> ApiError:
    fields: dict[str, Any] = {}
    if isinstance(payload, dict):
        inner = payload.get("error")
        fields = inner if isinstance(inner, dict) else payload
    raw_code = fields.get("code")
    if status is None:  # an SSE error event: vLLM's code is its status; OpenAI's type says 4xx
        status = 400 if fields.get("type") == "invalid_request_error" else 500
        if isinstance(raw_code, int) and not isinstance(raw_code, bool) and 400 <= raw_code < 600:
            status = raw_code
    message = fields.get("message")
    if not isinstance(message, str) or not message:
        detail = fields.get("detail", payload if isinstance(payload, str) else None)
        if detail is not None and not isinstance(detail, str):  # FastAPI's list of problems
            detail = json.dumps(detail)
        message = detail[:_MAX_DETAIL] if detail else None
    if message is None:
        message = f"the engine answered HTTP {status} without a message"
    if isinstance(raw_code, str) and raw_code:
        code = _printable(raw_code)
    else:
        code = INVALID_REQUEST if 400 <= status < 500 else ENGINE_ERROR
    param = fields.get("param")
    return ApiError(
        status,
        _printable(message),
        code=code,
        param=_printable(param) if isinstance(param, str) else None,
    )


_MAX_DETAIL = 2000
"""Characters kept of an error that is not the engine's JSON (a proxy's HTML page)."""


def _printable(text: str) -> str:
    """``text`` encodable as UTF-8: an engine may echo a client's lone surrogate (``\\ud800``,
    which JSON can carry and UTF-8 cannot); it is kept as that escape, visible."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def has_output(event: bytes) -> bool:
    """Whether an SSE event carries generated text (vLLM first sends a role-only chunk).

    Parsed in full (only events up to the first token are): anything but a ``data:`` line
    holding a JSON object, ``[DONE]`` or an SSE comment is garbage (:class:`UpstreamFailed`), as
    is an engine's server error; an engine's 4xx error is :class:`EngineRefused`."""
    if event.startswith((b"data: [DONE]", b":")):
        return False
    data = json_object(event[6:]) if event.startswith(b"data: ") else None
    if data is None:
        raise UpstreamFailed(MALFORMED)
    if "error" in data:
        error = _engine_error_of(data, None)
        if 400 <= error.status < 500:
            raise EngineRefused(error)
        raise UpstreamFailed(f"engine error before the first token: {error.message}")
    choices = data.get("choices") or ()
    if not isinstance(choices, list):
        raise UpstreamFailed(MALFORMED)
    for choice in choices:
        if not isinstance(choice, dict):
            raise UpstreamFailed(MALFORMED)
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise UpstreamFailed(MALFORMED)
        if choice.get("text") or delta.get("content"):
            return True
        if choice.get("finish_reason") is not None or delta.get("tool_calls"):
            return True
    return False


def well_formed(event: bytes) -> bool:
    """A cheap structural check of a relayed event (every token passes here, so no parse):
    one ``data:`` line whose payload starts and ends like a JSON object."""
    return (
        event.startswith(b"data: {")
        and event.endswith(b"}\n\n")
        and event.find(b"\n") == len(event) - 2
    )


def json_object(content: bytes) -> dict[str, Any] | None:
    """``content`` parsed, if it is a JSON object (an engine's answer); else None."""
    try:
        value = json.loads(content)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
        return None
    return value if isinstance(value, dict) else None


def read_usage(job: Job, content: bytes) -> None:
    """The usage an answer (or a stream's usage chunk) reports, if it is a JSON object."""
    answer = json_object(content)
    if answer is not None:
        take_usage(job, answer)


def take_usage(job: Job, answer: dict[str, Any]) -> None:
    """The engine's token counts onto the job (accounting prefers them to the gateway's)."""
    with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
        usage = answer.get("usage") or {}
        job.completion_tokens = int(usage["completion_tokens"])
        job.upstream_prompt_tokens = int(usage["prompt_tokens"])
