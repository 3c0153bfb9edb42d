"""``/audit``: every change made through the API or the CLI, with its before and after."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from gateway.app.admin.deps import AdminRoute, SessionDep
from gateway.app.admin.schemas import (
    MAX_AUDIT_ROWS,
    TOTAL_HEADER,
    AuditOut,
    ListOut,
    PageOffset,
    Since,
    Until,
)
from gateway.db import crud

router = APIRouter(route_class=AdminRoute, tags=["audit"])


@router.get("/audit")
def list_audit(
    session: SessionDep,
    entity_type: Annotated[
        str | None,
        Query(description="tier | tenant | api_key | backend | profile | operator_credential"),
    ] = None,
    entity_id: Annotated[str | None, Query(description="the entity's id")] = None,
    actor: Annotated[
        str | None, Query(description="exactly as recorded, e.g. admin-api:alice@10.0.0.7")
    ] = None,
    operator: Annotated[
        str | None,
        Query(description="a named operator's changes through the API and the dashboard"),
    ] = None,
    since: Since = None,
    until: Until = None,
    limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_ROWS)] = 100,
    offset: PageOffset = 0,
    *,
    response: Response,
) -> ListOut[AuditOut]:
    """Audit entries in ``[since, until)``, newest first, with each change's before and after;
    the total is in ``x-total-count``."""
    filters = {
        "entity_type": entity_type,
        "entity_id": entity_id,
        "actor": actor,
        "operator": operator,
    }
    rows = crud.list_audit(session, since=since, until=until, limit=limit, offset=offset, **filters)
    total = crud.count_audit(session, since=since, until=until, **filters)
    response.headers[TOTAL_HEADER] = str(total)
    return ListOut(data=[AuditOut.model_validate(r) for r in rows])
