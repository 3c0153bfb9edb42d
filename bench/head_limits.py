"""CPU the request-head limits cost: uvicorn's httptools protocol vs the gateway's bounded one.

    python bench/head_limits.py [--requests N] [--blocks B] [--json]

Both protocols serve the same keep-alive connection in-process (a fake transport, no sockets, a
two-byte ASGI answer), one request at a time: a streamed chat request as the ``openai`` client
sends it (its 14 header fields, a 300-byte body). The two alternate in blocks of ``--requests``
(``--blocks`` each, the first pair a warm-up), and the process CPU time per request of each
block is taken; reported are the medians and their difference. What it measures is what
:class:`gateway.app.http_limits.HeadLimitedProtocol` adds to parsing a request head; the rest
of the request's path is the same on both sides.

``--json`` prints ``{"requests", "base_us_per_request", "limited_us_per_request",
"added_us_per_request"}`` (``requests``: per protocol, warm-up excluded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.app.http_limits import head_limited_protocol

BODY = json.dumps(
    {
        "model": "qwen2-7b",
        "messages": [{"role": "user", "content": "x" * 200}],
        "max_tokens": 16,
        "stream": True,
    }
).encode()
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\n"
    b"Host: 127.0.0.1:8000\r\n"
    b"Accept-Encoding: gzip, deflate\r\n"
    b"Connection: keep-alive\r\n"
    b"Accept: application/json\r\n"
    b"Content-Type: application/json\r\n"
    b"User-Agent: OpenAI/Python 1.109.1\r\n"
    b"X-Stainless-Lang: python\r\n"
    b"X-Stainless-Package-Version: 1.109.1\r\n"
    b"X-Stainless-OS: Linux\r\n"
    b"X-Stainless-Arch: x64\r\n"
    b"X-Stainless-Runtime: CPython\r\n"
    b"X-Stainless-Runtime-Version: 3.11.9\r\n"
    b"Authorization: Bearer tg-abcd1234-" + b"k" * 43 + b"\r\n"
    b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY
)


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


class _Transport(asyncio.Transport):
    """Counts what is written; never closes on its own."""

    def __init__(self) -> None:
        super().__init__()
        self.responses = 0
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if bytes(data).endswith(b"ok"):
            self.responses += 1

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _block(protocol_class: type[Any], requests: int) -> float:
    """Process CPU seconds per request over one block on a fresh connection."""
    config = Config(_app, lifespan="off", log_level="error", proxy_headers=False)
    config.load()
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = _Transport()
    protocol.connection_made(transport)
    start = time.process_time()
    for served in range(1, requests + 1):
        protocol.data_received(REQUEST)
        while transport.responses < served:
            await asyncio.sleep(0)
        if transport.closing:
            raise RuntimeError(f"{protocol_class.__name__} closed the connection")
    return (time.process_time() - start) / requests


async def measure(requests: int, blocks: int) -> dict[str, Any]:
    limited = head_limited_protocol(16 * 1024, 100)
    base_times: list[float] = []
    limited_times: list[float] = []
    for index in range(blocks + 1):
        order = [(HttpToolsProtocol, base_times), (limited, limited_times)]
        if index % 2:
            order.reverse()
        for protocol_class, times in order:
            per_request = await _block(protocol_class, requests)
            if index:  # the first pair warms up
                times.append(per_request)
    base = statistics.median(base_times) * 1e6
    bounded = statistics.median(limited_times) * 1e6
    return {
        "requests": requests * blocks,
        "base_us_per_request": round(base, 2),
        "limited_us_per_request": round(bounded, 2),
        "added_us_per_request": round(bounded - base, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per block")
    parser.add_argument("--blocks", type=int, default=10, help="measured blocks per protocol")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = asyncio.run(measure(args.requests, args.blocks))
    if args.json:
        print(json.dumps(result))
        return
    for name, value in result.items():
        print(f"{name:>24}: {value}")


if __name__ == "__main__":
    main()
