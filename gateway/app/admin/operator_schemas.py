"""Request and response models of ``/operators`` and ``/me``: named operators, their roles and
(a tenant admin's) tenant. A credential's plaintext is in the answer to creating or resetting
it (:class:`IssuedOperatorOut`) and nowhere else; its hash is never in any answer."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from gateway.app.admin.roles import Principal, Role
from gateway.app.admin.schemas import Input, Name, Ref
from gateway.db.models import OperatorCredential

RoleName = Literal["owner", "operator", "viewer", "tenant_admin"]


class OperatorCreate(Input):
    name: Name
    role: RoleName
    tenant: Ref | None = None
    """A tenant admin's tenant (id or name); no other role takes one."""


class OperatorUpdate(Input):
    role: RoleName
    tenant: Ref | None = None


class OperatorOut(BaseModel):
    object: Literal["operator"] = "operator"
    id: int
    name: str
    role: RoleName
    tenant: str | None
    tenant_id: int | None
    created_at: datetime
    last_used_at: datetime | None

    @classmethod
    def of(cls, row: OperatorCredential) -> OperatorOut:
        return cls(
            id=row.id,
            name=row.name,
            role=Role(row.role).value,
            tenant=row.tenant.name if row.tenant is not None else None,
            tenant_id=row.tenant_id,
            created_at=row.created_at,
            last_used_at=row.last_used_at,
        )


class IssuedOperatorOut(OperatorOut):
    """The answer to creating or resetting an operator: the only time ``credential`` is shown."""

    credential: str


class MeOut(BaseModel):
    """Who the bearer is and what its role allows."""

    object: Literal["principal"] = "principal"
    name: str
    role: RoleName
    tenant: str | None
    tenant_id: int | None

    @classmethod
    def of(cls, who: Principal) -> MeOut:
        return cls(
            name=who.name, role=who.role.value, tenant=who.tenant_name, tenant_id=who.tenant_id
        )
