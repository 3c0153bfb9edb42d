"""Small-scale run of bench/admin_scale.py on the real PostgreSQL: a few hundred rows, every
route answered and checked against what was loaded (no timing is asserted)."""

from __future__ import annotations

import json
import os
from types import ModuleType

import pytest
from sqlalchemy import create_engine, text

from tests.scripts_loader import load_script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("bench/admin_scale.py")


@pytest.fixture(scope="module")
def server_url(bench: ModuleType) -> str:
    url = os.environ.get("TIERGATE_TEST_POSTGRES_URL", bench.DEFAULT_SERVER_URL)
    engine = create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"PostgreSQL unreachable: {exc.__class__.__name__} (CI must run this)")
        pytest.skip(f"PostgreSQL unreachable: {exc.__class__.__name__}")
    finally:
        engine.dispose()
    return url


def _bench_databases(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT datname FROM pg_database WHERE datname LIKE 'tiergate_bench_%'")
            )
            return {r[0] for r in rows}
    finally:
        engine.dispose()


@pytest.mark.slow
def test_small_run_answers_every_route_correctly(
    bench: ModuleType, server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _bench_databases(server_url)
    argv = ["--tenants", "60", "--keys", "180", "--usage", "400", "--days", "3"]
    code = bench.main([*argv, "--repeats", "1", "--server-url", server_url, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert _bench_databases(server_url) == before  # the scratch database was dropped
    loaded = report["loaded"]
    assert (loaded["tenants"], loaded["keys"], loaded["usage"]) == (60, 180, 400)
    assert sum(loaded["usage_by_tier"].values()) == 400
    assert loaded["audit"] >= 60 + 180  # one row per tenant and key, plus the crud's own
    results = {r["name"]: r for r in report["results"]}
    assert len(results) == len(report["results"]) >= 25
    for row in report["results"]:
        assert row["status"] == 200, row
        assert row["check"], row  # pages, totals and the series' requests match the rows
        assert row["p50_ms"] > 0 and row["p95_ms"] >= row["p50_ms"]
        assert row["target_ms"] in (bench.LIST_TARGET_MS, bench.CHART_TARGET_MS)
    assert "60 rows" not in results["API tenants, page 1"]["note"]  # a page is 50
    assert results["API tenants, page 1"]["note"] == "50 rows, total 60"
    assert results["API tenants, last page"]["note"] == "50 rows, total 60"
    assert results["API series 3 d, all"]["note"] == "400 requests of 400"
    assert report["all_checks"] is True


def test_a_wrong_answer_fails_its_check(bench: ModuleType) -> None:
    class Answer:
        def __init__(self, body: dict[str, object], total: str) -> None:
            self.body, self.headers, self.status_code = body, {"x-total-count": total}, 200

        def json(self) -> dict[str, object]:
            return self.body

    assert bench._json_rows(2, 9)(Answer({"data": [1, 2]}, "9"))[0]
    assert not bench._json_rows(2, 9)(Answer({"data": [1, 2]}, "8"))[0]
    assert not bench._json_rows(2, 9)(Answer({"data": [1]}, "9"))[0]
    assert not bench._series_requests(5)(Answer({"data": [{"requests": 4}]}, ""))[0]
    assert bench._series_requests(5)(Answer({"requests": 5}, ""))[0]
