"""``/keys``: a tenant's API keys, addressed by their prefix (``tg-<prefix8>`` or bare).

The plaintext is in the answer to creating (or rotating) a key and nowhere else. Every change
drops the key's cached identity once committed, so a revocation or a new expiry holds on the
next request. ``/keys/secret-status`` says whether a previous server secret is still needed
(``docs/operations/security.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy.orm import Session

from gateway.app.admin.deps import (
    ActorDep,
    AdminRoute,
    PageDep,
    PrincipalDep,
    SessionDep,
    StateDep,
)
from gateway.app.admin.helpers import (
    change_and_invalidate,
    changes_of,
    delete_row,
    invalidate,
    own_prefix,
    scoped_key,
    tenant_resolver,
)
from gateway.app.admin.schemas import (
    CreatedKeyOut,
    DeletedOut,
    KeyCreate,
    KeyOut,
    KeyRotate,
    KeyUpdate,
    ListOut,
    RotatedKeyOut,
    SecretStatusOut,
)
from gateway.db import crud
from gateway.db.models import ApiKey, utcnow
from gateway.db.security import display_prefix

router = APIRouter(route_class=AdminRoute, tags=["keys"])


def listed_keys(
    session: Session,
    tenant_id: int | None,
    active_only: bool,
    now: datetime,
    limit: int | None,
    offset: int,
) -> tuple[Sequence[ApiKey], int]:
    """A page of keys, newest first, and how many the whole list holds (the API's list and the
    dashboard's Keys page)."""
    rows = crud.list_keys(
        session, tenant=tenant_id, active_only=active_only, now=now, limit=limit, offset=offset
    )
    return rows, crud.count_keys(session, tenant=tenant_id, active_only=active_only, now=now)


@router.get("/keys")
def list_keys(
    session: SessionDep,
    who: PrincipalDep,
    tenant: Annotated[str | None, Query(description="tenant name or id")] = None,
    active_only: Annotated[bool, Query(description="hide revoked and expired keys")] = False,
    *,
    page: PageDep,
) -> ListOut[KeyOut]:
    """Keys, newest first (a tenant admin's: its tenant's only); the total is in
    ``x-total-count``."""
    tenant_id = who.tenant_filter(tenant, tenant_resolver(session))
    now = utcnow()
    rows, total = listed_keys(session, tenant_id, active_only, now, page.limit, page.offset)
    return page.of(total, (KeyOut.of(k, now) for k in rows))


@router.post("/keys", status_code=201)
def create_key(
    body: KeyCreate, session: SessionDep, who: PrincipalDep, actor: ActorDep, state: StateDep
) -> CreatedKeyOut:
    """Issue a key. The response holds the plaintext ``key``: store it now, it is not kept."""
    with session.begin():
        tenant = who.tenant_filter(body.tenant, tenant_resolver(session))
        assert tenant is not None
        created = crud.create_key(
            session,
            actor=actor,
            tenant=tenant,
            secret=state.secret,
            name=body.name,
            expires_at=body.expires_at,
        )
        return CreatedKeyOut.of_created(created)


@router.get("/keys/secret-status")
def secret_status(session: SessionDep, state: StateDep) -> SecretStatusOut:
    """Usable keys by the server secret their hash is under: ``safe_to_drop_previous`` says
    whether ``TIERGATE_SECRET_PREVIOUS`` can be removed without cutting a key off."""
    status = crud.secret_status(session, state.secret)
    return SecretStatusOut(
        current=status.current,
        previous=list(status.previous),
        unrecorded=status.unrecorded,
        other=status.other,
        safe_to_drop_previous=status.waiting == 0,
    )


@router.get("/keys/{prefix}")
def get_key(prefix: str, session: SessionDep, who: PrincipalDep) -> KeyOut:
    return KeyOut.of(scoped_key(session, who, prefix))


@router.patch("/keys/{prefix}")
def update_key(
    prefix: str,
    body: KeyUpdate,
    session: SessionDep,
    who: PrincipalDep,
    actor: ActorDep,
    state: StateDep,
) -> KeyOut:
    """Rename a key or change its expiry (a past expiry expires it now)."""

    def change(s: Session) -> ApiKey:
        scoped_key(s, who, prefix)
        return crud.update_key(s, prefix, changes_of(body), actor=actor)

    return change_and_invalidate(state, session, change, KeyOut.of, own_prefix)


@router.post("/keys/{prefix}/revoke")
def revoke_key(
    prefix: str, session: SessionDep, who: PrincipalDep, actor: ActorDep, state: StateDep
) -> KeyOut:
    """Revoke a key; it stops authenticating on the next request."""

    def change(s: Session) -> ApiKey:
        scoped_key(s, who, prefix)
        return crud.revoke_key(s, prefix, actor=actor)

    return change_and_invalidate(state, session, change, KeyOut.of, own_prefix)


@router.post("/keys/{prefix}/rotate", status_code=201)
def rotate_key(
    prefix: str,
    body: KeyRotate,
    session: SessionDep,
    who: PrincipalDep,
    actor: ActorDep,
    state: StateDep,
) -> RotatedKeyOut:
    """Issue the key's successor (its plaintext ``key`` is in this answer only) and let the old
    key expire after ``grace_s`` seconds (default 24 h; an earlier expiry is kept)."""
    with session.begin():
        scoped_key(session, who, prefix)
        created = crud.rotate_key(
            session,
            prefix,
            actor=actor,
            secret=state.secret,
            grace_s=body.grace_s,
            expires_at=body.expires_at,
        )
        old = crud.get_key(session, prefix)
        out = RotatedKeyOut(
            **CreatedKeyOut.of_created(created).model_dump(), replaces=KeyOut.of(old)
        )
    invalidate(state, [old.prefix])  # its cached identity outlived the new expiry
    return out


@router.delete("/keys/{prefix}")
def delete_key(
    prefix: str, session: SessionDep, who: PrincipalDep, actor: ActorDep, state: StateDep
) -> DeletedOut:
    with session.begin():
        key = scoped_key(session, who, prefix)
        bare = key.prefix
        out = delete_row(session, actor, crud.delete_key, "api_key", key.id, display_prefix(bare))
    invalidate(state, [bare])
    return out
