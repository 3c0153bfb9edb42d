"""Stored latency profiles: operator-calibrated documents that backends reference by name.

Operators time their own hardware (``engine_cuda/profile_batches.py``), fit a profile
(``tiergate profile fit``) and import the JSON here. It then lives in the database, so every
gateway reading the backends table loads the same document and no file has to exist on the
gateway's machine. Shipped profile names are reserved: an import never shadows one. Should a
later release ship a name already stored, the stored profile keeps serving its backends.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.db.crud._common import (
    add_named,
    check_name,
    delete_audited,
    find_named,
    get_named,
    lock,
)
from gateway.db.errors import AlreadyExists, Conflict, InUse, InvalidInput, NotFound
from gateway.db.models import Backend, LatencyProfile, utcnow
from priority.profiles import Profile, available_profiles, load_profile

ENTITY = "profile"
REQUIRED_FIELDS = ("name", "hardware", "model", "coefficients")
OBJECT_FIELDS = ("coefficients", "engine", "provenance", "fit")
MAX_DOCUMENT_CHARS = 1_000_000
"""A profile is a few KB; the bound only keeps a wrong file from becoming a huge row."""


@dataclass(frozen=True, slots=True)
class ProfileEntry:
    """A profile a backend can name: shipped with tiergate, or stored (``row`` is set)."""

    profile: Profile
    row: LatencyProfile | None = None

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def source(self) -> Literal["shipped", "custom"]:
        return "shipped" if self.row is None else "custom"


def parse_profile(document: Any, name: str | None = None) -> Profile:
    """The profile a document describes, named ``name`` when given (else by its own name)."""
    if not isinstance(document, Mapping):
        raise InvalidInput(
            f"a profile document must be a JSON object, got {type(document).__name__}",
            param="document",
        )
    fields = {**document, "name": name} if name is not None else dict(document)
    missing = [f for f in REQUIRED_FIELDS if f not in fields]
    if missing:
        raise InvalidInput(
            f"the profile document lacks {', '.join(missing)} (a profile JSON as written by "
            "`tiergate profile fit` has them)",
            param="name" if missing == ["name"] else "document",
        )
    check_name(fields["name"], ENTITY)
    for key in OBJECT_FIELDS:
        if key in fields and not isinstance(fields[key], Mapping):
            raise InvalidInput(
                f"the profile document's {key} must be a JSON object, got {fields[key]!r}",
                param="document",
            )
    try:
        return Profile.from_dict(fields)
    except (ValueError, TypeError, AttributeError) as exc:
        raise InvalidInput(f"invalid profile document: {exc}", param="document") from None


def encode(profile: Profile) -> str:
    """The stored form: the profile's own serialisation, so reading it back is lossless."""
    text = json.dumps(profile.to_dict(), ensure_ascii=False)
    if len(text) > MAX_DOCUMENT_CHARS:
        raise InvalidInput(
            f"the profile document is {len(text)} characters; at most {MAX_DOCUMENT_CHARS}",
            param="document",
        )
    return text


def stored_profile(row: LatencyProfile) -> Profile:
    return Profile.from_dict(json.loads(row.document))


def check_not_shipped(name: str) -> None:
    if _is_shipped(name):
        raise AlreadyExists(
            f"profile name {name!r} is a shipped profile's; import yours under another name",
            param="name",
        )


def import_profile(
    session: Session, document: Any, *, actor: str, name: str | None = None
) -> LatencyProfile:
    """Validate and store a profile document, under ``name`` or the document's own name."""
    profile = parse_profile(document, name)
    check_not_shipped(profile.name)
    row = LatencyProfile(
        name=profile.name, document=encode(profile), created_at=utcnow(), created_by=actor
    )
    return add_named(session, row, profile.name, find_profile, actor=actor, entity=ENTITY)


def ensure_profile(
    session: Session, document: Any, *, actor: str, name: str | None = None
) -> LatencyProfile:
    """:func:`import_profile`, unless the same document is already stored under that name
    (then that row): importing one file for several backends stores it once."""
    profile = parse_profile(document, name)
    existing = find_profile(session, profile.name)
    if existing is None:
        return import_profile(session, document, actor=actor, name=name)
    if existing.document != encode(profile):
        raise AlreadyExists(
            f"a different profile named {profile.name!r} is already stored; import this one "
            "under another name",
            param="name",
        )
    return existing


def get_profile(session: Session, ref: int | str) -> LatencyProfile:
    """A stored profile by id (int) or name (str)."""
    return get_named(session, LatencyProfile, ref, ENTITY)


def find_profile(session: Session, name: str) -> LatencyProfile | None:
    return find_named(session, LatencyProfile, name)


def list_profiles(session: Session) -> list[LatencyProfile]:
    """The stored profiles, by name."""
    return list(session.scalars(select(LatencyProfile).order_by(LatencyProfile.name)))


def stored_profile_names(session: Session) -> list[str]:
    return list(session.scalars(select(LatencyProfile.name).order_by(LatencyProfile.name)))


def is_known_profile(session: Session, name: str) -> bool:
    """Whether a backend may name this profile: shipped, or stored."""
    return name in available_profiles() or find_profile(session, name) is not None


def load_stored_profiles(session: Session, names: Iterable[str]) -> dict[str, Profile]:
    """The stored profiles among ``names``, parsed (the names that are not stored are absent)."""
    wanted = set(names)
    if not wanted:
        return {}
    rows = session.scalars(select(LatencyProfile).where(LatencyProfile.name.in_(wanted)))
    return {row.name: stored_profile(row) for row in rows}


def profile_catalog(session: Session) -> list[ProfileEntry]:
    """Every profile a backend can name, shipped and stored, by name."""
    shipped = [ProfileEntry(load_profile(name)) for name in available_profiles()]
    stored = [ProfileEntry(stored_profile(row), row) for row in list_profiles(session)]
    return sorted([*shipped, *stored], key=lambda e: (e.name, e.source))


def get_profile_entry(session: Session, ref: int | str) -> ProfileEntry:
    """A stored profile by id or name, else a shipped one by name."""
    try:
        row = get_profile(session, ref)
    except NotFound:
        if _is_shipped(ref):
            return ProfileEntry(load_profile(str(ref)))
        raise
    return ProfileEntry(stored_profile(row), row)


def get_deletable_profile(session: Session, ref: int | str) -> LatencyProfile:
    """The stored profile ``ref`` names; a shipped name is a :class:`Conflict`, not NotFound."""
    try:
        return get_profile(session, ref)
    except NotFound:
        if _is_shipped(ref):
            raise Conflict(
                f"profile {ref!r} is shipped with tiergate and cannot be deleted", param=ENTITY
            ) from None
        raise


def delete_profile(session: Session, ref: int | str, *, actor: str) -> None:
    """Delete a stored profile that no backend (enabled or not) names."""
    row = lock(session, get_deletable_profile(session, ref), ENTITY)
    users = list(
        session.scalars(
            select(Backend.name).where(Backend.profile == row.name).order_by(Backend.name)
        )
    )
    if users:
        raise InUse(
            f"profile {row.name!r} is used by backend(s) {', '.join(users)}; point them at "
            "another profile or delete them first",
            param=ENTITY,
        )
    delete_audited(session, row, actor=actor, entity=ENTITY)


def _is_shipped(ref: int | str) -> bool:
    return isinstance(ref, str) and ref in available_profiles()
