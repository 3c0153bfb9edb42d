"""``/operators``: named operators, each with its own credential and a role (owner, operator,
viewer, tenant admin; :mod:`gateway.app.admin.roles`), and ``/me``: who the bearer is.

Only an owner changes operators. Creating or resetting one answers its credential once
(``tgop-...``, stored only as its keyed hash); resetting or deleting one ends its dashboard
sessions. A changed role takes effect on the operator's next request. The last owner cannot be
deleted or demoted (409). Every change is audited (``operator_credential``) by the operator who
made it.
"""

from __future__ import annotations

from fastapi import APIRouter

from gateway.app.admin.deps import ActorDep, AdminRoute, PrincipalDep, SessionDep, StateDep
from gateway.app.admin.helpers import tenant_resolver
from gateway.app.admin.operator_schemas import (
    IssuedOperatorOut,
    MeOut,
    OperatorCreate,
    OperatorOut,
    OperatorUpdate,
)
from gateway.app.admin.schemas import DeletedOut, ListOut
from gateway.db.crud import operators
from gateway.db.crud.operators import IssuedCredential

router = APIRouter(route_class=AdminRoute, tags=["operators"])


def _issued(issued: IssuedCredential) -> IssuedOperatorOut:
    out = OperatorOut.of(issued.row).model_dump()
    return IssuedOperatorOut(**out, credential=issued.plaintext)


@router.get("/me")
def me(who: PrincipalDep) -> MeOut:
    """The bearer's operator name, role and (a tenant admin's) tenant."""
    return MeOut.of(who)


@router.get("/operators")
def list_operators(session: SessionDep) -> ListOut[OperatorOut]:
    """Named operators by name (never a credential or its hash)."""
    return ListOut(data=[OperatorOut.of(r) for r in operators.list_operators(session)])


@router.post("/operators", status_code=201)
def create_operator(
    body: OperatorCreate, session: SessionDep, actor: ActorDep, state: StateDep
) -> IssuedOperatorOut:
    """A new operator; the answer's ``credential`` is shown this once: hand it over now."""
    with session.begin():
        tenant = tenant_resolver(session)(body.tenant) if body.tenant is not None else None
        issued = operators.create_credential(
            session, actor=actor, secret=state.secret, name=body.name, role=body.role, tenant=tenant
        )
        return _issued(issued)


@router.get("/operators/{name}")
def get_operator(name: str, session: SessionDep) -> OperatorOut:
    return OperatorOut.of(operators.get_operator(session, name))


@router.patch("/operators/{name}")
def update_operator(
    name: str, body: OperatorUpdate, session: SessionDep, actor: ActorDep
) -> OperatorOut:
    """Change an operator's role (and a tenant admin's tenant)."""
    with session.begin():
        tenant = tenant_resolver(session)(body.tenant) if body.tenant is not None else None
        row = operators.set_role(session, name, actor=actor, role=body.role, tenant=tenant)
        return OperatorOut.of(row)


@router.post("/operators/{name}/reset", status_code=201)
def reset_operator(
    name: str, session: SessionDep, actor: ActorDep, state: StateDep
) -> IssuedOperatorOut:
    """A new credential for the operator (shown once); the old one and its sessions end."""
    with session.begin():
        operators.get_operator(session, name)  # 404 rather than a new operator
        issued = operators.reset_credential(session, actor=actor, secret=state.secret, name=name)
        return _issued(issued)


@router.delete("/operators/{name}")
def delete_operator(name: str, session: SessionDep, actor: ActorDep) -> DeletedOut:
    """Delete an operator: its credential stops working and its sessions end."""
    with session.begin():
        row = operators.delete_operator(session, name, actor=actor)
        return DeletedOut(object="operator", id=row.id, name=row.name)
