"""Model prices (admin API, audited, exact decimals), the cost each usage record is charged
when it is written (a later price change leaves it alone), and migration 0013, on SQLite and
PostgreSQL."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from gateway.db import migrate
from gateway.db.models import UsageRecord
from gateway.db.money import cost_of
from gateway.db.prices import PriceBook
from gateway.db.session import make_engine
from gateway.db.usage import UsageEvent, UsageWriter

from .support import ACTOR, Admin, error

MODEL = "Qwen/Qwen2-7B-Instruct"  # a slash: the path takes it whole


def test_prices_are_created_read_changed_and_deleted_exactly(admin: Admin) -> None:
    made = admin.ok(
        "POST",
        "/prices",
        {"model": MODEL, "prompt_per_mtok": "0.15", "completion_per_mtok": 0.6},
        expect=201,
    )
    assert (made["prompt_per_mtok"], made["completion_per_mtok"]) == ("0.150000", "0.600000")
    ref = made["id"]
    assert admin.ok("GET", f"/prices/{ref}")["model"] == MODEL
    admin.ok(
        "POST",
        "/prices",
        {"model": "plain", "prompt_per_mtok": 1, "completion_per_mtok": 1},
        expect=201,
    )
    assert admin.ok("GET", "/prices/plain")["model"] == "plain"  # by name
    admin.ok("DELETE", "/prices/plain")
    listed = admin.call("GET", "/prices")
    assert listed.headers["x-total-count"] == "1"
    assert [p["model"] for p in listed.json()["data"]] == [MODEL]
    changed = admin.ok("PATCH", f"/prices/{ref}", {"completion_per_mtok": "1.000001"})
    assert changed["completion_per_mtok"] == "1.000001"
    assert changed["prompt_per_mtok"] == "0.150000"
    admin.ok("PATCH", f"/prices/{ref}", {"completion_per_mtok": "1.000001"})  # a no-op
    deleted = admin.ok("DELETE", f"/prices/{ref}")
    assert (deleted["object"], deleted["name"]) == ("price", MODEL)
    error(admin.call("GET", f"/prices/{ref}"), 404)
    entries = [e for e in admin.audit() if e["entity_type"] == "price"]
    entries = [e for e in entries if e["after"] is None or e["after"]["model"] == MODEL]
    entries = [e for e in entries if e["before"] is None or e["before"]["model"] == MODEL]
    assert [e["action"] for e in entries] == ["delete", "update", "create"]  # newest first
    assert {e["actor"] for e in entries} == {ACTOR}
    update = entries[1]
    assert update["before"]["completion_per_mtok"] == "0.600000"
    assert update["after"]["completion_per_mtok"] == "1.000001"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt_per_mtok": "-1", "completion_per_mtok": "1"}, "prompt_per_mtok"),
        ({"prompt_per_mtok": "1", "completion_per_mtok": "0.0000001"}, "completion_per_mtok"),
        ({"prompt_per_mtok": "NaN", "completion_per_mtok": "1"}, "prompt_per_mtok"),
        ({"prompt_per_mtok": "1e9", "completion_per_mtok": "1"}, "prompt_per_mtok"),
        ({"prompt_per_mtok": "abc", "completion_per_mtok": "1"}, "prompt_per_mtok"),
        ({"prompt_per_mtok": True, "completion_per_mtok": "1"}, "prompt_per_mtok"),
        ({"prompt_per_mtok": "1"}, "completion_per_mtok"),
    ],
)
def test_a_bad_price_is_400_naming_it(
    sqlite_admin: Admin, body: dict[str, Any], param: str
) -> None:
    body = {"model": "m", **body}
    err = error(sqlite_admin.call("POST", "/prices", body), 400)
    assert err["param"] == param, err


def test_a_second_price_for_a_model_is_409(sqlite_admin: Admin) -> None:
    body = {"model": "m", "prompt_per_mtok": 1, "completion_per_mtok": 2}
    sqlite_admin.ok("POST", "/prices", body, expect=201)
    assert error(sqlite_admin.call("POST", "/prices", body), 409)["code"]


def _event(request_id: str, model: str, prompt: int, completion: int, **extra: Any) -> UsageEvent:
    return UsageEvent(
        request_id=request_id,
        status="ok",
        tier="gold",
        model=model,
        prompt_tokens=prompt,
        completion_tokens=completion,
        **extra,
    )


def _costs(factory: sessionmaker[Session]) -> dict[str, Decimal | None]:
    with factory() as s:
        return dict(s.execute(select(UsageRecord.request_id, UsageRecord.cost)).all())  # type: ignore[arg-type]


def test_each_record_is_charged_when_written_and_keeps_its_cost(
    session_factory: sessionmaker[Session],
) -> None:
    from gateway.db.crud import prices

    with session_factory.begin() as s:
        prices.create_price(
            s, actor="t", model="m", prompt_per_mtok="0.15", completion_per_mtok="0.6"
        )
    charged: list[tuple[str | None, Decimal]] = []
    book = PriceBook(session_factory, ttl_s=3600)
    writer = UsageWriter(
        session_factory, prices=book, on_priced=lambda t, c: charged.append((t, c))
    )
    try:
        writer.submit(_event("r1", "m", 1000, 333))
        writer.submit(_event("r2", "unpriced", 1000, 333))
        writer.submit(_event("r3", "m", 7, 0, cost=Decimal("2.5")))  # charged by its caller
        assert writer.flush(10)
        with session_factory.begin() as s:
            prices.update_price(s, "m", {"prompt_per_mtok": "9"}, actor="t")
        book.invalidate()
        writer.submit(_event("r4", "m", 1000, 333))
        assert writer.flush(10)
    finally:
        writer.close()
    first = cost_of(1000, 333, Decimal("0.15"), Decimal("0.6"))
    assert first == Decimal("0.000349800")
    later = cost_of(1000, 333, Decimal("9"), Decimal("0.6"))
    assert _costs(session_factory) == {"r1": first, "r2": None, "r3": Decimal("2.5"), "r4": later}
    assert charged == [("gold", first), ("gold", later)]


def test_the_spool_keeps_a_cost_exact(tmp_path: Any) -> None:
    from gateway.db.spool import decode, encode

    row = {"request_id": "r", "cost": Decimal("0.000000001")}
    assert decode(encode(row))["cost"] == Decimal("0.000000001")
    assert "cost" not in decode(encode({"request_id": "r"}))


_TIER = (
    "INSERT INTO tiers (name, weight, ttft_ms, tpot_ms, best_effort_allowed, shed_slack, "
    "created_at, updated_at) VALUES ('t', 1, 500, 50, false, 0, CURRENT_TIMESTAMP, "
    "CURRENT_TIMESTAMP)"
)
_USAGE = (
    "INSERT INTO usage_records (request_id, status, prompt_tokens, completion_tokens, gain, "
    "ideal_gain, slo_met, created_at) VALUES ('old', 'ok', 5, 6, 0, 0, false, CURRENT_TIMESTAMP)"
)


def test_0013_adds_prices_budgets_and_cost_and_its_downgrade_keeps_the_records(
    db_url: str,
) -> None:
    migrate.upgrade(db_url, "0012")
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(_TIER))
            conn.execute(text(_USAGE))
        migrate.upgrade(db_url, "0013")
        with engine.begin() as conn:
            assert conn.execute(text("SELECT cost FROM usage_records")).scalar_one() is None
            conn.execute(
                text(
                    "INSERT INTO model_prices (model, prompt_per_mtok, completion_per_mtok, "
                    "created_at, updated_at) VALUES ('m', 0.123456, 2, CURRENT_TIMESTAMP, "
                    "CURRENT_TIMESTAMP)"
                )
            )
            price = conn.execute(text("SELECT prompt_per_mtok FROM model_prices")).scalar_one()
            assert Decimal(str(price)) == Decimal("0.123456")
        with pytest.raises(Exception, match=r"(?i)check|constraint"), engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO model_prices (model, prompt_per_mtok, completion_per_mtok, "
                    "created_at, updated_at) VALUES ('n', -1, 2, CURRENT_TIMESTAMP, "
                    "CURRENT_TIMESTAMP)"
                )
            )
        migrate.downgrade("0012", db_url)
        with engine.begin() as conn:
            assert conn.execute(text("SELECT request_id FROM usage_records")).scalar_one() == "old"
        migrate.upgrade(db_url)
        assert migrate.current_revisions(db_url) == migrate.head_revisions()
    finally:
        engine.dispose()
