"""Serving an ASGI app from inside another program (tests, ``tiergate serve``, benchmarks).

Shared by the gateway's background-thread server and the in-process emulated engines: the
uvicorn server, the socket binding and the addresses a served app is reached at.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import uvicorn


class Listening:
    """The addresses of an app served on ``host:port`` (a mixin: the class sets both)."""

    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # IPv6 literals in brackets
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return f"{self.url}/v1"


class EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the process hosting it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(host: str, port: int, *, blocking: bool = True) -> socket.socket:
    """A listening-ready socket on ``host:port`` (port 0: a free one), IPv4 or IPv6."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.setblocking(blocking)
    except OSError:
        sock.close()
        raise
    return sock
