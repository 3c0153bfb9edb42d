"""Numeric bounds on tiers and tenants: CHECK constraints on every number that reaches the gain.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24

Weights within ``[2**-10, 2**10]`` (the engine's priority clip), SLOs (defaults, minimums,
tenant overrides) within ``[0.001 ms, 1 day]``, limits within ``[1, 2**31 - 1]``: the bounds of
``gateway.bounds``, written here as literals — a migration states the schema of its revision
for good, so a later change of bounds is a later migration.

**Rows already out of bounds are clamped** to the nearest bound before the constraints are
added (a weight of ``1e308`` becomes 1024, a TTFT of ``1e-9`` ms becomes 0.001, a limit of 0
becomes 1), each clamp counted in a warning. Such rows could only have made the gain overflow;
clamping keeps every tier and tenant serving, in the same order, where refusing to migrate would
stop the gateway. The downgrade keeps the clamped values (they satisfy 0002's constraints).

On SQLite, adding a constraint rebuilds the table (Alembic's batch mode: copy, drop, rename).
With foreign keys enforced, dropping ``tenants`` would cascade to every API key and null the
tenant of every usage record, and dropping ``tiers`` would fail on its tenants; so enforcement is
switched off around the rebuild and every reference is checked before it is switched back on
(:func:`_sqlite_foreign_keys_off`). Each step is skipped when already done, so an upgrade cut
short between the rebuild and the version stamp can simply be run again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from alembic import context, op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger(__name__)

WEIGHT = (0.0009765625, 1024.0)  # 2**-10, 2**10
SLO_MS = (0.001, 86_400_000.0)  # a microsecond, a day
LIMIT = (1, 2_147_483_647)  # 2**31 - 1
LIMITS = ("rpm_limit", "tpm_limit", "max_concurrency")
TIER_SLOS = ("ttft_ms", "tpot_ms")
TIER_MIN_SLOS = ("min_ttft_ms", "min_tpot_ms", "min_deadline_ms")
TENANT_SLOS = ("ttft_ms", "tpot_ms", "deadline_ms")


def _range(columns: Sequence[str], low: float, high: float, *, nullable: bool) -> str:
    parts = []
    for column in columns:
        within = f"{column} >= {low!r} AND {column} <= {high!r}"
        parts.append(f"({column} IS NULL OR ({within}))" if nullable else f"({within})")
    return " AND ".join(parts)


TIER_CHECKS = {
    "weight_range": _range(("weight",), *WEIGHT, nullable=False),
    "slo_range": _range(TIER_SLOS, *SLO_MS, nullable=False),
    "deadline_range": _range(("deadline_ms",), *SLO_MS, nullable=True),
    "min_slo_range": _range(TIER_MIN_SLOS, *SLO_MS, nullable=True),
    "limits_range": _range(LIMITS, *LIMIT, nullable=True),
}
TENANT_CHECKS = {
    "slo_range": _range(TENANT_SLOS, *SLO_MS, nullable=True),
    "limits_range": _range(LIMITS, *LIMIT, nullable=True),
}
OLD_TIER_CHECKS = {  # 0001's, restored by the downgrade
    "weight_positive": "weight > 0",
    "slo_positive": "ttft_ms > 0 AND tpot_ms > 0",
    "deadline_positive": "deadline_ms IS NULL OR deadline_ms > 0",
}
CLAMPS: dict[str, tuple[tuple[Sequence[str], tuple[float, float]], ...]] = {
    "tiers": (
        (("weight",), WEIGHT),
        ((*TIER_SLOS, "deadline_ms", *TIER_MIN_SLOS), SLO_MS),
        (LIMITS, LIMIT),
    ),
    "tenants": ((TENANT_SLOS, SLO_MS), (LIMITS, LIMIT)),
}


def upgrade() -> None:
    for table, groups in CLAMPS.items():
        for columns, (low, high) in groups:
            for column in columns:
                _clamp(table, column, low, high)
    with _sqlite_foreign_keys_off():
        _replace_checks("tiers", drop=OLD_TIER_CHECKS, add=TIER_CHECKS)
        _replace_checks("tenants", drop={}, add=TENANT_CHECKS)


def downgrade() -> None:
    with _sqlite_foreign_keys_off():
        _replace_checks("tenants", drop=TENANT_CHECKS, add={})
        _replace_checks("tiers", drop=TIER_CHECKS, add=OLD_TIER_CHECKS)


def _clamp(table: str, column: str, low: float, high: float) -> None:
    """Move ``column``'s values outside ``[low, high]`` to the nearest bound (NULLs stay)."""
    result = op.get_bind().execute(
        sa.text(
            f"UPDATE {table} SET {column} = CASE WHEN {column} < :low THEN :low "
            f"ELSE :high END WHERE {column} < :low OR {column} > :high"
        ),
        {"low": low, "high": high},
    )
    if result.rowcount:
        log.warning(
            "0003: clamped %s.%s into [%r, %r] in %d row(s)",
            table,
            column,
            low,
            high,
            result.rowcount,
        )


def _replace_checks(table: str, *, drop: dict[str, str], add: dict[str, str]) -> None:
    """Drop and add ``table``'s named CHECK constraints (short names, as the ORM writes them),
    skipping those already gone or already there."""
    existing = _check_names(table)
    dropping = [n for n in drop if op.f(f"ck_{table}_{n}") in existing]
    adding = {n: sql for n, sql in add.items() if op.f(f"ck_{table}_{n}") not in existing}
    if not dropping and not adding:
        return
    with op.batch_alter_table(table) as batch:
        for name in dropping:
            batch.drop_constraint(op.f(f"ck_{table}_{name}"), type_="check")
        for name, sql in adding.items():
            batch.create_check_constraint(op.f(f"ck_{table}_{name}"), sql)


def _check_names(table: str) -> set[str]:
    if context.is_offline_mode():  # --sql: nothing to inspect; assume the previous revision
        return {f"ck_{table}_{n}" for n in (OLD_TIER_CHECKS if table == "tiers" else {})}
    checks = sa.inspect(op.get_bind()).get_check_constraints(table)
    return {str(c["name"]) for c in checks if c.get("name")}


@contextmanager
def _sqlite_foreign_keys_off() -> Iterator[None]:
    """SQLite only: foreign keys unenforced while tables are rebuilt, then checked.

    SQLite ignores ``PRAGMA foreign_keys`` inside a transaction, so the pragma is issued between
    transactions on the driver connection: what ran so far is committed (as Alembic's own
    ``autocommit_block`` would), the rebuild runs in a new transaction, and
    ``PRAGMA foreign_key_check`` must find every reference intact before that one commits and
    enforcement returns. On failure the rebuild is rolled back.
    """
    bind = op.get_bind()
    if bind.dialect.name != "sqlite" or context.is_offline_mode():
        yield
        return
    driver = bind.connection.dbapi_connection
    assert driver is not None
    _between_transactions(driver, "PRAGMA foreign_keys=OFF", commit=True)
    try:
        yield
        broken = bind.exec_driver_sql("PRAGMA foreign_key_check").all()
        if broken:
            raise RuntimeError(f"0003: {len(broken)} broken reference(s) after the rebuild")
    except BaseException:
        _between_transactions(driver, "PRAGMA foreign_keys=ON", commit=False)
        raise
    _between_transactions(driver, "PRAGMA foreign_keys=ON", commit=True)


def _between_transactions(driver: Any, pragma: str, *, commit: bool) -> None:
    """End the driver's transaction (commit or roll back), run ``pragma``, begin a new one (the
    transaction SQLAlchemy believes open, and later commits)."""
    if driver.in_transaction:
        driver.execute("COMMIT" if commit else "ROLLBACK")
    driver.execute(pragma)
    driver.execute("BEGIN")
