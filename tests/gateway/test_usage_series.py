"""Usage over time (``gateway.db.crud.usage_series``): buckets, groups, percentiles, SLO
attainment and TDG ratio on hand-computed rows, on SQLite and PostgreSQL — and both databases
giving the same numbers on the same (random) rows."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, insert
from sqlalchemy.orm import Session, sessionmaker
from usage_rows import ACTOR, HOUR, T0, hand_rows, make_tenants, row

from gateway.db import crud
from gateway.db.crud.usage_series import (
    MAX_BUCKETS,
    SeriesPoint,
    auto_bucket,
    usage_series,
    usage_totals,
)
from gateway.db.errors import InvalidInput, NotFound
from gateway.db.models import Base, UsageRecord
from gateway.db.session import make_engine, make_session_factory


@pytest.fixture
def hand_made(session_factory: sessionmaker[Session]) -> sessionmaker[Session]:
    with session_factory.begin() as s:
        acme, beta = make_tenants(s)
        s.execute(insert(UsageRecord), hand_rows(acme, beta))
    return session_factory


def by_key(points: list[SeriesPoint]) -> dict[tuple[str | None, int], SeriesPoint]:
    return {(p.summary.group, int((p.start - T0) / HOUR)): p for p in points}


def test_ungrouped_hourly_series_on_hand_computed_rows(
    hand_made: sessionmaker[Session],
) -> None:
    with hand_made() as s:
        series = usage_series(s, since=T0, until=T0 + 2 * HOUR, bucket="hour")
    assert (series.bucket, series.bucket_s, series.group_by) == ("hour", 3600, "none")
    assert series.bucket_starts() == [T0, T0 + HOUR]
    assert [p.start for p in series.points] == [T0, T0 + HOUR]
    h0, h1 = (p.summary for p in series.points)
    assert (h0.requests, h0.ok, h0.rejected, h0.errors, h0.cancelled) == (8, 5, 1, 1, 1)
    assert (h0.prompt_tokens, h0.completion_tokens) == (18, 29)  # finished requests only
    assert (h0.gain, h0.ideal_gain) == (5.5, 12.0)  # the failure's gain counts, not the reject
    assert h0.slo_met == 4 and h0.slo_attainment == pytest.approx(4 / 5)
    assert h0.tdg_ratio == pytest.approx(5.5 / 12)
    assert (h1.requests, h1.ok, h1.slo_met) == (3, 3, 2)
    ttft0 = series.points[0].ttft_ms  # finished: 50, 100, 200, 400, 800 (not the 5000)
    assert ttft0 == pytest.approx((200.0, 720.0, 784.0))  # p·4 = 2, 3.8, 3.96
    tpot1 = series.points[1].tpot_ms  # 1, 10, 30
    assert tpot1 == pytest.approx((10.0, 28.0, 29.6))  # p·2 = 1, 1.9, 1.98


def test_grouped_by_tenant_and_tier(hand_made: sessionmaker[Session]) -> None:
    with hand_made() as s:
        tenants = usage_series(s, since=T0, until=T0 + 2 * HOUR, bucket="hour", group_by="tenant")
        tiers = usage_series(s, since=T0, until=T0 + 2 * HOUR, bucket="hour", group_by="tier")
    points = by_key(tenants.points)
    assert set(points) == {("acme", 0), ("beta", 0), ("beta", 1), (None, 1)}
    assert tenants.groups[0][0] == "acme"  # most requests first
    assert {g for g, _ in tenants.groups} == {"acme", "beta", None}
    acme = points[("acme", 0)]
    assert acme.summary.group_id is not None
    assert (acme.summary.requests, acme.summary.ok, acme.summary.slo_met) == (7, 4, 3)
    assert acme.ttft_ms == pytest.approx((300.0, 740.0, 788.0))  # 100/200/400/800
    assert acme.tpot_ms == pytest.approx((30.0, 74.0, 78.8))
    assert acme.summary.tdg_ratio == pytest.approx(4.5 / 11)
    single = points[("beta", 0)]
    assert single.ttft_ms == pytest.approx((50.0, 50.0, 50.0))
    deleted = points[(None, 1)]
    assert (deleted.summary.group_id, deleted.summary.requests) == (None, 1)
    tier_points = by_key(tiers.points)
    assert set(tier_points) == {("gold", 0), ("silver", 0), ("silver", 1), ("gold", 1)}
    assert tier_points[("gold", 1)].summary.requests == 1  # the deleted tenant's row
    assert tier_points[("gold", 0)].summary.group_id is None


def test_top_filters_and_totals(hand_made: sessionmaker[Session]) -> None:
    with hand_made() as s:
        top1 = usage_series(
            s, since=T0, until=T0 + 2 * HOUR, bucket="hour", group_by="tenant", top=1
        )
        only_beta = usage_series(s, since=T0, until=T0 + 2 * HOUR, tenant="beta")
        silver = usage_series(s, since=T0, until=T0 + 2 * HOUR, tier="silver", group_by="tier")
        totals = usage_totals(s, since=T0, until=T0 + 2 * HOUR, group_by="tenant")
        with pytest.raises(NotFound):
            usage_series(s, since=T0, until=T0 + HOUR, tenant="nobody")
    assert [g for g, _ in top1.groups] == ["acme"]  # 7 requests; beta has 3
    assert only_beta.bucket == "minute"  # two hours: auto picks minutes
    assert sum(p.summary.requests for p in only_beta.points) == 3
    assert [p.summary.group for p in silver.points] == ["silver"] * 3  # three minutes
    by_group = {p.summary.group: p for p in totals}
    assert {g: p.summary.requests for g, p in by_group.items()} == {"acme": 7, "beta": 3, None: 1}
    assert all(p.start == T0 for p in totals)
    assert by_group["beta"].ttft_ms == pytest.approx((100.0, 280.0, 296.0))  # 50/100/300
    assert by_group["beta"].summary.slo_attainment == pytest.approx(2 / 3)


def test_day_and_minute_buckets_are_utc_aligned(hand_made: sessionmaker[Session]) -> None:
    with hand_made() as s:
        days = usage_series(s, since=T0 - timedelta(days=2), until=T0 + HOUR * 30, bucket="day")
        minutes = usage_series(s, since=T0, until=T0 + HOUR, bucket="minute")
    assert [(p.start, p.summary.requests) for p in days.points] == [
        (T0 - timedelta(days=1), 1),  # the row 1 µs before T0
        (T0, 12),
    ]
    assert len(days.bucket_starts()) == 4  # since is a day boundary; until is 06:00 of day 3
    assert [p.start for p in minutes.points][-1] == T0 + timedelta(minutes=59)
    assert len(minutes.bucket_starts()) == 60


def test_empty_window_and_bad_arguments(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s:
        empty = usage_series(s, since=T0, until=T0 + HOUR)
        assert empty.points == [] and empty.groups == []
        assert len(empty.bucket_starts()) == 60
        for kwargs, param in (
            ({"since": T0, "until": T0}, "since"),
            ({"since": T0.replace(tzinfo=None)}, "since"),
            ({"since": T0, "until": T0 + HOUR, "bucket": "week"}, "bucket"),
            ({"since": T0, "until": T0 + HOUR, "group_by": "model"}, "group_by"),
            ({"since": T0, "until": T0 + HOUR, "top": 0}, "top"),
            ({"since": T0, "until": T0 + HOUR, "top": 51}, "top"),
            ({"since": T0, "until": T0 + timedelta(days=40), "bucket": "minute"}, "bucket"),
        ):
            with pytest.raises(InvalidInput) as refused:
                usage_series(s, **kwargs)
            assert refused.value.param == param, kwargs
    assert MAX_BUCKETS >= 36_525  # a century of days fits


def test_auto_bucket() -> None:
    assert auto_bucket(T0, T0 + timedelta(hours=6)) == "minute"
    assert auto_bucket(T0, T0 + timedelta(hours=7)) == "hour"
    assert auto_bucket(T0, T0 + timedelta(days=30)) == "hour"
    assert auto_bucket(T0, T0 + timedelta(days=32)) == "day"
    assert auto_bucket(T0, T0 + timedelta(days=36_500)) == "day"


def random_rows(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        status = rng.choice(("ok", "ok", "ok", "ok", "rejected", "error", "cancelled"))
        at = T0 + timedelta(seconds=rng.uniform(0, 3 * 86400))
        tenant = rng.choice((1, 2, 3, None))
        rows.append(
            row(
                at,
                status,
                tenant_id=tenant,
                tier=rng.choice(("gold", "silver", "bronze", None)),
                ttft_ms=rng.choice((None, rng.uniform(1, 5000), float(rng.randint(1, 9)))),
                tpot_ms=rng.choice((None, rng.uniform(0.1, 200))),
                prompt_tokens=rng.randint(0, 500),
                completion_tokens=rng.randint(0, 500),
                gain=rng.uniform(0, 10),
                ideal_gain=rng.uniform(0, 10),
                slo_met=rng.random() < 0.7,
            )
        )
    return rows


def load(engine: Engine, rows: list[dict[str, Any]]) -> sessionmaker[Session]:
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    with factory.begin() as s:
        crud.create_tier(s, actor=ACTOR, name="t", weight=1, ttft_ms=100, tpot_ms=10)
        for name in ("one", "two", "three"):
            crud.create_tenant(s, actor=ACTOR, name=name, tier="t")
        s.execute(insert(UsageRecord), rows)
    return factory


def comparable(points: list[SeriesPoint]) -> list[tuple[Any, ...]]:
    return [
        (p.start, p.summary, tuple(p.ttft_ms), tuple(p.tpot_ms))
        for p in sorted(points, key=lambda p: (p.summary.group or "", p.start))
    ]


def assert_same(a: list[SeriesPoint], b: list[SeriesPoint]) -> None:
    assert len(a) == len(b)
    for x, y in zip(comparable(a), comparable(b), strict=True):
        assert x[0] == y[0]
        for field in ("group", "group_id", "requests", "ok", "slo_met", "prompt_tokens"):
            assert getattr(x[1], field) == getattr(y[1], field)
        assert x[1].gain == pytest.approx(y[1].gain, rel=1e-12)
        assert x[1].ideal_gain == pytest.approx(y[1].ideal_gain, rel=1e-12)
        for ours, theirs in zip(x[2] + x[3], y[2] + y[3], strict=True):
            assert (ours is None) == (theirs is None)
            if ours is not None:
                assert ours == pytest.approx(theirs, rel=1e-12)


def test_sqlite_and_postgresql_give_the_same_numbers(sqlite_url: str, postgres_url: str) -> None:
    rows = random_rows(600, seed=11)
    sqlite, postgres = make_engine(sqlite_url), make_engine(postgres_url)
    try:
        lite, pg = load(sqlite, rows), load(postgres, rows)
        cases: list[dict[str, Any]] = [
            {"bucket": "hour"},
            {"bucket": "day", "group_by": "tenant"},
            {"bucket": "hour", "group_by": "tier", "top": 2},
            {"bucket": "minute", "until": T0 + timedelta(hours=5)},
            {"group_by": "tenant", "tenant": "two"},
        ]
        checked = 0
        for case in cases:
            kwargs = {"since": T0, "until": T0 + timedelta(days=3), **case}
            with lite() as a, pg() as b:
                ours, theirs = usage_series(a, **kwargs), usage_series(b, **kwargs)
                assert ours.groups == theirs.groups
                assert_same(ours.points, theirs.points)
                totals = {k: v for k, v in kwargs.items() if k != "bucket"}
                assert_same(usage_totals(a, **totals), usage_totals(b, **totals))
                checked += sum(p.summary.ok > 2 for p in ours.points)
        assert checked > 20  # real percentiles were compared, not only empty buckets
    finally:
        sqlite.dispose()
        postgres.dispose()


def test_records_without_a_tier_are_a_group_of_their_own(
    session_factory: sessionmaker[Session],
) -> None:
    rows = [row(T0, tier=None, ttft_ms=5), row(T0, tier="gold", ttft_ms=7)]
    rows.append(row(T0 + HOUR, tier=None, ttft_ms=9))
    with session_factory.begin() as s:
        s.execute(insert(UsageRecord), rows)
    with session_factory() as s:
        both = usage_series(s, since=T0, until=T0 + 2 * HOUR, bucket="hour", group_by="tier")
        one = usage_series(s, since=T0, until=T0 + HOUR, group_by="tier", top=1)
        totals = usage_totals(s, since=T0, until=T0 + 2 * HOUR, group_by="tier")
    assert both.groups == [(None, None), ("gold", None)]  # 2 requests, then 1
    assert [(p.start, p.summary.group) for p in both.points] == [
        (T0, "gold"),  # within a bucket: by name, no tier last
        (T0, None),
        (T0 + HOUR, None),
    ]
    assert [g for g, _ in one.groups] == ["gold"]  # a tie (1 each): a named tier first
    assert [(p.summary.group, p.summary.requests) for p in totals] == [(None, 2), ("gold", 1)]
    assert totals[0].ttft_ms[0] == pytest.approx(7.0)  # 5 and 9
