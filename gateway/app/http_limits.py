"""What uvicorn is told about untrusted clients: how big a request head may be, how many header
fields it may have, and whose ``X-Forwarded-For`` to believe.

uvicorn's default parser (httptools) bounds neither the head nor the number of fields: it
accepted a 1 MiB header and 10,000 fields, holding them in memory until the head was complete
(h11's ``h11_max_incomplete_event_size`` bounds only a head that arrives in pieces). So the
gateway serves through :class:`HeadLimitedProtocol`, which answers 431 in the error dialect,
before the app runs, to a head over ``max_header_bytes`` (request line and headers) or with
more than ``max_headers`` fields; the memory a client can make the server hold for a head is
that bound plus one socket read. The request *body* is bounded by the app
(:class:`gateway.app.app.BodySizeLimit`, 413).

Behind a reverse proxy, the audit log's actor address (``admin-api:<client>``) must be the
client's, not the proxy's, and nobody else may choose it. uvicorn rewrites the client from
``X-Forwarded-For`` only for peers it trusts; it trusts 127.0.0.1 by default, so any local
process could name another address. :func:`http_options` turns the rewriting off unless
``TIERGATE_TRUSTED_PROXIES`` names the proxies.

Every ``uvicorn.Config`` that serves the gateway's API takes ``**http_options(settings)``.
"""

from __future__ import annotations

import importlib.util
import json
from functools import lru_cache
from typing import Any, ClassVar

from gateway.errors import ApiError
from gateway.settings import Settings

HEAD_TOO_LARGE = "request_header_fields_too_large"

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - see http_options
    HttpToolsProtocol = object  # type: ignore[assignment,misc]


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a head past a limit (httptools turns it
    into the parser error that uvicorn answers through ``send_400_response``)."""


class HeadLimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bound on the request head and its field count.

    Two checks, so that neither a head sent whole nor one sent a byte at a time slips by: while
    a head is incomplete after a read, the reads since it began are added up (this bounds a
    field the parser is still accumulating); and when a head is complete, its fields are
    counted and, if the reads it came in could hold more than the limit, its size is added up
    exactly. The common case, a small head in one read, costs a comparison or two.
    """

    max_head_bytes: ClassVar[int] = 16 * 1024
    max_headers: ClassVar[int] = 100

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_open = True  # the next bytes belong to a request head
        self._read_bytes = 0  # earlier reads since the open head began
        self._this_read = 0
        self._messages_done = 0
        self._refused: str | None = None

    def data_received(self, data: bytes) -> None:
        done_before = self._messages_done
        self._this_read = len(data)
        super().data_received(data)
        if not self._head_open or self._refused is not None or self.transport.is_closing():
            return
        if self._messages_done == done_before:
            self._read_bytes += len(data)  # the whole read belongs to this head
        else:  # a message ended in this read; the new head's share of it is not known
            self._read_bytes = 0
        if self._read_bytes > self.max_head_bytes:
            self._refuse(self._too_large())

    def on_headers_complete(self) -> None:
        if len(self.headers) > self.max_headers:
            self._refused = (
                f"Too many header fields: the limit is {self.max_headers}; send fewer headers."
            )
            raise _Refused
        if self._read_bytes + self._this_read > self.max_head_bytes:  # it may be over: count
            size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
            if size > self.max_head_bytes:
                self._refused = self._too_large()
                raise _Refused
        self._head_open = False
        self._read_bytes = 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._messages_done += 1
        self._head_open = True
        self._read_bytes = 0

    def _too_large(self) -> str:
        return (
            f"Request header fields too large: the request line and headers may take at most "
            f"{self.max_head_bytes} bytes."
        )

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers a parser error (which a callback's exception becomes) with a plain
        # 400; a limit this class enforced gets its own answer instead
        if self._refused is None:
            super().send_400_response(msg)
        else:
            self._refuse(self._refused)

    def _refuse(self, message: str) -> None:
        self._refused = message
        busy = self.cycle is not None and not self.cycle.response_complete
        if not busy:  # never write into the middle of an earlier (pipelined) answer
            self.transport.write(refusal_response(message))
        self.transport.close()


def http_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.Config``: the bounded parser and the proxy trust."""
    options: dict[str, Any] = {
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "proxy_headers": settings.trusted_proxies is not None,
    }
    if settings.trusted_proxies is not None:
        options["forwarded_allow_ips"] = settings.trusted_proxies
    if importlib.util.find_spec("httptools") is not None:
        options["http"] = head_limited_protocol(settings.max_header_bytes, settings.max_headers)
    else:  # pragma: no cover - uvicorn[standard] brings httptools; h11 bounds the bytes only
        options["http"] = "h11"
    return options


@lru_cache(maxsize=8)
def head_limited_protocol(max_head_bytes: int, max_headers: int) -> type[Any]:
    """:class:`HeadLimitedProtocol` with these limits (one class per pair of limits)."""
    name = f"HeadLimitedProtocol_{max_head_bytes}_{max_headers}"
    limits = {"max_head_bytes": max_head_bytes, "max_headers": max_headers}
    return type(name, (HeadLimitedProtocol,), limits)


def refusal_response(message: str) -> bytes:
    """A complete HTTP/1.1 431 answer in the error dialect; the connection closes after it."""
    body = json.dumps(ApiError(431, message, code=HEAD_TOO_LARGE).body()).encode()
    head = (
        "HTTP/1.1 431 Request Header Fields Too Large\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body
