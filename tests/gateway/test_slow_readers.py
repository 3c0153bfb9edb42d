"""Clients that stop reading their streams cost only their own streams: each is ended after
``client_write_timeout_s`` with nothing written for it (its engine request aborted, a
``cancelled`` usage row), no backend's breaker opens, no failure is counted against an engine,
and another tenant's requests beside them are all served.

Engines run ten times faster than real time and the gateway's sockets towards clients have
modest kernel buffers, so that a slow stream's writes soon have to wait (the gateway's client
transport takes no more past its high-water mark; its upstream connection stops reading past
``PAUSE_BYTES``). No assertion is about how long anything took: waits are
on states, bounded only to end a failing test.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from engine_emulated import EngineSpec, EngineThread, RunningEngine
from gateway.app import BackendSpec, create_app
from gateway.app.backends import Backend
from gateway.app.breaker import OpenReason
from gateway.app.server import GatewayThread
from gateway.app.watchdog import StreamWatch, stalled_backends
from gateway.db import crud
from gateway.db.models import Tenant, UsageRecord
from gateway.db.seed import seed_defaults
from gateway.settings import Settings
from tests.gateway.polling import wait_for

MODEL = "qwen2-7b"
SECRET = "slow-readers-secret"
SLOW_STREAMS = 6
CLIENT_SNDBUF = 64 * 1024


@pytest.fixture(scope="module")
def engines() -> Iterator[list[RunningEngine]]:
    specs = [
        EngineSpec(profile, "vllm-v1-priority", MODEL, time_scale=10.0)
        for profile in ("a100-qwen2-7b", "910b-qwen2-7b")
    ]
    with EngineThread(specs) as running:
        yield running


@pytest.fixture
def keys(factory: sessionmaker[Session]) -> dict[str, str]:
    with factory.begin() as session:
        seed_defaults(session)
        made = {}
        for tenant in ("slowpoke", "bystander"):
            crud.create_tenant(session, actor="test", name=tenant, tier="standard")
            made[tenant] = crud.create_key(
                session, actor="test", tenant=tenant, secret=SECRET
            ).plaintext
        return made


def _count(gateway: GatewayThread, name: str, **labels: str) -> float:
    return gateway.state.metrics.registry.get_sample_value(name, labels) or 0.0


def _usage(factory: sessionmaker[Session], tenant: str) -> list[str]:
    with factory() as session:
        query = select(UsageRecord.status).join(Tenant).where(Tenant.name == tenant)
        return list(session.scalars(query))


def _open_slow_stream(base_url: str, key: str) -> socket.socket:
    """A streamed request whose client reads its first 256 bytes, then nothing more (a 4 KiB
    receive buffer, so the gateway soon has to hold what it cannot write)."""
    host, port = base_url.split("//")[1].split("/")[0].rsplit(":", 1)
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell me everything."}],
            "max_tokens": 30000,
            "stream": True,
        }
    ).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(60)
    sock.connect((host, int(port)))
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
        f"authorization: Bearer {key}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    assert sock.recv(256).startswith(b"HTTP/1.1 200")
    return sock


def _bystander(base_url: str, key: str, stop: threading.Event, seen: list[Any]) -> None:
    """Another tenant's short streamed requests, read promptly, until ``stop``."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi."}],
        "max_tokens": 16,
        "stream": True,
    }
    headers = {"authorization": f"Bearer {key}"}
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            with client.stream(
                "POST",
                f"{base_url}/chat/completions",
                json=body,
                headers=headers,
            ) as response:
                text = response.read().decode()
            failed = response.status_code != 200 or '"error"' in text or "[DONE]" not in text
            seen.append(text[:300] if failed else 200)


@pytest.mark.slow
def test_clients_that_stop_reading_cost_only_their_own_streams(
    engines: list[RunningEngine],
    factory: sessionmaker[Session],
    keys: dict[str, str],
    tmp_path: Path,
) -> None:
    settings = Settings(
        database_url=str(factory.kw["bind"].url),
        secret=SecretStr(SECRET),
        data_dir=tmp_path,
        redis_url=None,
        client_write_timeout_s=3.0,
    )
    backends = [
        BackendSpec(f"engine-{i}", e.url, MODEL, e.spec.profile) for i, e in enumerate(engines)
    ]
    gateway = GatewayThread(create_app(settings, backends=backends))
    # modest kernel send buffers towards clients, as over a real network: loopback's autotuned
    # ones hold megabytes before a write has to wait (accepted sockets inherit this one's)
    gateway._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CLIENT_SNDBUF)
    with gateway:
        wait_for(lambda: gateway.state.pool.ready)
        stop = threading.Event()
        seen: list[Any] = []  # 200, or what came instead
        bystander = threading.Thread(
            target=_bystander, args=(gateway.base_url, keys["bystander"], stop, seen)
        )
        bystander.start()
        sockets = [
            _open_slow_stream(gateway.base_url, keys["slowpoke"]) for _ in range(SLOW_STREAMS)
        ]
        try:
            # every slow stream is held up by its client at some point (writes waiting) ...
            blocked: set[int] = set()

            def all_blocked() -> bool:
                blocked.update(id(w) for w in list(gateway.state.pool.streams) if w.write_since)
                return len(blocked) >= SLOW_STREAMS

            wait_for(all_blocked)
            # ... and each is ended for it, as a client that left: the rest was not wanted
            wait_for(lambda: _usage(factory, "slowpoke").count("cancelled") == SLOW_STREAMS)
        finally:
            stop.set()
            bystander.join()
            for sock in sockets:
                sock.close()
        state = gateway.state
        wait_for(lambda: not state.pool.streams and state.queue.in_flight == 0)
        wait_for(lambda: all(e.sim.core.num_running + e.sim.core.num_waiting == 0 for e in engines))
        assert seen and all(outcome == 200 for outcome in seen), seen
        wait_for(lambda: _usage(factory, "bystander").count("ok") == len(seen))
        for backend in state.pool.backends:
            name = backend.name
            assert backend.breaker.failures == 0 and backend.view.healthy
            assert backend.own_decoding == 0
            for reason in OpenReason:
                opens = _count(gateway, "tiergate_breaker_opens_total", backend=name, reason=reason)
                assert opens == 0, (name, reason)
            assert _count(gateway, "tiergate_upstream_failures_total", backend=name) == 0


class _Timeout:
    """Stands for the relay's ``asyncio.Timeout``: records when it was told to expire."""

    def __init__(self) -> None:
        self.when: float | None = None

    def expired(self) -> bool:
        return self.when is not None

    def reschedule(self, when: float | None) -> None:
        self.when = when


def test_a_stream_waiting_on_its_client_ends_alone_and_says_nothing_of_its_backend() -> None:
    backend = cast(Backend, object())
    stuck = StreamWatch(backend, stall_s=2.0, write_s=3.0, write_since=100.0)  # 5 s writing
    slow = StreamWatch(backend, stall_s=2.0, write_s=3.0, write_since=104.0)  # 1 s writing
    waiting = StreamWatch(backend, stall_s=2.0, write_s=3.0, read_since=104.5)  # on the engine
    deadlines = {}
    for watch in (stuck, slow, waiting):
        deadlines[id(watch)] = watch.deadline = cast(asyncio.Timeout, _Timeout())
    silent = stalled_backends({stuck, slow, waiting}, now=105.0, loop_now=7.0, floor_s=0.4)
    assert silent == {backend: pytest.approx(0.5)}  # only the stream reading says anything
    assert stuck.client_stalled and not stuck.stalled  # the client's fault, not the engine's
    assert not (slow.client_stalled or slow.stalled or waiting.client_stalled or waiting.stalled)
    assert [cast(_Timeout, deadlines[id(w)]).when for w in (stuck, slow, waiting)] == [
        7.0,
        None,
        None,
    ]
    stuck.expire(8.0)  # an engine stall cannot be pinned on a stream already ended for its client
    assert not stuck.stalled
