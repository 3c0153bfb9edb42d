"""Who may do what in the admin API and the dashboard: the four roles, the access levels a
route asks for, and the signed-in principal that checks them.

One model for both surfaces, so a role means the same in ``/admin/v1`` and ``/ui``:

* ``owner``: everything, including named operators and their roles. ``TIERGATE_ADMIN_KEY`` and
  every credential made before roles existed are owners.
* ``operator``: tiers, tenants, keys, backends, profiles; reads usage and the audit log; cannot
  manage operators.
* ``viewer``: reads everything an operator reads, changes nothing.
* ``tenant_admin``: one tenant's keys and usage, nothing else; another tenant is refused by any
  id or name, and is never looked up (so the refusal says nothing about whether it exists).

Each route names one :class:`Access` level in its surface's rule table
(:mod:`gateway.app.admin.rules`, :mod:`gateway.app.ui.rules`); the route class refuses a role
the level does not allow before the handler runs. Routes of the ``TENANT_*`` levels also scope
what they read or change to the principal's tenant (:meth:`Principal.tenant_filter`,
:meth:`Principal.check_tenant`): the level lets a tenant admin in, the scope keeps it to its own.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gateway.errors import ApiError

__all__ = ["ALLOWED", "Access", "Principal", "Role", "access_for"]

PERMISSION_DENIED = "permission_denied"
"""The error code of a route the role may not call."""
OTHER_TENANT = "other_tenant"
"""The error code of a tenant admin naming anything outside its tenant (or nothing at all)."""


class Role(enum.StrEnum):
    OWNER = "owner"
    OPERATOR = "operator"
    VIEWER = "viewer"
    TENANT_ADMIN = "tenant_admin"


class Access(enum.Enum):
    """What a route needs."""

    ANY = "any"
    """Any signed-in principal (who am I, sign out)."""
    READ = "read"
    """Reads the whole gateway's configuration or usage."""
    WRITE = "write"
    """Changes tiers, tenants, keys, backends or profiles."""
    OWNER = "owner"
    """Manages operators and their roles."""
    TENANT_READ = "tenant_read"
    """Reads keys or usage; a tenant admin only its own tenant's."""
    TENANT_WRITE = "tenant_write"
    """Changes keys; a tenant admin only its own tenant's."""


_STAFF_READ = frozenset({Role.OWNER, Role.OPERATOR, Role.VIEWER})
_STAFF_WRITE = frozenset({Role.OWNER, Role.OPERATOR})
ALLOWED: Mapping[Access, frozenset[Role]] = {
    Access.ANY: frozenset(Role),
    Access.READ: _STAFF_READ,
    Access.WRITE: _STAFF_WRITE,
    Access.OWNER: frozenset({Role.OWNER}),
    Access.TENANT_READ: _STAFF_READ | {Role.TENANT_ADMIN},
    Access.TENANT_WRITE: _STAFF_WRITE | {Role.TENANT_ADMIN},
}
"""The roles each access level lets in."""

_WHAT = {
    Access.ANY: "this",
    Access.READ: "the gateway's configuration, usage and audit log",
    Access.WRITE: "changes to tiers, tenants, keys, backends, profiles, prices and budgets",
    Access.OWNER: "managing operators and their roles",
    Access.TENANT_READ: "keys and usage",
    Access.TENANT_WRITE: "changes to keys",
}


def access_for(rules: Mapping[str, Access], method: str, path: str) -> Access:
    """The level ``rules`` give ``METHOD path`` (HEAD as GET); a route without a rule is the
    owner's alone, so a route added without deciding who may call it fails closed."""
    method = "GET" if method.upper() == "HEAD" else method.upper()
    return rules.get(f"{method} {path}", Access.OWNER)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts as: an operator's name, role and (tenant admins only) tenant."""

    name: str
    role: Role
    tenant_id: int | None = None
    tenant_name: str | None = None

    @property
    def tenant_bound(self) -> bool:
        return self.role is Role.TENANT_ADMIN

    @property
    def may_write(self) -> bool:
        """Whether the whole gateway's configuration is theirs to change (the dashboard shows
        write controls to them only)."""
        return self.role in ALLOWED[Access.WRITE]

    @property
    def is_owner(self) -> bool:
        return self.role is Role.OWNER

    def may(self, access: Access) -> bool:
        return self.role in ALLOWED[access]

    def refusal(self, access: Access) -> ApiError:
        """403 for a level this role does not have."""
        return ApiError(
            403,
            f"operator {self.name!r} is a {self.role.value}: {_WHAT[access]} is not allowed "
            "for that role",
            code=PERMISSION_DENIED,
        )

    def foreign(self, param: str = "tenant") -> ApiError:
        """403 for anything outside a tenant admin's tenant (whether it exists or not)."""
        return ApiError(
            403,
            f"operator {self.name!r} administers tenant {self.tenant_name!r} only",
            code=OTHER_TENANT,
            param=param,
        )

    def owns_ref(self, ref: str | int) -> bool:
        """Whether ``ref`` (an id or a name) names the tenant admin's tenant."""
        text = str(ref).strip()
        return text == self.tenant_name or (
            self.tenant_id is not None and text == str(self.tenant_id)
        )

    def tenant_filter(
        self, ref: str | int | None, resolve: Callable[[str | int], int]
    ) -> int | None:
        """The tenant id a read or change is limited to. Staff: ``ref`` resolved (None: every
        tenant). A tenant admin: its own tenant whether ``ref`` is given or not; another
        tenant's ``ref`` is 403 and is not looked up."""
        if not self.tenant_bound:
            return resolve(ref) if ref is not None else None
        if ref is not None and not self.owns_ref(ref):
            raise self.foreign()
        assert self.tenant_id is not None
        return self.tenant_id

    def check_tenant(self, tenant_id: int | None, param: str = "tenant") -> None:
        """403 unless a tenant admin's tenant is ``tenant_id`` (staff pass)."""
        if self.tenant_bound and tenant_id != self.tenant_id:
            raise self.foreign(param)


OWNER_KEY = Principal("admin-key", Role.OWNER)
"""``TIERGATE_ADMIN_KEY``'s holder: an owner."""
