"""``tiergate keys``: issue (shown once), list, revoke and rotate API keys; secret status."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import typer

from gateway.cli._common import actor, console, print_table, transaction
from gateway.db import crud
from gateway.db.models import utcnow
from gateway.db.security import display_prefix, server_secret
from gateway.settings import get_settings

keys_app = typer.Typer(help="API keys (shown once, stored hashed).", no_args_is_help=True)


def print_new_key(tenant: str, plaintext: str) -> None:
    console.print(f"API key for tenant [bold]{tenant}[/] — shown once, store it now:")
    typer.echo(plaintext)  # raw, on its own line: no wrapping or markup around the key


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="tenant name")],
    name: Annotated[str | None, typer.Option(help="label, e.g. the application")] = None,
    expires_in_days: Annotated[
        int | None, typer.Option(min=1, help="expire after this many days (unset = never)")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the key")] = False,
) -> None:
    """Issue an API key for a tenant and print it ONCE (only its hash is stored)."""
    now = utcnow()
    expires_at = now + timedelta(days=expires_in_days) if expires_in_days else None
    with transaction() as session:
        created = crud.create_key(
            session,
            actor=actor(),
            tenant=tenant,
            secret=server_secret(get_settings()),
            name=name,
            expires_at=expires_at,
            now=now,
        )
    if quiet:
        typer.echo(created.plaintext)
    else:
        print_new_key(tenant, created.plaintext)


@keys_app.command("revoke")
def keys_revoke(
    prefix: Annotated[str, typer.Argument(help="key prefix, e.g. tg-abcd1234")],
) -> None:
    """Revoke a key by its prefix."""
    with transaction() as session:
        key = crud.revoke_key(session, prefix, actor=actor())
    console.print(f"revoked key {display_prefix(key.prefix)}")


SHOWN_TIME = "%Y-%m-%d %H:%M:%S"
"""To the second: a rotated key's grace may be seconds, and a date alone reads as "today"."""


@keys_app.command("list")
def keys_list(
    tenant: Annotated[str | None, typer.Option(help="only this tenant's keys")] = None,
    active: Annotated[bool, typer.Option("--active", help="only usable keys")] = False,
) -> None:
    """List keys (prefixes only; the keys themselves are not stored)."""
    now = utcnow()
    with transaction() as session:
        keys = crud.list_keys(session, tenant=tenant, active_only=active, now=now)
        rows = []
        for k in keys:
            state = (
                "revoked"
                if k.revoked_at is not None
                else "expired"
                if k.expires_at is not None and k.expires_at <= now
                else "active"
            )
            rows.append(
                (
                    display_prefix(k.prefix),
                    k.tenant.name,
                    k.name,
                    state,
                    k.created_at.strftime(SHOWN_TIME),
                    k.expires_at.strftime(SHOWN_TIME) if k.expires_at else None,
                )
            )
    columns = ("prefix", "tenant", "name", "state", "created (UTC)", "expires (UTC)")
    print_table("keys", columns, rows)


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration_s(text: str) -> float:
    """``90s``, ``30m``, ``24h``, ``7d`` or a bare number of seconds."""
    value, unit = text.strip().lower(), "s"
    if value and value[-1] in _DURATION_UNITS:
        value, unit = value[:-1], value[-1]
    try:
        seconds = float(value) * _DURATION_UNITS[unit]
    except ValueError:
        raise typer.BadParameter(f"{text!r}: use e.g. 90s, 30m, 24h, 7d or 0") from None
    if not 0 <= seconds < float("inf"):
        raise typer.BadParameter(f"{text!r}: a duration is 0 or more")
    return seconds


@keys_app.command("rotate")
def keys_rotate(
    prefix: Annotated[str, typer.Argument(help="the key to replace, e.g. tg-abcd1234")],
    grace: Annotated[
        str, typer.Option(help="how long the old key keeps working: 90s, 30m, 24h, 7d, 0")
    ] = "24h",
    expires_in_days: Annotated[
        int | None, typer.Option(min=1, help="the new key expires after this many days")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the new key")] = False,
) -> None:
    """Issue a key's successor (printed ONCE) and expire the old key after a grace period."""
    grace_s, now = _duration_s(grace), utcnow()
    expires_at = now + timedelta(days=expires_in_days) if expires_in_days else None
    with transaction() as session:
        created = crud.rotate_key(
            session,
            prefix,
            actor=actor(),
            secret=server_secret(get_settings()),
            grace_s=grace_s,
            expires_at=expires_at,
            now=now,
        )
        tenant, old = created.api_key.tenant.name, crud.get_key(session, prefix)
        until = old.expires_at.strftime("%Y-%m-%d %H:%M:%S UTC") if old.expires_at else "—"
    if quiet:
        typer.echo(created.plaintext)
        return
    console.print(f"{display_prefix(old.prefix)} keeps working until {until}")
    print_new_key(tenant, created.plaintext)


@keys_app.command("secret-status")
def keys_secret_status(
    check: Annotated[
        bool, typer.Option("--check", help="exit 1 while a key may still need a previous secret")
    ] = False,
) -> None:
    """Usable keys by the server secret their hash is under (secret rotation: drop
    TIERGATE_SECRET_PREVIOUS once no key is left under it)."""
    with transaction() as session:
        status = crud.secret_status(session, server_secret(get_settings()))
    rows: list[tuple[str, int]] = [("current", status.current)]
    rows += [(f"previous #{i + 1}", n) for i, n in enumerate(status.previous)]
    rows += [("unrecorded (before 0006)", status.unrecorded), ("none: refused", status.other)]
    print_table("usable keys by the secret they are hashed under", ("secret", "keys"), rows)
    if status.waiting:
        console.print(
            f"{status.waiting} key(s) may still need a previous secret: each is re-hashed "
            "under the current one the first time it is used."
        )
    else:
        console.print("no usable key needs a previous secret: TIERGATE_SECRET_PREVIOUS can go")
    if check and status.waiting:
        raise typer.Exit(1)
