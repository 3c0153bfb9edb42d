"""Limits on the request head, against a real uvicorn server over a raw socket.

The gateway app (no backends) is served with ``http_options`` — what ``tiergate serve`` passes
to uvicorn — with small limits, so that the cases stay small: a head too large sent whole or a
piece at a time, too many header fields, and heads within the limits on one keep-alive
connection.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.app import create_app
from gateway.app.http_limits import HEAD_TOO_LARGE, HeadLimitedProtocol, http_options
from gateway.app.server import GatewayThread
from gateway.settings import Settings
from tests.gateway.seeded_app import app_settings, seed_database

MAX_HEAD = 4096
MAX_FIELDS = 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    root: Path = tmp_path_factory.mktemp("http-limits")
    url = f"sqlite:///{root / 'tiergate.db'}"
    engine, _ = seed_database(url, "secret")
    engine.dispose()
    settings = app_settings(
        url, root, "secret", "admin", max_header_bytes=MAX_HEAD, max_headers=MAX_FIELDS
    )
    # GatewayThread serves the app with its settings' http_options, as `tiergate serve` does.
    with GatewayThread(create_app(settings, backends=[])) as gateway:
        yield gateway.host, gateway.port


def _connect(server: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(server, timeout=10)
    return sock


def _head(*fields: bytes, path: bytes = b"/health/liveliness") -> bytes:
    lines = [b"GET " + path + b" HTTP/1.1", b"Host: test", *fields]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a content-length (what both answers here have)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    length = int(headers["content-length"])
    while len(body) < length:
        body += sock.recv(65536)
    return int(status_line.split()[1]), headers, body


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _refusal(status: int, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    assert status == 431, body
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    error: dict[str, Any] = json.loads(body)["error"]
    assert error["code"] == HEAD_TOO_LARGE and error["type"] == "invalid_request_error"
    return error


def test_heads_within_the_limits_are_served_on_one_connection(server: tuple[str, int]) -> None:
    near = b"X-Pad: " + b"p" * (MAX_HEAD - 200)
    fields = [b"X-F%d: v" % i for i in range(MAX_FIELDS - 2)]  # plus Host and nothing else
    with _connect(server) as sock:
        for head in (_head(near), _head(*fields), _head(near), _head()):
            sock.sendall(head)
            status, _, body = _read_response(sock)
            assert status == 200 and json.loads(body) == {"status": "ok"}


def test_a_head_over_the_limit_sent_whole_gets_431(server: tuple[str, int]) -> None:
    with _connect(server) as sock:
        sock.sendall(_head(b"X-Big: " + b"b" * MAX_HEAD))
        error = _refusal(*_read_response(sock))
        assert str(MAX_HEAD) in error["message"]
        assert _closed(sock)


def test_a_head_over_the_limit_sent_in_pieces_gets_431_before_it_ends(
    server: tuple[str, int],
) -> None:
    """A field that never ends: the server answers once it holds more than the limit."""
    with _connect(server) as sock:
        sock.sendall(b"GET /health/liveliness HTTP/1.1\r\nHost: test\r\nX-Slow: ")
        sent = 0
        while sent <= MAX_HEAD:
            sock.sendall(b"s" * 512)
            sent += 512
        _refusal(*_read_response(sock))
        assert _closed(sock)


def test_an_endless_request_line_gets_431(server: tuple[str, int]) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /" + b"u" * (MAX_HEAD + 10))
        _refusal(*_read_response(sock))


def test_too_many_header_fields_get_431(server: tuple[str, int]) -> None:
    fields = [b"X-F%d: v" % i for i in range(MAX_FIELDS)]  # with Host: one too many
    with _connect(server) as sock:
        sock.sendall(_head(*fields))
        error = _refusal(*_read_response(sock))
        assert f"the limit is {MAX_FIELDS}" in error["message"]
        assert _closed(sock)


def test_the_limits_follow_the_settings_and_default_to_16_kib_and_100_fields() -> None:
    defaults = http_options(Settings())
    protocol = defaults["http"]
    assert issubclass(protocol, HeadLimitedProtocol)
    assert (protocol.max_head_bytes, protocol.max_headers) == (16 * 1024, 100)
    assert defaults["h11_max_incomplete_event_size"] == 16 * 1024
    assert defaults["proxy_headers"] is False and "forwarded_allow_ips" not in defaults
    custom = http_options(Settings(max_header_bytes=8192, max_headers=50, trusted_proxies="::1"))
    assert (custom["http"].max_head_bytes, custom["http"].max_headers) == (8192, 50)
    assert custom["proxy_headers"] is True and custom["forwarded_allow_ips"] == "::1"
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6"):
        Settings(trusted_proxies="10.0.0.1, proxy.local")
