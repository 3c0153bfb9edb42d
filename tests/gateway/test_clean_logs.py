"""No key, prompt or secret in the logs of a full run (security drill).

One gateway (uvicorn with the gateway's own HTTP options, TRACE level, access log on) in front
of an emulated engine, on SQLite, with every logger of the process at DEBUG — the gateway's,
uvicorn's, SQLAlchemy's (statements and result rows), httpx's, aiohttp's. The run creates and
rotates keys through the admin API and the CLI, presents a key hashed under the previous
server secret (re-hashed on the way), sends chat requests carrying a marker in their prompt,
streamed and not, with keys good, tampered, expired and malformed, hits the admin API with
wrong admin keys and a tenant key, sends a request head over the limit, and fails requests by
stopping the engine. Then everything the process wrote to its file descriptors 1 and 2, and
every log record (with its traceback), is searched for each plaintext key's secret part, the
server secrets, the admin key and the marker: none may appear.
"""

from __future__ import annotations

import io
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
import uvicorn
from typer.testing import CliRunner

from engine_emulated import EngineSpec, EngineThread
from gateway.app import BackendSpec, create_app
from gateway.app.http_limits import http_options
from gateway.app.server import GatewayThread
from gateway.cli import register
from gateway.db import crud
from gateway.db.session import make_session_factory
from gateway.embedded import EmbeddedServer
from gateway.settings import get_settings
from tests.gateway.seeded_app import app_settings, seed_database

SECRET = "clean-logs-current-secret-Qm9vYmFy4711"
PREVIOUS = "clean-logs-previous-secret-WmFwcGVy0815"
ADMIN_KEY = "clean-logs-admin-key-SGVsbG8gV29ybGQ42"
MARKER = "PROMPT-MARKER-7f3a9c2e"
MODEL = "qwen2-7b"
LOGGERS = ("gateway", "uvicorn", "sqlalchemy", "alembic", "httpx", "httpcore", "aiohttp", "asyncio")


@pytest.fixture
def captured_logs() -> Iterator[io.StringIO]:
    """Every log record of the process at DEBUG, formatted with its traceback."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.DEBUG)
    root = logging.getLogger()
    levels = {name: logging.getLogger(name).level for name in ("", *LOGGERS)}
    root.addHandler(handler)
    for name in levels:
        logging.getLogger(name).setLevel(logging.DEBUG)
    try:
        yield buffer
    finally:
        root.removeHandler(handler)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _secret_part(key: str) -> str:
    return key.split("-", 2)[2]


def _chat(base: str, key: str, *, stream: bool, **extra: Any) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Please repeat {MARKER} back."}],
        "max_tokens": 4,
        "stream": stream,
        **extra,
    }
    return httpx.post(
        f"{base}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


@pytest.mark.slow
def test_a_full_run_logs_no_key_prompt_or_secret(
    sqlite_url: str,
    tmp_path: Path,
    captured_logs: io.StringIO,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine, seeded_key = seed_database(sqlite_url, SECRET)
    with make_session_factory(engine).begin() as session:  # a key from before the rotation
        old_secret_key = crud.create_key(
            session, actor="test", tenant="acme", secret=PREVIOUS
        ).plaintext
    engine.dispose()
    settings = app_settings(
        sqlite_url, tmp_path, SECRET, ADMIN_KEY, secret_previous=PREVIOUS, auth_cache_ttl_s=0.2
    )
    keys = [seeded_key, old_secret_key]
    refused = []
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}

    fleet = EngineThread([EngineSpec("a100-qwen2-7b", "vllm-v1-priority", MODEL)])
    with fleet as engines:
        backends = [BackendSpec("engine-0", engines[0].url, MODEL, "a100-qwen2-7b")]
        app = create_app(settings, backends=backends)
        gateway = GatewayThread(app)
        config = uvicorn.Config(
            app, log_level="trace", access_log=True, lifespan="on", **http_options(settings)
        )
        gateway.server = EmbeddedServer(config)
        with gateway:
            base = gateway.url
            # keys through the admin API: create, rotate (grace 0: the old one expires now)
            with httpx.Client(base_url=f"{base}/admin/v1", headers=admin) as api:
                api.post("/tenants", json={"name": "globex", "tier": "premium"}).raise_for_status()
                first = api.post("/keys", json={"tenant": "globex", "name": "app"}).json()["key"]
                prefix = first.split("-")[1]
                second = api.post(f"/keys/{prefix}/rotate", json={"grace_s": 0}).json()["key"]
                api.patch(f"/keys/{second.split('-')[1]}", json={"name": "app-2"})
                api.get("/keys/secret-status").raise_for_status()
                api.get("/audit").raise_for_status()
                keys += [first, second]
                refused.append(first)  # expired by the rotation
                for wrong in (f"Bearer {ADMIN_KEY}x", f"Bearer {second}", f"Basic {ADMIN_KEY}"):
                    response = api.get("/tenants", headers={"Authorization": wrong})
                    assert response.status_code == 401
            # keys through the CLI (its own output is where a new key is meant to appear)
            monkeypatch.setenv("TIERGATE_DATABASE_URL", sqlite_url)
            monkeypatch.setenv("TIERGATE_SECRET", SECRET)
            monkeypatch.setenv("TIERGATE_SECRET_PREVIOUS", PREVIOUS)
            get_settings.cache_clear()
            cli = typer.Typer()
            register(cli)
            runner = CliRunner()
            made = runner.invoke(cli, ["keys", "create", "--tenant", "globex", "-q"])
            assert made.exit_code == 0, made.output
            third = made.output.strip()
            rotated = runner.invoke(cli, ["keys", "rotate", third.split("-")[1], "-q"])
            assert rotated.exit_code == 0, rotated.output
            fourth = rotated.output.strip()
            keys += [third, fourth]
            assert runner.invoke(cli, ["keys", "secret-status"]).exit_code == 0
            # requests: good keys (one under the previous secret), streamed and not
            for key in (seeded_key, old_secret_key, second, third, fourth):
                for stream in (False, True):
                    response = _chat(base, key, stream=stream)
                    assert response.status_code == 200, response.text
            # refused ones: expired, tampered, unknown, malformed, a bad body, a bad model
            tampered = second[:-4] + ("AAAA" if not second.endswith("AAAA") else "BBBB")
            unknown = f"tg-zzzzzzzz-{MARKER}-unknown-secret-part-0123456789"
            refused += [tampered, unknown]
            for key in (first, tampered, unknown, f"sk-{MARKER}", ADMIN_KEY):
                assert _chat(base, key, stream=False).status_code == 401
            assert _chat(base, second, stream=False, max_tokens=MARKER).status_code == 400
            assert _chat(base, second, stream=True, model=f"{MARKER}-model").status_code == 404
            # a request head over the limit, carrying a key
            with socket.create_connection((gateway.host, gateway.port), timeout=10) as sock:
                sock.sendall(
                    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                    + second.encode()
                    + b"\r\nX-Pad: "
                    + b"p" * (settings.max_header_bytes + 10)
                    + b"\r\n\r\n"
                )
                assert sock.recv(64).startswith(b"HTTP/1.1 431")
            # failures: the engine goes away mid-run (stopping it twice is harmless)
            fleet.stop()
            failed = [_chat(base, fourth, stream=s).status_code for s in (False, True)]
            assert failed == [503, 503], failed
    logs = captured_logs.getvalue()
    out, err = capfd.readouterr()
    everything = "\n".join((logs, out, err))

    # the run did log, at every level it was asked to (else the search below proves nothing)
    assert "sqlalchemy.engine" in logs and "SQL parameters hidden" in logs
    assert "is now hashed under the current server secret" in logs  # the re-hash ran
    assert "POST /v1/chat/completions" in err + out  # uvicorn's access log
    assert f"tg-{prefix}" in everything  # prefixes are not secret and may be shown

    needles = {
        "server secret": SECRET,
        "previous secret": PREVIOUS,
        "admin key": ADMIN_KEY,
        "prompt marker": MARKER,
        **{f"key {k.split('-')[1]}": _secret_part(k) for k in keys + refused},
    }
    leaks = {name: everything.count(text) for name, text in needles.items() if text in everything}
    assert leaks == {}, leaks
