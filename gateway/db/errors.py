"""Domain errors of the data layer.

The admin API answers them in the gateway's one error dialect (:func:`gateway.errors.domain_error`:
``NotFound`` 404 ``not_found``, ``Conflict`` 409 ``already_exists`` / ``in_use`` / ``conflict``,
``InvalidInput`` 400 ``invalid_value``, the status and code a schema's refusal of the same value
gets) and the CLI exits with code 2, so the messages are written for the person who sent the
input: they name the entity, the field and the offending value.
"""

from __future__ import annotations


class DomainError(Exception):
    """Base of every error the CRUD layer raises on purpose."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param  # the input field at fault, when there is one (OpenAI's ``param``)


class NotFound(DomainError):
    """The referenced tier, tenant, key or backend does not exist."""


class Conflict(DomainError):
    """The change conflicts with the current state of the database."""


class AlreadyExists(Conflict):
    """A unique name (or key prefix) is already taken."""


class InUse(Conflict):
    """The entity is still referenced (e.g. a tier that tenants are on) and cannot go."""


class InvalidInput(DomainError):
    """A value is out of range, of the wrong type or inconsistent with another one."""
