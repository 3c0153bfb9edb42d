"""``/profiles``: latency profiles backends can name, shipped with tiergate or imported.

No pool reload: a profile only takes effect through a backend naming it, and a profile in use
cannot be deleted.
"""

from __future__ import annotations

from fastapi import APIRouter

from gateway.app.admin.deps import ActorDep, AdminRoute, SessionDep
from gateway.app.admin.helpers import delete_row, resolve
from gateway.app.admin.schemas import (
    DeletedOut,
    ListOut,
    ProfileImport,
    ProfileOut,
    ProfileSummaryOut,
)
from gateway.db import crud

router = APIRouter(route_class=AdminRoute, tags=["profiles"])


@router.get("/profiles")
def list_profiles(session: SessionDep) -> ListOut[ProfileSummaryOut]:
    """Every profile a backend can name: shipped ones and imported (custom) ones."""
    return ListOut(data=[ProfileSummaryOut.of(e) for e in crud.profile_catalog(session)])


@router.post("/profiles", status_code=201)
def import_profile(body: ProfileImport, session: SessionDep, actor: ActorDep) -> ProfileOut:
    """Store an operator-calibrated profile; backends can then name it."""
    with session.begin():
        row = crud.import_profile(session, body.document, actor=actor, name=body.name)
        return ProfileOut.of(crud.get_profile_entry(session, row.id))


@router.get("/profiles/{ref}")
def get_profile(ref: str, session: SessionDep) -> ProfileOut:
    """A custom profile by name or id, or a shipped one by name."""
    return ProfileOut.of(resolve(crud.get_profile_entry, session, ref))


@router.delete("/profiles/{ref}")
def delete_profile(ref: str, session: SessionDep, actor: ActorDep) -> DeletedOut:
    """Delete a custom profile that no backend names (shipped ones cannot be deleted)."""
    with session.begin():
        row = resolve(crud.get_deletable_profile, session, ref)
        return delete_row(session, actor, crud.delete_profile, "latency_profile", row.id, row.name)
