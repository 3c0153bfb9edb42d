"""``tiergate tenants``: who sends requests, on which tier, with which overrides.

``update`` takes every field the admin API's ``PATCH /admin/v1/tenants/{name}`` takes (rename,
move to another tier, set or ``--clear`` overrides); ``suspend``/``activate`` change the status
as the API's actions do; ``delete`` removes the tenant and its keys as ``DELETE`` does, after a
confirmation (``--yes`` for scripts).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from gateway.cli._common import (
    RPM_NAMES,
    TPM_NAMES,
    actor,
    console,
    fail,
    limit_option,
    partial_update,
    print_table,
    slo_ms_option,
    transaction,
    update_row,
)
from gateway.db import crud
from gateway.db.models import Tenant, utcnow

tenants_app = typer.Typer(help="Tenants and their tiers.", no_args_is_help=True)

_SHOWN = (
    "name",
    "tier",
    "status",
    "ttft_ms",
    "tpot_ms",
    "deadline_ms",
    "rpm_limit",
    "tpm_limit",
    "max_concurrency",
)


# The overrides, as create and update take them (unset: the tier's value).
_TtftMs = Annotated[float | None, slo_ms_option("override the tier's TTFT SLO")]
_TpotMs = Annotated[float | None, slo_ms_option("override the tier's TPOT SLO")]
_DeadlineMs = Annotated[float | None, slo_ms_option("override the tier's deadline")]
_Rpm = Annotated[int | None, limit_option("override the tier's RPM limit", *RPM_NAMES)]
_Tpm = Annotated[int | None, limit_option("override the tier's TPM limit", *TPM_NAMES)]
_MaxConcurrency = Annotated[int | None, limit_option("override the tier's")]


class Clearable(StrEnum):
    """The overrides ``--clear`` removes (the tier's value applies again), by option name."""

    ttft_ms = "ttft-ms"
    tpot_ms = "tpot-ms"
    deadline_ms = "deadline-ms"
    rpm_limit = "rpm-limit"
    tpm_limit = "tpm-limit"
    rpm = "rpm"  # the names before (aliases)
    tpm = "tpm"
    max_concurrency = "max-concurrency"


def _shown(tenant: Tenant) -> dict[str, Any]:
    """What ``update`` reports a change of: the fields, with the tier by name."""
    values = {field: getattr(tenant, field) for field in _SHOWN if field != "tier"}
    return {**values, "tier": tenant.tier.name}


@tenants_app.command("create")
def tenants_create(
    name: Annotated[str, typer.Argument(help="tenant name")],
    tier: Annotated[str, typer.Option(help="tier name")],
    rpm: _Rpm = None,
    tpm: _Tpm = None,
    max_concurrency: _MaxConcurrency = None,
    ttft_ms: _TtftMs = None,
    tpot_ms: _TpotMs = None,
    deadline_ms: _DeadlineMs = None,
) -> None:
    """Create a tenant on a tier."""
    with transaction() as session:
        tenant = crud.create_tenant(
            session,
            actor=actor(),
            name=name,
            tier=tier,
            rpm_limit=rpm,
            tpm_limit=tpm,
            max_concurrency=max_concurrency,
            ttft_ms=ttft_ms,
            tpot_ms=tpot_ms,
            deadline_ms=deadline_ms,
        )
    console.print(f"created tenant [bold]{tenant.name}[/] on tier {tier} (id {tenant.id})")


@tenants_app.command("list")
def tenants_list(
    tier: Annotated[str | None, typer.Option(help="only tenants on this tier")] = None,
) -> None:
    """List tenants."""
    with transaction() as session:
        tenants = crud.list_tenants(session, tier=tier)
        rows = [
            (t.name, t.tier.name, t.status, t.rpm_limit, t.tpm_limit, t.max_concurrency)
            for t in tenants
        ]
    print_table("tenants", ("name", "tier", "status", "RPM", "TPM", "concurrency"), rows)


@tenants_app.command("update")
def tenants_update(
    tenant: Annotated[str, typer.Argument(help="the tenant's current name")],
    name: Annotated[str | None, typer.Option(help="rename the tenant")] = None,
    tier: Annotated[str | None, typer.Option(help="move the tenant to this tier")] = None,
    ttft_ms: _TtftMs = None,
    tpot_ms: _TpotMs = None,
    deadline_ms: _DeadlineMs = None,
    rpm: _Rpm = None,
    tpm: _Tpm = None,
    max_concurrency: _MaxConcurrency = None,
    clear: Annotated[
        list[Clearable] | None,
        typer.Option(
            help="remove an override (the tier's value applies again); repeatable",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Change a tenant: only the options given change. Its keys carry the new policy (a running
    gateway within its identity cache TTL). Suspend and activate have commands of their own."""
    changes = partial_update(
        {
            "name": name,
            "tier": tier,
            "ttft_ms": ttft_ms,
            "tpot_ms": tpot_ms,
            "deadline_ms": deadline_ms,
            "rpm_limit": rpm,
            "tpm_limit": tpm,
            "max_concurrency": max_concurrency,
        },
        clear,
    )
    update_row("tenant", tenant, changes, crud.get_tenant, crud.update_tenant, _shown)


@tenants_app.command("suspend")
def tenants_suspend(name: Annotated[str, typer.Argument(help="tenant name")]) -> None:
    """Suspend a tenant: its keys stop working until it is activated again."""
    with transaction() as session:
        crud.suspend_tenant(session, name, actor=actor())
    console.print(f"suspended tenant [bold]{name}[/]")


@tenants_app.command("activate")
def tenants_activate(name: Annotated[str, typer.Argument(help="tenant name")]) -> None:
    """Re-activate a suspended tenant."""
    with transaction() as session:
        crud.activate_tenant(session, name, actor=actor())
    console.print(f"activated tenant [bold]{name}[/]")


@tenants_app.command("delete")
def tenants_delete(
    name: Annotated[str, typer.Argument(help="tenant name")],
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="delete without asking (for scripts)")
    ] = False,
) -> None:
    """Delete a tenant and all its API keys; its usage records stay (tenant unset).

    Asks first unless ``--yes``: the keys go with the tenant and cannot be restored. The
    question is asked outside any transaction, so no database lock waits on a person.
    """
    now = utcnow()
    with transaction() as session:
        row = crud.get_tenant(session, name)
        tenant_id, keys = row.id, len(row.api_keys)
        usable = sum(
            1
            for k in row.api_keys
            if k.revoked_at is None and (k.expires_at is None or k.expires_at > now)
        )
    if not yes:
        console.print(
            f"Tenant [bold]{name}[/] has {keys} API key(s), {usable} of them usable; they are "
            "deleted with it (its usage records stay)."
        )
        if not typer.confirm(f"Delete tenant {name}?", default=False):
            raise fail(f"tenant {name!r} not deleted", code=1)
    with transaction() as session:
        crud.delete_tenant(session, tenant_id, actor=actor())
    console.print(f"deleted tenant [bold]{name}[/] and its {keys} API key(s)")
