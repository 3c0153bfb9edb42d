"""The gateway's database: models, sessions, API-key security, CRUD, usage writing, seeding."""

from gateway.db.errors import AlreadyExists, Conflict, DomainError, InUse, InvalidInput, NotFound
from gateway.db.identity import EffectivePolicy, KeyIdentity
from gateway.db.session import make_engine, make_session_factory

__all__ = [
    "AlreadyExists",
    "Conflict",
    "DomainError",
    "EffectivePolicy",
    "InUse",
    "InvalidInput",
    "KeyIdentity",
    "NotFound",
    "make_engine",
    "make_session_factory",
]
