"""``tiergate tiers``: service classes (weight, SLOs, limits) that tenants are on.

``update`` takes every field the admin API's ``PATCH /admin/v1/tiers/{name}`` takes; an
optional field is cleared (set to null: unlimited, no deadline) with ``--clear``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from gateway.bounds import MAX_SHED_SLACK, MAX_WEIGHT, MIN_WEIGHT
from gateway.cli._common import (
    RPM_NAMES,
    TPM_NAMES,
    actor,
    bounded,
    console,
    limit_option,
    partial_update,
    print_table,
    slo_ms_option,
    transaction,
    update_row,
)
from gateway.db import crud
from gateway.db.crud.tiers import UPDATABLE
from gateway.db.models import Tier

tiers_app = typer.Typer(help="Service tiers: weights, SLOs, limits.", no_args_is_help=True)


def _weight(help_text: str) -> Any:
    return bounded(MIN_WEIGHT, MAX_WEIGHT, help_text)


_SHED_SLACK_HELP = (
    "how late (a fraction of the TTFT SLO) a predicted first token may be and the request "
    "still be admitted under overload"
)


# Options create and update take alike (unset: none, unlimited).
_DeadlineMs = Annotated[float | None, slo_ms_option("end-to-end deadline, ms")]
_MinTtftMs = Annotated[float | None, slo_ms_option("tightest TTFT allowed, ms")]
_MinTpotMs = Annotated[float | None, slo_ms_option("tightest TPOT allowed, ms")]
_MinDeadlineMs = Annotated[float | None, slo_ms_option("tightest deadline allowed, ms")]
_MaxConcurrency = Annotated[int | None, limit_option("requests in flight")]
_Description = Annotated[str | None, typer.Option(help="free text")]


class TierKind(StrEnum):
    """A tier's default request kind (:data:`gateway.db.crud.tiers.TIER_KINDS`)."""

    latency = "latency"
    deadline = "deadline"
    best_effort = "best-effort"


_KIND_HELP = (
    "the kind of a request that names none: latency (TTFT/TPOT), or deadline / best-effort "
    "(scheduled to --deadline-ms, which they need)"
)


class Clearable(StrEnum):
    """The optional tier fields ``--clear`` sets to null, by their option's name."""

    description = "description"
    deadline_ms = "deadline-ms"
    min_ttft_ms = "min-ttft-ms"
    min_tpot_ms = "min-tpot-ms"
    min_deadline_ms = "min-deadline-ms"
    rpm_limit = "rpm-limit"
    tpm_limit = "tpm-limit"
    rpm = "rpm"  # the names before (aliases)
    tpm = "tpm"
    max_concurrency = "max-concurrency"


def _shown(tier: Tier) -> dict[str, Any]:
    """What ``update`` reports a change of: every field it may change."""
    return {field: getattr(tier, field) for field in UPDATABLE}


@tiers_app.command("create")
def tiers_create(
    name: Annotated[str, typer.Argument(help="tier name")],
    weight: Annotated[float, _weight("priority weight (larger = more important)")],
    ttft_ms: Annotated[float, slo_ms_option("default time-to-first-token SLO, ms")],
    tpot_ms: Annotated[float, slo_ms_option("default time-per-output-token SLO, ms")],
    deadline_ms: _DeadlineMs = None,
    min_ttft_ms: _MinTtftMs = None,
    min_tpot_ms: _MinTpotMs = None,
    min_deadline_ms: _MinDeadlineMs = None,
    rpm: Annotated[
        int | None, limit_option("requests per minute (unset = unlimited)", *RPM_NAMES)
    ] = None,
    tpm: Annotated[
        int | None, limit_option("tokens per minute (unset = unlimited)", *TPM_NAMES)
    ] = None,
    max_concurrency: _MaxConcurrency = None,
    best_effort: Annotated[
        bool, typer.Option(help="serve best-effort instead of shedding when the SLO is infeasible")
    ] = False,
    shed_slack: Annotated[float, bounded(0.0, MAX_SHED_SLACK, _SHED_SLACK_HELP)] = 0.0,
    description: _Description = None,
    default_kind: Annotated[TierKind, typer.Option(help=_KIND_HELP)] = TierKind.latency,
) -> None:
    """Create a tier."""
    with transaction() as session:
        tier = crud.create_tier(
            session,
            actor=actor(),
            name=name,
            weight=weight,
            ttft_ms=ttft_ms,
            tpot_ms=tpot_ms,
            deadline_ms=deadline_ms,
            min_ttft_ms=min_ttft_ms,
            min_tpot_ms=min_tpot_ms,
            min_deadline_ms=min_deadline_ms,
            rpm_limit=rpm,
            tpm_limit=tpm,
            max_concurrency=max_concurrency,
            best_effort_allowed=best_effort,
            shed_slack=shed_slack,
            description=description,
            default_kind=str(default_kind),
        )
    console.print(f"created tier [bold]{tier.name}[/] (id {tier.id})")


@tiers_app.command("list")
def tiers_list() -> None:
    """List tiers, most important first."""
    with transaction() as session:
        rows = [
            (
                t.name,
                t.weight,
                t.ttft_ms,
                t.tpot_ms,
                t.deadline_ms,
                t.rpm_limit,
                t.tpm_limit,
                t.max_concurrency,
                t.best_effort_allowed,
                t.shed_slack,
                t.default_kind,
            )
            for t in crud.list_tiers(session)
        ]
    columns = (
        "name",
        "weight",
        "TTFT ms",
        "TPOT ms",
        "deadline ms",
        "RPM",
        "TPM",
        "concurrency",
        "best effort",
        "shed slack",
        "default kind",
    )
    print_table("tiers", columns, rows)


@tiers_app.command("update")
def tiers_update(
    tier: Annotated[str, typer.Argument(help="the tier's current name")],
    name: Annotated[str | None, typer.Option(help="rename the tier")] = None,
    description: _Description = None,
    weight: Annotated[float | None, _weight("priority weight")] = None,
    ttft_ms: Annotated[float | None, slo_ms_option("default TTFT SLO, ms")] = None,
    tpot_ms: Annotated[float | None, slo_ms_option("default TPOT SLO, ms")] = None,
    deadline_ms: _DeadlineMs = None,
    min_ttft_ms: _MinTtftMs = None,
    min_tpot_ms: _MinTpotMs = None,
    min_deadline_ms: _MinDeadlineMs = None,
    rpm: Annotated[int | None, limit_option("requests per minute", *RPM_NAMES)] = None,
    tpm: Annotated[int | None, limit_option("tokens per minute", *TPM_NAMES)] = None,
    max_concurrency: _MaxConcurrency = None,
    best_effort: Annotated[
        bool | None,
        typer.Option(
            "--best-effort/--no-best-effort",
            help="serve best-effort instead of shedding when the SLO is infeasible",
            show_default=False,
        ),
    ] = None,
    shed_slack: Annotated[float | None, bounded(0.0, MAX_SHED_SLACK, _SHED_SLACK_HELP)] = None,
    default_kind: Annotated[
        TierKind | None, typer.Option(help=_KIND_HELP, show_default=False)
    ] = None,
    clear: Annotated[
        list[Clearable] | None,
        typer.Option(
            help="set an optional field back to unset (unlimited, no deadline); repeatable",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Change a tier: only the options given change. Every tenant on it gets the new policy
    (a running gateway within its identity cache TTL)."""
    changes = partial_update(
        {
            "name": name,
            "description": description,
            "weight": weight,
            "ttft_ms": ttft_ms,
            "tpot_ms": tpot_ms,
            "deadline_ms": deadline_ms,
            "min_ttft_ms": min_ttft_ms,
            "min_tpot_ms": min_tpot_ms,
            "min_deadline_ms": min_deadline_ms,
            "rpm_limit": rpm,
            "tpm_limit": tpm,
            "max_concurrency": max_concurrency,
            "best_effort_allowed": best_effort,
            "shed_slack": shed_slack,
            "default_kind": None if default_kind is None else str(default_kind),
        },
        clear,
    )
    update_row("tier", tier, changes, crud.get_tier, crud.update_tier, _shown)


@tiers_app.command("delete")
def tiers_delete(name: Annotated[str, typer.Argument(help="tier name")]) -> None:
    """Delete a tier that no tenant is on."""
    with transaction() as session:
        crud.delete_tier(session, name, actor=actor())
    console.print(f"deleted tier [bold]{name}[/]")
