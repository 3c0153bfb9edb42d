"""Default tiers and a demo tenant, so a fresh install can serve requests at once.

Idempotent: existing tiers and tenants are left exactly as they are (an operator may have tuned
them); only missing ones are created — also when several processes seed one database at once
(gateways starting together): a default another seeder created first counts as present.

The defaults:

========  ======  ========  ========  ===========  ==========  ================================
tier      weight  TTFT ms   TPOT ms   deadline ms  shed slack  notes
========  ======  ========  ========  ===========  ==========  ================================
premium   4       1000      50        —            0           may ask down to 250 / 25 ms
standard  2       2000      100       —            0           may ask down to 500 / 50 ms
batch     1       5000      200       600000       0           demoted, never shed; 10 min
========  ======  ========  ========  ===========  ==========  ================================

TPOT 50 ms is 20 tokens/s (faster than reading); 100 ms is about reading speed; the weights 4:2:1
follow the scheduling core's tier convention (larger = more important). Rate limits are left
unlimited: they depend on the fleet's capacity, which only the operator knows.

Shed slack (``docs/operations/overload.md``): under overload a request whose predicted first
token is later than its TTFT objective by more than this fraction is refused at once (503
``slo_unattainable``) or, where the tier allows best effort, demoted. 0 for every default tier:
a quick refusal lets the client go elsewhere instead of waiting for a late answer, and the
capacity a late request would take goes to one that is on time (at 10x capacity, standard at
0.25 instead of 0 served fewer requests within their SLO and took capacity from premium: the
numbers are in that document). A tier whose tenants value a late answer nearly as much as a
timely one is where a slack pays. Batch allows best
effort: it is never refused on SLO grounds; a batch request predicted late is served at the
lowest priority, from capacity nothing promised needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.db.crud.tenants import create_tenant, find_tenant
from gateway.db.crud.tiers import create_tier, find_tier
from gateway.db.errors import AlreadyExists
from gateway.db.models import ApiKey

DEMO_TENANT = "demo"
DEMO_TIER = "standard"

DEFAULT_TIERS: tuple[dict[str, Any], ...] = (
    {
        "name": "premium",
        "description": "interactive, most important",
        "weight": 4.0,
        "ttft_ms": 1000.0,
        "tpot_ms": 50.0,
        "min_ttft_ms": 250.0,
        "min_tpot_ms": 25.0,
        "shed_slack": 0.0,
    },
    {
        "name": "standard",
        "description": "interactive, default",
        "weight": 2.0,
        "ttft_ms": 2000.0,
        "tpot_ms": 100.0,
        "min_ttft_ms": 500.0,
        "min_tpot_ms": 50.0,
        "shed_slack": 0.0,
    },
    {
        "name": "batch",
        "description": "offline; served best-effort rather than shed",
        "weight": 1.0,
        "ttft_ms": 5000.0,
        "tpot_ms": 200.0,
        "deadline_ms": 600_000.0,
        "best_effort_allowed": True,
        "shed_slack": 0.0,
    },
)


@dataclass(frozen=True, slots=True)
class SeedResult:
    created_tiers: list[str] = field(default_factory=list)
    created_demo_tenant: bool = False
    demo_key_needed: bool = False  # the demo tenant has no key at all: the caller should issue one


def _created(session: Session, create: Callable[[], object]) -> bool:
    """Run ``create`` in a SAVEPOINT; False if a concurrent seeder took the name first.

    On PostgreSQL another seeder may insert the same default between our check and our
    insert; the unique key's refusal must cost only this one default, not the whole seeding
    transaction. (SQLite's write transactions never overlap: the check is enough there.)
    """
    try:
        with session.begin_nested():
            create()
    except AlreadyExists:
        return False
    return True


def seed_defaults(session: Session, *, actor: str = "seed") -> SeedResult:
    """Create the missing default tiers and the demo tenant (audited like any admin change)."""
    created = []
    for spec in DEFAULT_TIERS:
        new_tier = partial(create_tier, session, actor=actor, **spec)
        if find_tier(session, spec["name"]) is None and _created(session, new_tier):
            created.append(spec["name"])
    demo = partial(create_tenant, session, actor=actor, name=DEMO_TENANT, tier=DEMO_TIER)
    created_tenant = find_tenant(session, DEMO_TENANT) is None and _created(session, demo)
    tenant = find_tenant(session, DEMO_TENANT)
    assert tenant is not None, "the demo tenant was just found or created"
    has_key = session.scalar(select(ApiKey.id).where(ApiKey.tenant_id == tenant.id).limit(1))
    return SeedResult(
        created_tiers=created, created_demo_tenant=created_tenant, demo_key_needed=has_key is None
    )
