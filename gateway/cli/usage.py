"""``tiergate usage``: requests, tokens, SLO attainment and TDG ratio per tenant or tier."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import typer
from rich.table import Column

from gateway.cli._common import fail, print_table, transaction
from gateway.db import crud
from gateway.db.models import utcnow


def usage(
    by: Annotated[str, typer.Option(help="group by 'tenant' or 'tier'")] = "tenant",
    hours: Annotated[float, typer.Option(min=0.0, help="window: the last HOURS hours")] = 24.0,
) -> None:
    """Usage summary per tenant or tier: requests by outcome, then tokens and SLO attainment of
    finished requests and the TDG ratio of accepted work (rejected ones are never misses)."""
    if by not in ("tenant", "tier"):
        raise fail(f"--by must be 'tenant' or 'tier', got {by!r}")
    since = utcnow() - timedelta(hours=hours)
    with transaction() as session:
        summarize = crud.usage_by_tenant if by == "tenant" else crud.usage_by_tier
        summaries = summarize(session, since=since)
    rows = [
        (
            s.group,
            s.requests,
            s.ok,
            s.rejected,
            s.cancelled,
            s.errors,
            s.total_tokens,
            None if s.slo_attainment is None else f"{s.slo_attainment:.1%}",
            None if s.tdg_ratio is None else f"{s.tdg_ratio:.3f}",
        )
        for s in summaries
    ]
    # tokens and SLO attainment are those of finished (ok) requests: docs/usage.md
    columns = (
        Column(by, no_wrap=True),  # a name is never cut short; the numbers' headers wrap
        "requests",
        "ok",
        "rejected",
        "cancelled",
        "errors",
        "tokens",
        "SLO attainment",
        "TDG ratio",
    )
    print_table(f"usage, last {hours:g} h", columns, rows)
