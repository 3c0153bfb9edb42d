"""The batched usage writer (no loss under concurrency) and the usage summaries."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.db import crud
from gateway.db.models import UsageRecord, utcnow
from gateway.db.session import make_engine, make_session_factory
from gateway.db.usage import UsageEvent, UsageWriter

ACTOR = "test:carol"


def _count(factory: sessionmaker[Session]) -> tuple[int, int]:
    with factory() as s:
        rows = s.scalar(select(func.count()).select_from(UsageRecord)) or 0
        distinct = s.scalar(select(func.count(func.distinct(UsageRecord.request_id)))) or 0
    return rows, distinct


def test_concurrent_submissions_are_all_written(session_factory: sessionmaker[Session]) -> None:
    threads_n, per_thread = 8, 625  # 5,000 records
    writer = UsageWriter(session_factory, batch_size=500, flush_interval_s=0.5)
    barrier = threading.Barrier(threads_n)

    def produce(t: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            writer.submit(
                UsageEvent(
                    request_id=f"r-{t}-{i}",
                    status="ok",
                    tier="gold",
                    model="m",
                    prompt_tokens=i,
                    completion_tokens=1,
                    gain=1.0,
                    ideal_gain=2.0,
                )
            )

    producers = [threading.Thread(target=produce, args=(t,)) for t in range(threads_n)]
    for p in producers:
        p.start()
    for p in producers:
        p.join()
    writer.close()
    total = threads_n * per_thread
    assert writer.submitted == writer.written == total
    assert writer.dropped == 0
    assert _count(session_factory) == (total, total)


def test_flush_makes_submitted_records_visible(session_factory: sessionmaker[Session]) -> None:
    with UsageWriter(session_factory, batch_size=1000, flush_interval_s=60) as writer:
        for i in range(7):
            writer.submit(UsageEvent(request_id=f"f-{i}", status="ok"))
        assert writer.flush(timeout=30)
        assert _count(session_factory) == (7, 7)  # written long before the 60 s interval
        writer.submit(UsageEvent(request_id="f-7", status="cancelled"))
    assert _count(session_factory) == (8, 8)
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit(UsageEvent(request_id="late", status="ok"))
    writer.close()  # idempotent


def test_a_refusing_database_drops_counted_batches_and_keeps_running(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/empty.db")  # no schema: every INSERT fails
    writer = UsageWriter(make_session_factory(engine), max_retries=1, retry_backoff_s=0.0)
    try:
        writer.submit(UsageEvent(request_id="x", status="ok"))
        writer.flush(timeout=30)
        writer.submit(UsageEvent(request_id="y", status="ok"))
    finally:
        writer.close(timeout=30)
        engine.dispose()
    assert (writer.written, writer.dropped) == (0, 2)


def test_events_are_validated_at_submission() -> None:
    with pytest.raises(ValueError, match="status"):
        UsageEvent(request_id="x", status="done")
    with pytest.raises(ValueError, match="timezone-aware"):
        UsageEvent(request_id="x", status="ok", created_at=utcnow().replace(tzinfo=None))


def test_usage_summaries_on_a_hand_made_set(session_factory: sessionmaker[Session]) -> None:
    with session_factory.begin() as s:
        crud.create_tier(s, actor=ACTOR, name="gold", weight=3, ttft_ms=800, tpot_ms=40)
        crud.create_tier(s, actor=ACTOR, name="silver", weight=1, ttft_ms=2000, tpot_ms=100)
        acme = crud.create_tenant(s, actor=ACTOR, name="acme", tier="gold").id
        beta = crud.create_tenant(s, actor=ACTOR, name="beta", tier="silver").id
        gone = crud.create_tenant(s, actor=ACTOR, name="gone", tier="silver").id
    now = utcnow()
    hour_ago, old = now - timedelta(hours=1), now - timedelta(days=3)

    def ev(
        rid: str,
        tenant: int,
        tier: str,
        status: str,
        p: int,
        c: int,
        met: bool,
        gain: float,
        ideal: float,
        at: datetime = hour_ago,
    ) -> UsageEvent:
        return UsageEvent(
            request_id=rid,
            tenant_id=tenant,
            tier=tier,
            status=status,
            prompt_tokens=p,
            completion_tokens=c,
            slo_met=met,
            gain=gain,
            ideal_gain=ideal,
            created_at=at,
        )

    events = [
        ev("a1", acme, "gold", "ok", 100, 50, True, 4.0, 5.0),
        ev("a2", acme, "gold", "ok", 200, 100, False, 1.0, 5.0),
        ev("a3", acme, "gold", "rejected", 50, 0, False, 0.0, 2.0),
        ev("a-old", acme, "gold", "ok", 999, 999, True, 9.0, 9.0, old),  # outside the window
        ev("b1", beta, "silver", "ok", 10, 10, True, 2.0, 2.0),
        ev("b2", beta, "silver", "error", 10, 0, False, 0.0, 1.0),
        ev("b3", beta, "silver", "cancelled", 30, 5, False, 0.5, 1.0),
        ev("g1", gone, "silver", "ok", 1, 1, True, 1.0, 1.0),
    ]
    with UsageWriter(session_factory) as writer:
        for e in events:
            writer.submit(e)
    with session_factory.begin() as s:
        crud.delete_tenant(s, "gone", actor=ACTOR)  # its usage stays, unattributed

    since = now - timedelta(days=1)
    with session_factory() as s:
        by_tenant = {u.group: u for u in crud.usage_by_tenant(s, since=since)}
        by_tier = {u.group: u for u in crud.usage_by_tier(s, since=since)}
        everything = {u.group: u for u in crud.usage_by_tenant(s)}
        only_acme = crud.usage_by_tenant(s, since=since, tenant="acme")
        until_old = crud.usage_by_tier(s, until=since)

    assert set(by_tenant) == {"acme", "beta", None}
    a = by_tenant["acme"]
    assert a.group_id == acme
    assert (a.requests, a.ok, a.rejected, a.errors, a.cancelled) == (3, 2, 1, 0, 0)
    # a rejection is no usage, no SLO sample and no ideal gain (even on an old row carrying some)
    assert (a.prompt_tokens, a.completion_tokens, a.total_tokens) == (300, 150, 450)
    assert a.slo_met == 1 and a.slo_attainment == pytest.approx(1 / 2)
    assert a.tdg_ratio == pytest.approx(5.0 / 10.0)
    b = by_tenant["beta"]
    assert (b.requests, b.ok, b.errors, b.cancelled) == (3, 1, 1, 1)
    # cancelled and failed work apart from finished requests' tokens and attainment
    assert (b.total_tokens, b.cancelled_tokens, b.failed_tokens) == (20, 35, 10)
    assert b.slo_attainment == 1.0
    assert b.tdg_ratio == pytest.approx(2.5 / 4.0)
    assert by_tenant[None].requests == 1 and by_tenant[None].group_id is None
    assert [u.group for u in only_acme] == ["acme"] and only_acme[0].requests == 3

    gold, silver = by_tier["gold"], by_tier["silver"]
    assert (gold.requests, gold.gain, gold.ideal_gain) == (3, 5.0, 10.0)
    assert (silver.requests, silver.slo_met) == (4, 2)
    assert silver.slo_attainment == pytest.approx(1.0)
    assert silver.tdg_ratio == pytest.approx(3.5 / 5.0)

    assert everything["acme"].requests == 4 and everything["acme"].prompt_tokens == 1299
    assert [(u.group, u.requests) for u in until_old] == [("gold", 1)]
