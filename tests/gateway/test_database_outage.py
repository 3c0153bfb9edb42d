"""The database goes away: keys in use keep authenticating, the rest get a 503 with
``retry-after``, nothing is a plain 500, every answer is counted, and no usage record is lost or
stored twice.

PostgreSQL is reached through the TCP proxy of ``bench/drill_database.py``, which is cut
(every connection reset, new ones refused) and restored: deterministic, and the shared server
itself stays up for everyone else (and for the changes a test makes "elsewhere" meanwhile).
The auth cache runs on stepped clocks, so the TTL and the stale window are crossed without
sleeping. The last test is the drill's short form: the gateway and an emulated engine in
child processes, a few hundred streamed requests, the database cut for 3 s in the middle.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Engine, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from gateway.app.auth import OUTAGE_RETRY_S, UNAUTHENTICATED, AuthCache, authenticate_request
from gateway.app.metrics import GatewayMetrics
from gateway.db import crud
from gateway.db.models import ApiKey, Base, utcnow
from gateway.db.session import make_engine, make_session_factory
from gateway.errors import ApiError

DRILL = Path(__file__).resolve().parents[2] / "bench" / "drill_database.py"
SECRET = "outage-test-secret"
TTL_S = 1.0
STALE_S = 60.0


@pytest.fixture(scope="module")
def drill() -> ModuleType:
    spec = importlib.util.spec_from_file_location("drill_database", DRILL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


class StepClock:
    """A monotonic clock that moves only when a test steps it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class WallClock:
    """UTC now, plus what the test has added (a key's expiry passes without waiting)."""

    def __init__(self) -> None:
        self.ahead = timedelta()

    def __call__(self) -> datetime:
        return utcnow() + self.ahead


@dataclass
class Scene:
    proxy: Any
    direct: sessionmaker[Session]
    """The database itself: changes made "elsewhere" while this gateway cannot reach it."""
    cache: AuthCache
    clock: StepClock
    wall: WallClock
    keys: dict[str, str]

    def bearer(self, name: str) -> str:
        return f"Bearer {self.keys[name]}"


def _seed(factory: sessionmaker[Session]) -> dict[str, str]:
    with factory.begin() as session:
        crud.create_tier(session, actor="t", name="gold", weight=2, ttft_ms=800, tpot_ms=40)
        crud.create_tenant(session, actor="t", name="acme", tier="gold")
        expires = utcnow() + timedelta(minutes=10)
        keys = {
            name: crud.create_key(
                session,
                actor="t",
                tenant="acme",
                secret=SECRET,
                expires_at=expires if name == "expiring" else None,
            ).plaintext
            for name in ("warm", "cold", "expiring", "elsewhere", "elsewhere-revoked")
        }
    keys["bogus"] = "tg-zzzzzzzz-" + "x" * 40
    return keys


@pytest.fixture
def scene(postgres_url: str, drill: ModuleType) -> Iterator[Scene]:
    direct_engine = make_engine(postgres_url)
    Base.metadata.create_all(direct_engine)
    direct = make_session_factory(direct_engine)
    keys = _seed(direct)
    target = make_url(postgres_url)
    with drill.TcpProxy(target.host or "127.0.0.1", target.port or 5432) as proxy:
        through: Engine = make_engine(
            target.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        )
        clock, wall = StepClock(), WallClock()
        cache = AuthCache(
            make_session_factory(through),
            SECRET,
            ttl_s=TTL_S,
            stale_s=STALE_S,
            clock=clock,
            wall_clock=wall,
        )
        try:
            yield Scene(proxy, direct, cache, clock, wall, keys)
        finally:
            through.dispose()
    direct_engine.dispose()


async def _refused(scene: Scene, name: str) -> ApiError:
    with pytest.raises(ApiError) as refused:
        await scene.cache.authenticate(scene.bearer(name))
    return refused.value


def test_keys_in_use_authenticate_through_an_outage_and_the_rest_get_503(scene: Scene) -> None:
    cache, clock = scene.cache, scene.clock

    async def run() -> None:
        assert (await cache.authenticate(scene.bearer("warm"))).tenant_name == "acme"
        assert (await _refused(scene, "bogus")).status == 401  # a refusal, cached for the TTL
        scene.proxy.cut()
        clock.now += 5 * TTL_S  # every entry past its TTL

        assert (await cache.authenticate(scene.bearer("warm"))).tenant_name == "acme"
        assert cache.stale_served == 1 and cache.database_down
        for name in ("cold", "bogus"):  # never seen; a refusal past its TTL is not served stale
            error = await _refused(scene, name)
            assert (error.status, error.code) == (503, "database_unavailable")
            assert error.headers["retry-after"] == "5"
            assert error.body()["error"]["type"] == "server_error"
        assert cache.unavailable_refused == 2

        # a revocation made elsewhere meanwhile cannot be seen: documented, and bounded below
        with scene.direct.begin() as session:
            crud.revoke_key(session, scene.keys["warm"].split("-")[1], actor="t")
        clock.now += STALE_S - 5 * TTL_S - 0.5  # still within the stale window
        assert (await cache.authenticate(scene.bearer("warm"))).tenant_name == "acme"
        clock.now += 1.0  # past it: no longer vouched for
        assert (await _refused(scene, "warm")).status == 503

        scene.proxy.restore()
        clock.now += OUTAGE_RETRY_S  # the next try reaches the database again
        assert "revoked" in (await _refused(scene, "warm")).message
        assert not cache.database_down
        assert (await cache.authenticate(scene.bearer("cold"))).tenant_name == "acme"

    asyncio.run(run())


def test_a_key_past_its_own_expiry_stops_even_when_served_from_the_cache(scene: Scene) -> None:
    async def run() -> None:
        await scene.cache.authenticate(scene.bearer("expiring"))
        scene.proxy.cut()
        scene.clock.now += 5 * TTL_S
        assert await scene.cache.authenticate(scene.bearer("expiring"))  # stale, not expired
        scene.wall.ahead = timedelta(minutes=11)  # its expires_at has passed
        refused = await _refused(scene, "expiring")
        assert refused.status == 401 and "expired" in refused.message

    asyncio.run(run())


def test_keys_another_process_used_are_learnt_for_the_next_outage(scene: Scene) -> None:
    """Workers and replicas: a key whose requests went to another process (its
    ``last_used_at`` is recent) authenticates here too during an outage — but with the
    database up, what was learnt is not trusted over the database."""
    with scene.direct.begin() as session:
        session.execute(
            update(ApiKey)
            .where(ApiKey.key_hash.in_(_hashes(scene, "elsewhere", "elsewhere-revoked")))
            .values(last_used_at=utcnow())
        )

    async def run() -> None:
        assert await scene.cache.preload() == 2
        with scene.direct.begin() as session:
            crud.revoke_key(session, scene.keys["elsewhere-revoked"].split("-")[1], actor="t")
        assert "revoked" in (await _refused(scene, "elsewhere-revoked")).message  # looked up
        scene.proxy.cut()
        scene.clock.now += 5 * TTL_S
        identity = await scene.cache.authenticate(scene.bearer("elsewhere"))
        assert identity.tenant_name == "acme" and scene.cache.stale_served == 1
        with pytest.raises(Exception):  # noqa: B017 - the driver's error, whatever its class
            await scene.cache.preload()
        assert scene.cache.database_down

    asyncio.run(run())


def _hashes(scene: Scene, *names: str) -> list[str]:
    from gateway.db.security import hash_key

    return [hash_key(SECRET, scene.keys[name]) for name in names]


def test_a_refused_generation_request_is_counted(scene: Scene) -> None:
    """``/v1`` answers a key the database cannot check with a 503 that is counted in
    ``tiergate_requests_total`` and the rejections (the outage drill's 500s were counted
    nowhere)."""
    metrics = GatewayMetrics()
    state: Any = SimpleNamespace(auth=scene.cache, metrics=metrics)
    scene.proxy.cut()

    async def run() -> None:
        for name in ("cold", "bogus"):
            with pytest.raises(ApiError):
                await authenticate_request(state, scene.bearer(name))
        with pytest.raises(ApiError):
            await authenticate_request(state, None)  # no key at all: 401, counted too

    asyncio.run(run())
    text = metrics.render().decode()
    assert f'tiergate_requests_total{{status="503",tier="{UNAUTHENTICATED}"}} 2.0' in text
    assert f'tiergate_requests_total{{status="401",tier="{UNAUTHENTICATED}"}} 1.0' in text
    assert (
        f'tiergate_rejections_total{{reason="database_unavailable",tier="{UNAUTHENTICATED}"}} 2.0'
        in text
    )


@pytest.mark.slow
def test_a_short_outage_drill(drill: ModuleType, postgres_server_url: str) -> None:
    """The drill's short form: 400 streamed requests at 80/s, the database cut for 3 s after
    35% of them, a memory buffer of 50 records so that the spool is used and replayed."""
    result = drill.run_drill(
        drill.Setup(
            requests=400,
            rps=80.0,
            outage_s=3.0,
            outage="proxy",
            workers=1,
            buffer_records=50,
            tenants=4,
            server_url=postgres_server_url,
        )
    )
    detail = {k: v for k, v in result.items() if k != "writer"}
    # never a 500, never a plain-text error, every 503 with retry-after
    assert result["status_500"] == result["non_json_errors"] == 0, detail
    assert result["503_without_retry_after"] == 0, detail
    assert result["client_errors"] == result["stream_errors"] == 0, detail
    # keys in use are served throughout; what the cache cannot vouch for gets 503
    load = result["load_by_phase"]
    assert set(load["before"]) == set(load["during"]) == {"200"}, detail
    assert set(result["cold_key_by_phase"]["during"]) == {"503 database_unavailable"}, detail
    assert set(result["bad_key_by_phase"]["during"]) == {"503 database_unavailable"}, detail
    assert set(result["bad_key_by_phase"]["before"]) == {"401 invalid_api_key"}, detail
    assert result["readiness_during_outage"], detail
    assert set(result["readiness_during_outage"]) == {"200 database=unreachable degraded=True"}
    # every answer counted, the refused-before-a-tenant ones apart
    answers = result["requests"] + result["probes"]
    assert result["counted_in_requests_total"] == answers, detail
    refused = sum(n for s, n in result["statuses"].items() if s in ("401", "503"))
    assert result["counted_unauthenticated"] == refused, detail
    # usage: rows == 2xx, nothing lost, nothing twice, the spool used and emptied
    assert result["lost"] == result["duplicated"] == result["extra_rows"] == 0, detail
    assert result["ok_rows_equal_2xx"] and result["usage_rows"] == result["usage_rows_due"]
    writer = result["writer"]
    assert writer["usage_records_total:spilled"] > 0, writer
    assert writer["usage_records_total:replayed"] == writer["usage_records_total:spilled"]
    assert writer.get("usage_records_total:dropped", 0) == 0, writer
    assert result["spool_bytes_left"] == 0
