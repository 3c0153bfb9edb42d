"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with the right status.

Handlers raise :class:`ApiError`; the app's exception handlers turn it (and FastAPI's own
validation errors and admission rejections) into the JSON the ``openai`` client parses into its
typed exceptions (``AuthenticationError``, ``RateLimitError``, ...).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse

from gateway.limits import AdmissionRejected


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status: every 4xx is the client's, 429 rate limits."""
    if status == 429:
        return "rate_limit_exceeded"
    return "invalid_request_error" if 400 <= status < 500 else "server_error"


class ApiError(Exception):
    """An error answered to the client as OpenAI does."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}

    @classmethod
    def from_rejection(cls, exc: AdmissionRejected) -> ApiError:
        return cls(exc.status_code, exc.message, code=exc.reason.value, headers=exc.headers())

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": error_type(self.status),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    def sse_event(self) -> bytes:
        """The error as a final SSE event (a stream that already sent its 200 header)."""
        return b"data: " + json.dumps(self.body()).encode() + b"\n\n"


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key")


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, code="invalid_request", param=param)
