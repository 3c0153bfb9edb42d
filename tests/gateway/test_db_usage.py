"""The batched usage writer (no loss under concurrency, database outages, locks or restarts:
memory buffer, disk spool, idempotent replay) and the usage summaries."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

import gateway.db.session as session_module
from gateway.db import crud, migrate
from gateway.db.models import Base, UsageRecord, utcnow
from gateway.db.session import make_engine, make_session_factory
from gateway.db.spool import UsageSpool
from gateway.db.usage import UsageEvent, UsageWriter, _row
from tests.gateway.polling import wait_for

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


def _event(request_id: str, status: str = "ok") -> UsageEvent:
    return UsageEvent(request_id=request_id, status=status, tier="gold", model="m")


def test_records_are_written_by_their_interval_or_a_full_batch_without_a_flush(
    session_factory: sessionmaker[Session],
) -> None:
    """A submit does not wake the writer's thread (a wake-up per request cost the event loop
    CPU); it still writes a record within its interval, and a full batch at once."""
    with UsageWriter(session_factory, batch_size=10, flush_interval_s=0.2) as writer:
        writer.submit(_event("alone"))
        wait_for(lambda: writer.written == 1, "the interval's write")
    with UsageWriter(session_factory, batch_size=10, flush_interval_s=3600) as writer:
        for i in range(9):
            writer.submit(_event(f"batch-{i}"))
        assert writer.buffered == 9
        writer.submit(_event("batch-9"))  # the batch is full: written now, not in an hour
        wait_for(lambda: writer.written == 10, "the full batch")
    assert _count(session_factory) == (11, 11)


FAST_BACKOFF_S = 0.01  # retries every 10-50 ms: the tests wait for the writer, not a clock


def test_a_database_without_the_schema_keeps_records_until_it_has_one(tmp_path: Path) -> None:
    """A state failure (here: no table yet) drops nothing: the records wait in memory and are
    written, once each, when the database can take them."""
    engine = make_engine(f"sqlite:///{tmp_path}/late.db")
    factory = make_session_factory(engine)
    writer = UsageWriter(
        factory,
        flush_interval_s=0.01,
        retry_backoff_s=FAST_BACKOFF_S,
        max_backoff_s=5 * FAST_BACKOFF_S,
    )
    try:
        for i in range(30):
            writer.submit(_event(f"late-{i}"))
        wait_for(lambda: writer.failures >= 3, "retries against the missing table")
        assert writer.failing and (writer.written, writer.dropped) == (0, 0)
        assert writer.buffered == 30
        Base.metadata.create_all(engine)  # the migration arrives
        assert writer.flush(timeout=60)
        assert not writer.failing and writer.buffered == 0
    finally:
        writer.close(timeout=60)
    assert (writer.written, writer.dropped, writer.duplicates) == (30, 0, 0)
    assert _count(factory) == (30, 30)
    engine.dispose()


def test_past_the_memory_bound_records_spill_to_disk_and_are_replayed(
    session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    spool = tmp_path / "usage-spool"
    down = make_session_factory(make_engine(f"sqlite:///{tmp_path}/down.db"))  # no table
    writer = UsageWriter(
        down,
        batch_size=5,
        flush_interval_s=0.01,
        buffer_records=10,
        spool_dir=spool,
        retry_backoff_s=FAST_BACKOFF_S,
        max_backoff_s=5 * FAST_BACKOFF_S,
    )
    for i in range(50):
        writer.submit(_event(f"s-{i}"))
    wait_for(lambda: writer.buffered <= 10 and writer.spooled == 40, "the spill")
    assert list(spool.glob("*.jsonl")) and writer.spool_bytes > 0
    assert (writer.written, writer.dropped) == (0, 0)
    writer._factory = session_factory  # the database is back (the writer's one database handle)
    assert writer.flush(timeout=60)
    writer.close(timeout=60)
    assert (writer.written, writer.dropped, writer.duplicates) == (50, 0, 0)
    assert (writer.spilled, writer.replayed, writer.spooled) == (40, 40, 0)
    assert _count(session_factory) == (50, 50)
    assert not list(spool.glob("*.jsonl"))  # replayed, then deleted


def test_close_with_the_database_down_spools_and_the_next_writer_replays(
    session_factory: sessionmaker[Session], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = tmp_path / "usage-spool"
    down = make_session_factory(make_engine(f"sqlite:///{tmp_path}/down.db"))
    writer = UsageWriter(
        down,
        flush_interval_s=0.01,
        spool_dir=spool,
        retry_backoff_s=FAST_BACKOFF_S,
        max_backoff_s=5 * FAST_BACKOFF_S,
    )
    for i in range(20):
        writer.submit(_event(f"c-{i}", status="cancelled" if i % 2 else "ok"))
    with caplog.at_level(logging.ERROR, logger="gateway.db.usage"):
        writer.close(timeout=60)
    assert (writer.written, writer.dropped, writer.spooled) == (0, 0, 20)
    assert any("20 record(s) spooled" in r.getMessage() for r in caplog.records)
    with UsageWriter(session_factory, spool_dir=spool) as restarted:  # replays at start-up
        assert restarted.flush(timeout=60)
    assert (restarted.replayed, restarted.duplicates, restarted.dropped) == (20, 0, 0)
    assert _count(session_factory) == (20, 20)
    with session_factory() as s:
        statuses = sorted(s.scalars(select(UsageRecord.status)))
        created = s.scalar(select(UsageRecord.created_at).limit(1))
    assert statuses == ["cancelled"] * 10 + ["ok"] * 10
    assert created is not None  # read back as a datetime the column takes
    assert not list(spool.glob("*.jsonl"))


def test_a_record_stored_twice_is_stored_once(
    session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    """A replay of records already in the table (a batch whose commit went through before
    the connection died, a spool replayed twice): ON CONFLICT DO NOTHING, counted as
    duplicates, never a second row — on PostgreSQL through RETURNING, on SQLite its row count."""
    spool_dir = tmp_path / "usage-spool"
    with UsageWriter(session_factory) as writer:
        for i in range(10):
            writer.submit(_event(f"d-{i}"))
    spool = UsageSpool(spool_dir, 1 << 20)
    spool.append([_row(_event(f"d-{i}")) for i in range(5, 15)])  # 5 stored, 5 new
    spool.close()
    with UsageWriter(session_factory, spool_dir=spool_dir) as replaying:
        assert replaying.flush(timeout=60)
    assert (replaying.written, replaying.duplicates, replaying.replayed) == (5, 5, 10)
    assert _count(session_factory) == (15, 15)


def test_records_of_a_tenant_or_key_deleted_while_buffered_are_kept(
    session_factory: sessionmaker[Session],
) -> None:
    """Served tokens are never lost to a foreign key: a record whose key (or tenant) was
    deleted before it was written is stored as ON DELETE SET NULL would have left it, beside
    the other records of that batch; one refused for another reason is still dropped."""
    with session_factory.begin() as s:
        crud.create_tier(s, actor=ACTOR, name="gold", weight=2, ttft_ms=800, tpot_ms=40)
        kept = crud.create_tenant(s, actor=ACTOR, name="kept", tier="gold")
        gone = crud.create_tenant(s, actor=ACTOR, name="gone", tier="gold")
        kept_key = crud.create_key(s, actor=ACTOR, tenant="kept", secret="s" * 32).api_key
        dropped_key = crud.create_key(s, actor=ACTOR, tenant="kept", secret="s" * 32).api_key
        gone_key = crud.create_key(s, actor=ACTOR, tenant="gone", secret="s" * 32).api_key
        ids = (kept.id, gone.id, kept_key.id, dropped_key.id, gone_key.id)
    kept_id, gone_id, kept_key_id, dropped_key_id, gone_key_id = ids
    with session_factory.begin() as s:
        crud.delete_key(s, dropped_key_id, actor=ACTOR)
        crud.delete_tenant(s, gone_id, actor=ACTOR)

    def event(request_id: str, tenant_id: int, key_id: int, **extra: Any) -> UsageEvent:
        return UsageEvent(
            request_id=request_id,
            status="ok",
            tier="gold",
            model="m",
            tenant_id=tenant_id,
            api_key_id=key_id,
            completion_tokens=5,
            **extra,
        )

    with UsageWriter(session_factory, batch_size=10, flush_interval_s=60) as writer:
        writer.submit(event("live", kept_id, kept_key_id))
        writer.submit(event("key-deleted", kept_id, dropped_key_id))
        writer.submit(event("tenant-deleted", gone_id, gone_key_id))
        assert writer.flush(timeout=60)
    assert (writer.written, writer.dropped) == (3, 0)
    with session_factory() as s:
        rows = {
            r.request_id: (r.tenant_id, r.api_key_id, r.completion_tokens)
            for r in s.scalars(select(UsageRecord))
        }
    assert rows == {
        "live": (kept_id, kept_key_id, 5),
        "key-deleted": (kept_id, None, 5),
        "tenant-deleted": (None, None, 5),
    }


def test_a_full_spool_drops_what_it_cannot_take_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    down = make_session_factory(make_engine(f"sqlite:///{tmp_path}/down.db"))
    writer = UsageWriter(
        down,
        batch_size=10,
        flush_interval_s=0.01,
        buffer_records=10,
        spool_dir=tmp_path / "usage-spool",
        spool_max_bytes=4096,  # about ten records
        retry_backoff_s=FAST_BACKOFF_S,
        max_backoff_s=5 * FAST_BACKOFF_S,
    )
    with caplog.at_level(logging.ERROR, logger="gateway.db.usage"):
        for i in range(100):
            writer.submit(_event(f"f-{i}"))
        wait_for(lambda: writer.dropped > 0, "a drop")
        writer.close(timeout=60)
    assert writer.spool_bytes <= 4096
    # every record is accounted for: spooled or dropped, and the drops said so
    assert writer.spooled + writer.dropped == 100 and writer.written == 0
    dropped = [r.getMessage() for r in caplog.records if "dropping" in r.getMessage()]
    assert dropped and all("spool cannot take them" in m for m in dropped)
    assert not any("f-" in m for m in dropped)  # never the records' content


def test_an_unrecognised_error_is_retried_then_isolated(
    session_factory: sessionmaker[Session],
) -> None:
    """An error no classification knows (here a driver's RuntimeError for one row) is retried
    like a state failure, then isolated like a refused value: the other rows are written."""
    writer = UsageWriter(
        session_factory,
        flush_interval_s=0.01,
        max_retries=2,
        retry_backoff_s=FAST_BACKOFF_S,
        max_backoff_s=5 * FAST_BACKOFF_S,
    )
    real_insert = writer._insert

    def insert(rows: list[dict[str, Any]], *, recount: bool) -> int:
        if any(row["request_id"] == "poison" for row in rows):
            raise RuntimeError("the driver choked")
        return real_insert(rows, recount=recount)

    writer._insert = insert  # type: ignore[method-assign]
    for i in range(9):
        writer.submit(_event(f"u-{i}"))
    writer.submit(_event("poison"))
    assert writer.flush(timeout=60)
    writer.close(timeout=60)
    assert (writer.written, writer.dropped) == (9, 1)
    assert writer.failures == 2  # retried max_retries times first
    assert _count(session_factory) == (9, 9)


def test_a_sqlite_write_lock_held_past_the_busy_timeout_loses_nothing(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CLI (or any other process) holds SQLite's write lock longer than
    the busy timeout: the writer's batches are "database is locked" (busy), kept and retried,
    and all written once the lock is released."""
    monkeypatch.setattr(session_module, "SQLITE_BUSY_TIMEOUT_MS", 20)
    engine = make_engine(sqlite_url)
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    writer = UsageWriter(
        factory,
        flush_interval_s=0.01,
        retry_backoff_s=FAST_BACKOFF_S,
        max_backoff_s=5 * FAST_BACKOFF_S,
    )
    holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        for i in range(40):
            writer.submit(_event(f"l-{i}"))
        wait_for(lambda: writer.failures >= 2, "busy retries")
        assert (writer.written, writer.dropped) == (0, 0)
    finally:
        holder.rollback()
        holder.close()
    assert writer.flush(timeout=60)
    writer.close(timeout=60)
    assert (writer.written, writer.dropped) == (40, 0)
    assert _count(factory) == (40, 40)
    engine.dispose()


CLI_PROCESSES = 4
CLI_RUNNER = """
import sys, time
from pathlib import Path
from tiergate_cli import app
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
ready.touch()
while not go.exists():
    time.sleep(0.005)
app(sys.argv[3:], prog_name="tiergate")
"""


def _create_tenant(i: int) -> list[str]:
    return ["tenants", "create", f"cli-{i}", "--tier", "gold"]


@pytest.mark.slow
def test_cli_writes_and_usage_writes_on_one_sqlite_file_lose_nothing(
    sqlite_url: str, tmp_path: Path
) -> None:
    """``tiergate tenants create`` from several processes while the gateway's writer inserts
    usage into the same SQLite file: every command succeeds, every record is written once."""
    migrate.upgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    factory = make_session_factory(engine)
    with factory.begin() as session:
        crud.create_tier(session, actor="t", name="gold", weight=2, ttft_ms=800, tpot_ms=40)
    env = {**os.environ, "TIERGATE_DATABASE_URL": sqlite_url, "TIERGATE_SECRET": "cli-usage"}
    go, ready = tmp_path / "go", [tmp_path / f"ready-{i}" for i in range(CLI_PROCESSES)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CLI_RUNNER, str(flag), str(go), *_create_tenant(i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, flag in enumerate(ready)
    ]
    writer = UsageWriter(factory, batch_size=50, flush_interval_s=0.005)
    submitted = 0
    try:
        wait_for(lambda: all(flag.exists() for flag in ready), "the CLI processes", 120)
        go.touch()
        while any(p.poll() is None for p in processes) or submitted < 1000:
            for _ in range(25):
                writer.submit(_event(f"cli-usage-{submitted}"))
                submitted += 1
            time.sleep(0.002)
        outcomes = [p.communicate(timeout=120) for p in processes]
        assert writer.flush(timeout=120)
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
        writer.close(timeout=120)
    assert [p.returncode for p in processes] == [0] * CLI_PROCESSES, outcomes
    assert (writer.written, writer.dropped) == (submitted, 0)
    assert _count(factory) == (submitted, submitted)
    with factory() as session:
        names = {t.name for t in crud.list_tenants(session)}
    assert {f"cli-{i}" for i in range(CLI_PROCESSES)} <= names
    engine.dispose()


def test_a_segment_another_process_holds_is_not_replayed(tmp_path: Path) -> None:
    """Workers share one spool directory: a segment still being appended to (its flock held)
    is skipped by the others, and claimable once its writer lets go of it."""
    directory = tmp_path / "usage-spool"
    writing, replaying = UsageSpool(directory, 1 << 20), UsageSpool(directory, 1 << 20)
    assert writing.append([_row(_event("w-1")), _row(_event("w-2"))]) == 2
    assert list(replaying.claim()) == []  # held by ``writing`` (another open file)
    writing.rotate()
    (segment,) = replaying.claim()
    assert [r["request_id"] for batch in segment.batches(10) for r in batch] == ["w-1", "w-2"]
    segment.remove()
    assert not replaying.has_segments()


def test_a_torn_last_line_is_skipped_and_counted(
    session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    directory = tmp_path / "usage-spool"
    spool = UsageSpool(directory, 1 << 20)
    spool.append([_row(_event("t-1")), _row(_event("t-2"))])
    spool.close()
    (path,) = directory.glob("*.jsonl")
    with path.open("ab") as file:
        file.write(b'{"request_id": "t-3", "sta')  # a crash in mid-append
    with UsageWriter(session_factory, spool_dir=directory) as writer:
        assert writer.flush(timeout=60)
    assert (writer.written, writer.dropped) == (2, 1)
    assert _count(session_factory) == (2, 2)


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
