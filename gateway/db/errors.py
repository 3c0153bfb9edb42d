"""Domain errors of the data layer.

The admin API maps them to HTTP statuses (``NotFound`` 404, ``Conflict`` 409, ``InvalidInput``
422) and the CLI to exit code 2, so the messages are written for the person who sent the input:
they name the entity, the field and the offending value.
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
