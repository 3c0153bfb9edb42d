"""``GET /admin/v1/backends``: the backends the gateway really routes to, live.

The real app (uvicorn in a thread) in front of emulated engines, as ``make run`` has it: the
embedded engines are listed beside the backends table's rows, each with its source, health,
breaker state, live load and last health check; an engine that cannot be reached shows an
open breaker. A second app serves the table itself: its rows are ``database`` backends,
routed once enabled. Requests go through the official ``openai`` client; the admin API is
read with httpx.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from seeded_app import app_settings, seed_database
from sqlalchemy import Engine

from engine_emulated import EngineSpec, EngineThread, RunningEngine
from gateway.app import BackendSpec, create_app
from gateway.app.server import GatewayThread
from gateway.db import crud
from gateway.db.session import make_session_factory

MODEL = "qwen2-7b"
SECRET = "fleet-test-secret"
ADMIN = {"Authorization": "Bearer fleet-admin-key"}
WAIT_S = 20.0  # an upper bound for a probe to land on a loaded machine, never a measured time


@dataclass
class Fleet:
    gateway: GatewayThread
    engines: list[RunningEngine]
    engine: Engine
    key: str

    def backends(self, **params: Any) -> list[dict[str, Any]]:
        response = httpx.get(
            f"{self.gateway.url}/admin/v1/backends", headers=ADMIN, params=params, timeout=10
        )
        assert response.status_code == 200, response.text
        assert int(response.headers["x-total-count"]) >= len(response.json()["data"])
        return list(response.json()["data"])

    def by_name(self, **params: Any) -> dict[str, dict[str, Any]]:
        return {b["name"]: b for b in self.backends(**params)}

    def until(self, check: Callable[[dict[str, dict[str, Any]]], bool]) -> dict[str, Any]:
        """The listing once ``check`` holds (probes and scrapes run on their own clock)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            listing = self.by_name()
            if check(listing):
                return listing
            assert time.monotonic() < deadline, listing
            time.sleep(0.05)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.gateway.base_url, api_key=self.key, max_retries=0)


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _add_rows(engine: Engine, url: str) -> None:
    with make_session_factory(engine).begin() as s:
        crud.create_backend(
            s, actor="test", name="db-gpu", base_url=url, model=MODEL, profile="a100-qwen2-7b"
        )
        crud.create_backend(
            s,
            actor="test",
            name="db-spare",
            base_url="http://10.0.0.9:8000",
            model=MODEL,
            profile="910b-qwen2-7b",
            enabled=False,
        )


@pytest.fixture(scope="module")
def engines() -> Iterator[list[RunningEngine]]:
    specs = [
        EngineSpec("910b-qwen2-7b", "slide", MODEL, seed=0),
        EngineSpec("a100-qwen2-7b", "slide", MODEL, seed=1),
    ]
    with EngineThread(specs) as running:
        yield running


def _settings(root: Path, url: str) -> Any:
    return app_settings(url, root, SECRET, "fleet-admin-key", scrape_interval_s=0.2)


@pytest.fixture(scope="module")
def embedded(
    engines: list[RunningEngine], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """``tiergate serve``'s shape: emulated engines given to the app, plus one fixed backend
    that is down; the table has rows the app does not serve."""
    root = tmp_path_factory.mktemp("fleet-embedded")
    url = f"sqlite:///{root / 'tiergate.db'}"
    engine, key = seed_database(url, SECRET)
    _add_rows(engine, engines[0].url)
    specs = [
        BackendSpec(f"emulated-{i}-{e.spec.profile}", e.url, MODEL, str(e.spec.profile), "emulated")
        for i, e in enumerate(engines)
    ]
    specs.append(BackendSpec("down", f"http://127.0.0.1:{_closed_port()}", MODEL, "a100-qwen2-7b"))
    with GatewayThread(create_app(_settings(root, url), backends=specs)) as gateway:
        yield Fleet(gateway, engines, engine, key)
    engine.dispose()


def test_the_embedded_engines_are_listed_with_their_live_state(embedded: Fleet) -> None:
    listing = embedded.until(
        lambda b: (
            b["down"]["breaker"] == "open"
            and all(b[n]["last_health_check_ok"] for n in b if n.startswith("emulated-"))
            and all(b[n]["running"] is not None for n in b if n.startswith("emulated-"))
        )
    )
    assert sorted(listing) == [
        "db-gpu",
        "db-spare",
        "down",
        "emulated-0-910b-qwen2-7b",
        "emulated-1-a100-qwen2-7b",
    ]
    first = listing["emulated-0-910b-qwen2-7b"]
    assert first["base_url"] == embedded.engines[0].url and first["model"] == MODEL
    assert (first["profile"], first["kind"], first["source"]) == (
        "910b-qwen2-7b",
        "emulated",
        "embedded",
    )
    assert (first["id"], first["created_at"], first["updated_at"]) == (None, None, None)
    assert first["routed"] and first["enabled"] and first["healthy"]
    assert (first["breaker"], first["breaker_reason"], first["failures"]) == ("closed", None, 0)
    assert (first["running"], first["waiting"], first["in_flight"]) == (0, 0, 0)
    assert 0.0 <= first["kv_cache_usage"] <= 1.0
    assert first["last_health_check"].endswith(("Z", "+00:00"))

    down = listing["down"]
    assert (down["source"], down["kind"], down["routed"]) == ("config", "vllm", True)
    assert (down["healthy"], down["breaker_reason"]) == (False, "unreachable")
    assert down["last_health_check_ok"] is False and down["running"] is None

    # the table's rows are listed, but this gateway serves a fixed fleet: not routed
    for name in ("db-gpu", "db-spare"):
        row = listing[name]
        assert row["source"] == "database" and row["routed"] is False and row["id"] >= 1
        assert row["healthy"] is None and row["breaker"] is None and row["in_flight"] is None
    assert (listing["db-gpu"]["enabled"], listing["db-spare"]["enabled"]) == (True, False)


def test_a_request_in_flight_shows_on_its_backend(embedded: Fleet) -> None:
    stream = embedded.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count slowly."}],
        max_tokens=400,
        stream=True,
    )
    try:
        next(iter(stream))  # the first token: decoding on one engine now
        live = embedded.by_name(source="embedded")
        assert sorted(b["in_flight"] for b in live.values()) == [0, 1]
    finally:
        stream.close()
    embedded.until(lambda b: all(b[n]["in_flight"] == 0 for n in b if n.startswith("emulated-")))


def test_filters_and_pages(embedded: Fleet) -> None:
    assert set(embedded.by_name(source="database")) == {"db-gpu", "db-spare"}
    assert set(embedded.by_name(source="config")) == {"down"}
    assert "db-spare" not in embedded.by_name(enabled=True)
    assert set(embedded.by_name(enabled=False)) == {"db-spare"}
    assert embedded.by_name(model="other") == {}
    response = httpx.get(
        f"{embedded.gateway.url}/admin/v1/backends",
        headers=ADMIN,
        params={"limit": 2, "offset": 1},
    )
    assert response.headers["x-total-count"] == "5"
    assert [b["name"] for b in response.json()["data"]] == ["db-spare", "down"]
    bad = httpx.get(
        f"{embedded.gateway.url}/admin/v1/backends", headers=ADMIN, params={"source": "cloud"}
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "source"
    assert httpx.get(f"{embedded.gateway.url}/admin/v1/backends").status_code == 401


def test_a_gateway_on_the_backends_table_lists_its_rows_live(
    engines: list[RunningEngine], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'tiergate.db'}"
    engine, key = seed_database(url, SECRET)
    _add_rows(engine, engines[1].url)
    try:
        with GatewayThread(create_app(_settings(tmp_path, url))) as gateway:
            fleet = Fleet(gateway, engines, engine, key)
            listing = fleet.until(lambda b: b["db-gpu"]["last_health_check_ok"] is True)
            gpu, spare = listing["db-gpu"], listing["db-spare"]
            assert sorted(listing) == ["db-gpu", "db-spare"]
            assert (gpu["source"], gpu["routed"], gpu["breaker"]) == ("database", True, "closed")
            assert gpu["id"] >= 1 and gpu["created_at"] and gpu["kind"] == "vllm"
            assert (spare["source"], spare["routed"], spare["healthy"]) == ("database", False, None)

            reply = fleet.client().chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
            assert reply.choices[0].message.content

            # enabling the spare through the admin API reloads the pool: it is routed now
            # (its address answers nothing, so its breaker opens)
            patched = httpx.patch(
                f"{gateway.url}/admin/v1/backends/db-spare", headers=ADMIN, json={"enabled": True}
            )
            assert patched.status_code == 200, patched.text
            assert fleet.by_name()["db-spare"]["routed"] is True
    finally:
        engine.dispose()
