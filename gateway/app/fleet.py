"""The fleet as the gateway sees it now: every backend it routes to, and every one it could.

One read-only view, :func:`fleet_view`, for ``GET /admin/v1/backends`` and the dashboard's
backends page, so both show the same thing. It joins two sources:

* the **backend pool** (:class:`~gateway.app.backends.BackendPool`): what this gateway process
  actually routes to, with health, breaker state, the engine's load at the last scrape and the
  requests this gateway has in flight there. Its backends come from the database, or from
  specs fixed when the app was made: the emulated engines ``tiergate serve`` starts
  (``embedded``) or any other fixed list (``config``);
* the **backends table**: rows not in the pool (disabled, just added by another process and
  not yet picked up, or every row while the pool serves a fixed fleet) are listed too, with
  ``routed`` false and no live state, so an operator sees and can enable or edit them.

Live numbers are this process's: with ``--workers N`` each worker routes on its own, and the
answer is that of the worker that served the request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy.orm import Session, sessionmaker

from gateway.app.backends import Backend as PoolBackend
from gateway.app.backends import BackendPool
from gateway.app.breaker import breaker_state
from gateway.db import crud
from gateway.db.models import Backend as BackendRow
from priority.profiles import Profile

Source = Literal["database", "embedded", "config"]
BreakerState = Literal["closed", "half-open", "open"]
SOURCES: tuple[Source, ...] = ("database", "embedded", "config")
_BREAKER_STATES: tuple[BreakerState, ...] = ("closed", "half-open", "open")


@dataclass(frozen=True, slots=True)
class LiveBackend:
    """One backend: its configuration, and its live state where this gateway routes to it."""

    name: str
    base_url: str
    model: str
    profile: str
    kind: str
    source: Source
    enabled: bool
    routed: bool
    """In this gateway's pool: requests for its model may go there."""
    id: int | None = None
    """The database row's; None for a backend that is no row (``embedded``, ``config``)."""
    created_at: datetime | None = None
    updated_at: datetime | None = None
    healthy: bool | None = None
    """Routable now (breaker closed or half-open); None when not routed."""
    breaker: BreakerState | None = None
    breaker_reason: str | None = None
    """Why an open (or half-open) breaker opened: ``unreachable`` or ``unresponsive``."""
    failures: int | None = None
    """Request failures in a row since the last success."""
    running: int | None = None
    """Requests the engine reported running at the last scrape (None: no scrape yet)."""
    waiting: int | None = None
    kv_cache_usage: float | None = None
    """KV cache use, 0 to 1, at the last scrape."""
    in_flight: int | None = None
    """This gateway's requests there now: waiting for their first token, or decoding."""
    last_health_check: datetime | None = None
    last_health_check_ok: bool | None = None
    seats: int | None = None
    """Requests it runs at once (``max_num_seqs``): the engine's own, else the profile's."""
    engine_policy: str | None = None
    """The scheduling policy the engine says it runs (None: it did not say)."""
    max_model_len: int | None = None
    config_mismatches: tuple[str, ...] = ()
    """Where the registered profile disagrees with what the engine says it is."""


def _profile_name(profile: str | Profile) -> str:
    return profile if isinstance(profile, str) else profile.name


def _utc(epoch_s: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch_s, UTC) if epoch_s is not None else None


def _live(backend: PoolBackend, source: Source, row: BackendRow | None, now: float) -> LiveBackend:
    spec, breaker = backend.spec, backend.breaker
    return LiveBackend(
        name=spec.name,
        base_url=row.base_url if row is not None else spec.base_url,
        model=spec.model,
        profile=row.profile if row is not None else _profile_name(spec.profile),
        kind=spec.kind,
        source=source,
        enabled=row.enabled if row is not None else True,
        routed=True,
        id=row.id if row is not None else None,
        created_at=row.created_at if row is not None else None,
        updated_at=row.updated_at if row is not None else None,
        healthy=backend.view.healthy,
        breaker=_BREAKER_STATES[breaker_state(breaker, now)],
        breaker_reason=breaker.reason.value if breaker.reason is not None else None,
        failures=breaker.failures,
        running=backend.running,
        waiting=backend.waiting,
        kv_cache_usage=backend.kv_usage,
        in_flight=len(backend.view.prefill_queue) + backend.own_decoding,
        last_health_check=_utc(backend.checked_at),
        last_health_check_ok=backend.check_ok,
        seats=backend.profile.engine.max_num_seqs,
        engine_policy=backend.facts.policy if backend.facts is not None else None,
        max_model_len=backend.max_model_len,
        config_mismatches=tuple(backend.mismatches.values()),
    )


def _configured(row: BackendRow) -> LiveBackend:
    """A database row this gateway does not route to: its configuration only."""
    return LiveBackend(
        name=row.name,
        base_url=row.base_url,
        model=row.model,
        profile=row.profile,
        kind=row.kind,
        source="database",
        enabled=row.enabled,
        routed=False,
        id=row.id,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def snapshot(
    pool: BackendPool, rows: Sequence[BackendRow], *, now: float | None = None
) -> list[LiveBackend]:
    """The view of ``pool`` and the backends table's ``rows``, by name (then source).

    Pure reads of the pool's fields, no awaits: called on the event loop, it sees one
    consistent moment of the pool (``now``: :func:`time.monotonic`, for the breaker).
    """
    moment = time.monotonic() if now is None else now
    by_name = {row.name: row for row in rows}
    from_database = pool.reads_database
    shown: list[LiveBackend] = []
    routed_rows: set[str] = set()
    for backend in pool.backends:
        if from_database:
            row = by_name.get(backend.name)  # None: deleted since, the pool not yet reloaded
            routed_rows.add(backend.name)
            shown.append(_live(backend, "database", row, moment))
        else:
            source: Source = "embedded" if backend.spec.kind == "emulated" else "config"
            shown.append(_live(backend, source, None, moment))
    shown += [_configured(row) for row in rows if row.name not in routed_rows]
    shown.sort(key=lambda b: (b.name, SOURCES.index(b.source)))
    return shown


def _read_rows(factory: sessionmaker[Session]) -> list[BackendRow]:
    with factory() as session:
        rows = crud.list_backends(session)
        session.expunge_all()  # plain values from here on: read after the session closes
        return rows


async def fleet_view(pool: BackendPool, factory: sessionmaker[Session]) -> list[LiveBackend]:
    """Every backend this gateway routes to or has configured, live (:func:`snapshot`).

    The table is read in a thread; the pool is read on the event loop that owns it. A database
    error propagates (the admin API answers it 503, as its other routes do).
    """
    rows = await asyncio.to_thread(_read_rows, factory)
    return snapshot(pool, rows)
