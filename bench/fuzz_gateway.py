"""Schemathesis against the gateway's own OpenAPI: every `/v1` and `/admin/v1` operation, with
valid and invalid credentials, positive and negative inputs.

    python bench/fuzz_gateway.py [--cases 10000] [--seed 0] [--json] [--quick] [--no-hostile]
        [--only v1|admin] [--database-url URL] [--time-scale X]

Why a live gateway and not schemathesis' in-process ASGI transport: that transport opens a
fresh test client per call, which would run the app's lifespan (database, backend pool, usage
writer) for every case, and it buffers responses. Here the real stack runs: one emulated engine
(:class:`~engine_emulated.EngineThread`) behind the gateway under uvicorn
(:class:`~gateway.app.server.GatewayThread`) on a seeded database, as ``make run`` serves it, so
streamed (SSE) answers, admission, routing, relay and accounting all run for every case.

Credentials, per case: ``valid`` (a tenant's key on `/v1`, the admin key on `/admin/v1`), and
three invalid kinds, which must all be answered 401 before anything else is looked at:
``missing`` (no ``Authorization``), ``wrong`` (a cycle of bad values: an unknown key, a revoked
key, a suspended tenant's key, an empty or non-bearer header, a huge token) and ``swapped`` (the
other plane's valid key: the admin key on `/v1`, a tenant key on `/admin/v1`).

Checks on every response: schemathesis' ``not_a_server_error`` (no status >= 500 at all, as
the gateway promises, documented or not), ``status_code_conformance``, ``content_type_conformance``,
``response_schema_conformance`` and ``response_headers_conformance``; plus this script's
``auth_enforced`` (invalid credentials get 401) and ``sse_well_formed`` (every event of a stream
is ``data: <JSON>`` or ``data: [DONE]``). A request that gets no HTTP answer at all (connection
dropped, timeout: how a crash in the server shows) is the failure ``transport``; an operation
schemathesis cannot generate for is ``invalid_schema`` / ``generation_error``. After the run,
every request's usage record must have been written (``usage_dropped``).

Generated inputs are shaped, never filtered (:func:`shape_body`, :func:`shape_headers`,
:func:`shape_admin`), so that the emulated engine answers in milliseconds, workflow headers come
in the pairs the API needs, and admin cases meet real entities: a generation
length the engine would serve is capped at :data:`MAX_TOKENS_CAP`, one it would refuse is kept
in a body of four; the served model is named in four bodies of five; every other admin case aims
its ``ref`` / ``prefix`` / ``tier`` / ``tenant`` at a seeded :data:`TARGET` entity (else random
names meet nothing but 404s). A value is only ever replaced by one of the same JSON type, so
invalid inputs stay invalid. Admin reads run first, then creations, updates, deletions, then
`/v1` (:func:`operation_order`), which thus serves with whatever tiers the admin cases left.

Hostile inputs come first, on top of ``--cases``: a fixed set, with valid credentials, of what a
schema-driven generator never writes (:func:`hostile_bodies`, :func:`hostile_parameters`):
nesting 5000 deep, ``NaN`` / ``Infinity`` / ``1e400`` / a 5000-digit integer, a lone surrogate
or a NUL in a string, a byte order mark, bytes that are not UTF-8, duplicate keys, and a NUL or a
5000-character value in each parameter — one probe at a time in an otherwise accepted body.

Where the app's schema documents nothing to fuzz — `/v1` bodies are read from the raw request,
and the SLO headers are read by hand — an OpenAI-shaped body schema and the SLO header
parameters are filled in (only where missing, so a schema that documents them is used as is);
each such patch is listed under ``schema_gaps`` in the report: they are defects of the schema.

The run is seeded: the same ``--seed``, schema and code generate the same cases (statuses can
still differ with timing). ``--cases`` is spread over operations (generation endpoints weigh 3,
the rest 1) and credential kinds; operations whose input space is small run out of distinct
cases early, and the rest is topped up in further seeded rounds. The report: cases and statuses
per operation, failures grouped by (operation, credentials, check, status) with a count and a
curl command reproducing the first one, the wall time. Exit status 1 if anything failed.

`tests/gateway/test_fuzz.py` runs the same harness with a few hundred cases in CI.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
import sys
import tempfile
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from pydantic import SecretStr
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core import NOT_SET
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from engine_emulated import EngineSpec, EngineThread
from gateway.app import BackendSpec, create_app
from gateway.app.server import GatewayThread
from gateway.db import crud
from gateway.db.models import Base
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.db.usage import UsageWriter
from gateway.settings import Settings
from priority.profiles import load_profile

MODEL = "qwen2-7b"
PROFILE = "a100-qwen2-7b"
SECRET = "fuzz-gateway-secret"
ADMIN_KEY = "fuzz-admin-key"
MAX_MODEL_LEN = 4096
"""The emulated engine's context: a ``max_tokens`` above it is refused without generating."""
MAX_TOKENS_CAP = 8
"""Longest generation a fuzz case asks for: keeps a case at a few milliseconds."""
MAX_BODY_BYTES = 64 * 1024
REQUEST_TIMEOUT_S = 30.0
TIME_SCALE = 20.0
"""How much faster than real time the emulated engine runs (the default-length generations)."""

GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
PREFIXES = ("/v1/", "/admin/v1/")
CREDENTIALS = ("valid", "missing", "wrong", "swapped")
# Share of an operation's cases per (credentials, generation mode): invalid credentials are
# cheap to refuse, so a fifth of the budget is enough for them.
PLAN: tuple[tuple[str, GenerationMode, float], ...] = (
    ("valid", GenerationMode.POSITIVE, 0.45),
    ("valid", GenerationMode.NEGATIVE, 0.35),
    ("missing", GenerationMode.POSITIVE, 0.07),
    ("wrong", GenerationMode.NEGATIVE, 0.07),
    ("swapped", GenerationMode.POSITIVE, 0.06),
)
TOP_UP_ROUNDS = 6
USAGE_FLUSH_TIMEOUT_S = 60.0
HOSTILE = "hostile"
"""The mode of the hand-written hostile inputs (:func:`hostile_bodies`)."""
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
SCHEMATHESIS_CONFIG: dict[str, Any] = {
    "max-stream-events": 4096,  # read whole streams (a default-length one has ~300 events)
    "request-timeout": REQUEST_TIMEOUT_S,
    # credentials are this harness' job (CREDENTIALS), not random Authorization values
    "generation": {"with-security-parameters": False, "database": "none"},
    # reproductions must show what was sent (`max_tokens` is masked as a "token" otherwise);
    # the keys in them are this run's throw-away ones, replaced by placeholders in the report
    "output": {"sanitization": {"enabled": False}},
}


# ---- the gateway under test -----------------------------------------------------------------


TARGET = "fuzz-target"
"""The tier, tenant, backend row and profile that admin cases aim at (and may change or
delete); the `/v1` cases' tenant and tier ("fuzz") are never aimed at, so they keep serving."""


@dataclass
class Target:
    """A running gateway, the credentials the fuzzer uses and the entities it aims at."""

    base_url: str
    openapi: dict[str, Any]
    tenant_key: str
    admin_key: str
    revoked_key: str
    suspended_key: str
    refs: dict[str, str]
    """Per admin resource (the path segment after `/admin/v1/`): an existing entity's ref."""
    usage: UsageWriter | None = None
    """The gateway's usage writer: after the run, no record may have been dropped."""


def _seed(database_url: str) -> tuple[dict[str, str], dict[str, str]]:
    """Seed the database; returns the keys (plaintext) and the refs of :class:`Target`.

    Default tiers; a tenant on a best-effort tier that allows any SLO header (so valid
    requests are served, not refused or shed for their SLO); the invalid keys of ``wrong`` (one
    revoked, one of a suspended tenant); and the :data:`TARGET` entities with a key.
    """
    engine = make_engine(database_url)
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    anything = 1e-3  # the lowest SLO a header may ask for
    try:
        with factory.begin() as session:
            seed_defaults(session)
            crud.create_tier(
                session,
                actor="fuzz",
                name="fuzz",
                weight=2.0,
                ttft_ms=60_000.0,
                tpot_ms=1_000.0,
                min_ttft_ms=anything,
                min_tpot_ms=anything,
                min_deadline_ms=anything,
                best_effort_allowed=True,
            )
            crud.create_tier(
                session, actor="fuzz", name=TARGET, weight=1.0, ttft_ms=1000.0, tpot_ms=100.0
            )
            for name, tier in (("fuzz", "fuzz"), ("fuzz-suspended", "fuzz"), (TARGET, TARGET)):
                crud.create_tenant(session, actor="fuzz", name=name, tier=tier)
            created = {
                "tenant": crud.create_key(session, actor="fuzz", tenant="fuzz", secret=SECRET),
                "revoked": crud.create_key(session, actor="fuzz", tenant="fuzz", secret=SECRET),
                "suspended": crud.create_key(
                    session, actor="fuzz", tenant="fuzz-suspended", secret=SECRET
                ),
                "target": crud.create_key(session, actor="fuzz", tenant=TARGET, secret=SECRET),
            }
            crud.revoke_key(session, actor="fuzz", ref=created["revoked"].api_key.prefix)
            crud.suspend_tenant(session, actor="fuzz", ref="fuzz-suspended")
            document = load_profile(PROFILE).to_dict()
            crud.import_profile(session, document, actor="fuzz", name=TARGET)
            crud.create_backend(
                session,
                actor="fuzz",
                name=TARGET,
                base_url="http://127.0.0.1:9/",  # never served: create_app gets its backends
                model=MODEL,
                profile=PROFILE,
            )
            keys = {name: key.plaintext for name, key in created.items()}
            refs = {
                "tiers": TARGET,
                "tenants": TARGET,
                "backends": TARGET,
                "profiles": TARGET,
                "keys": created["target"].api_key.prefix,
            }
            return keys, refs
    finally:
        engine.dispose()


@contextmanager
def running_gateway(
    root: Path, *, database_url: str | None = None, time_scale: float = TIME_SCALE
) -> Iterator[Target]:
    """The gateway (uvicorn, a free port) on a seeded database in front of one emulated engine.

    ``database_url`` must name an empty database (default: SQLite under ``root``).
    """
    url = database_url or f"sqlite:///{root / 'fuzz.db'}"
    keys, refs = _seed(url)
    settings = Settings(
        database_url=url,
        secret=SecretStr(SECRET),
        admin_key=SecretStr(ADMIN_KEY),
        data_dir=root,
        redis_url=None,
        max_body_bytes=MAX_BODY_BYTES,
    )
    spec = EngineSpec(
        PROFILE, "vllm-v1-priority", MODEL, time_scale=time_scale, max_model_len=MAX_MODEL_LEN
    )
    with EngineThread([spec]) as engines:
        backends = [BackendSpec("engine-0", engines[0].url, MODEL, PROFILE)]
        app = create_app(settings, backends=backends)
        with GatewayThread(app) as gateway:
            yield Target(
                base_url=gateway.url,
                openapi=app.openapi(),
                tenant_key=keys["tenant"],
                admin_key=ADMIN_KEY,
                revoked_key=keys["revoked"],
                suspended_key=keys["suspended"],
                refs=refs,
                usage=gateway.state.usage_writer,
            )


# ---- the schema that is fuzzed --------------------------------------------------------------

_TEXT_PART = {
    "type": "object",
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
    "required": ["type", "text"],
    "additionalProperties": False,
}
_MESSAGE = {
    "type": "object",
    "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant"]},
        "content": {
            "anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART, "maxItems": 3}]
        },
    },
    "required": ["role", "content"],
    "additionalProperties": False,
}
_TOKEN = {"type": "integer", "minimum": 0, "maximum": 151_935}  # Qwen2's vocabulary
_COMMON = {
    "model": {"type": "string", "minLength": 1},
    "max_tokens": {"type": "integer", "minimum": 1},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "stop": {
        "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}]
    },
    "seed": {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
    "user": {"type": "string"},
}
OPENAI_BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "type": "object",
        "properties": {
            **_COMMON,
            "messages": {"type": "array", "items": _MESSAGE, "minItems": 1, "maxItems": 4},
            "max_completion_tokens": {"type": "integer", "minimum": 1},
        },
        "required": ["model", "messages"],
        "additionalProperties": False,
    },
    "/v1/completions": {
        "type": "object",
        "properties": {
            **_COMMON,
            # one prompt per request (a batch is OpenAI's, but the emulated engine refuses it)
            "prompt": {
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
                    {"type": "array", "items": _TOKEN, "minItems": 1, "maxItems": 256},
                    {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 1,
                        "items": {"type": "array", "items": _TOKEN, "minItems": 1},
                    },
                ]
            },
        },
        "required": ["model", "prompt"],
        "additionalProperties": False,
    },
}
"""What OpenAI's API accepts (the fields the gateway and the engine read; OpenAI refuses unknown
ones, so negative cases add some), for operations whose schema documents no body."""
SLO_HEADERS = ("x-slo-ttft-ms", "x-slo-tpot-ms", "x-slo-deadline-ms")
SLO_HEADER_SCHEMA = {"type": "number", "minimum": 1, "maximum": 86_400_000}
"""The SLO headers (docs: a positive number of milliseconds up to a day); positive cases ask
for at least a millisecond (a tier may refuse less), negative ones for anything else."""


def fuzzed_schema(openapi: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The `/v1` and `/admin/v1` operations of ``openapi``, with what they fail to document
    filled in (see the module docstring); returns the schema and the list of patches."""
    schema = copy.deepcopy(dict(openapi))
    schema["paths"] = {p: ops for p, ops in schema["paths"].items() if p.startswith(PREFIXES)}
    gaps: list[str] = []
    for path, body in OPENAI_BODIES.items():
        operation = schema["paths"].get(path, {}).get("post")
        if operation is None:
            continue
        if "requestBody" not in operation:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": body}},
            }
            gaps.append(f"POST {path}: no requestBody documented (OpenAI's body filled in)")
        documented = {p.get("name", "").lower() for p in operation.get("parameters", [])}
        missing = [h for h in SLO_HEADERS if h not in documented]
        for header in missing:
            operation.setdefault("parameters", []).append(
                {
                    "name": header,
                    "in": "header",
                    "required": False,
                    "schema": SLO_HEADER_SCHEMA,
                }
            )
        if missing:
            gaps.append(f"POST {path}: SLO headers {', '.join(missing)} not documented")
    return schema, gaps


# ---- results --------------------------------------------------------------------------------


@dataclass
class FailureClass:
    """Responses that failed the same check the same way on the same operation."""

    operation: str
    credentials: str
    check: str
    status: int | None
    count: int = 0
    modes: set[str] = field(default_factory=set)
    message: str = ""
    reproduce: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "operation": self.operation,
            "credentials": self.credentials,
            "check": self.check,
            "status": self.status,
            "count": self.count,
            "modes": sorted(self.modes),
            "message": self.message,
            "reproduce": self.reproduce,
        }


@dataclass
class Report:
    """Everything a run saw: per-operation cases and statuses, failure classes, time."""

    seed: int
    target_cases: int
    cases: int = 0
    """Every case sent: :attr:`hostile_cases` plus :attr:`generated_cases`."""
    hostile_cases: int = 0
    wall_s: float = 0.0
    usage: dict[str, int] = field(default_factory=dict)
    """The usage writer's counts after the run: submitted, written, dropped."""
    schema_gaps: list[str] = field(default_factory=list)
    per_operation: dict[str, Counter[str]] = field(default_factory=dict)
    per_credentials: dict[str, Counter[str]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    """Per operation: the time its responses took, in all (client side)."""
    media_types: dict[str, Counter[str]] = field(default_factory=dict)
    """Per operation: ``"<status> <media type>"`` counts (did streams really stream?)."""
    error_codes: dict[str, Counter[str]] = field(default_factory=dict)
    """Per operation: ``"<status> <error.code>"`` counts of error answers (what refused it)."""
    error_examples: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per operation and ``"<status> <error.code>"``: the first error message."""
    failures: dict[tuple[str, str, str, int | None, str], FailureClass] = field(
        default_factory=dict
    )

    def record_status(
        self,
        operation: str,
        credentials: str,
        status: str,
        elapsed_s: float = 0.0,
        media_type: str = "",
    ) -> None:
        self.cases += 1
        self.seconds[operation] = self.seconds.get(operation, 0.0) + elapsed_s
        self.media_types.setdefault(operation, Counter())[f"{status} {media_type}".strip()] += 1
        self.per_operation.setdefault(operation, Counter())[status] += 1
        self.per_credentials.setdefault(credentials, Counter())[status] += 1

    def record_error(self, operation: str, status: int, code: object, message: str) -> None:
        key = f"{status} {code}"
        self.error_codes.setdefault(operation, Counter())[key] += 1
        self.error_examples.setdefault(operation, {}).setdefault(key, message[:300])

    def record_failure(
        self,
        *,
        operation: str,
        credentials: str,
        mode: str,
        check: str,
        status: int | None,
        message: str,
        reproduce: str,
        kind: str = "",
    ) -> None:
        key = (operation, credentials, check, status, kind)
        entry = self.failures.get(key)
        if entry is None:
            entry = self.failures[key] = FailureClass(operation, credentials, check, status)
            entry.message = message[:1500]
            entry.reproduce = reproduce[:3000]
        entry.count += 1
        entry.modes.add(mode)

    @property
    def statuses(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for counts in self.per_operation.values():
            total.update(counts)
        return total

    @property
    def generated_cases(self) -> int:
        return self.cases - self.hostile_cases

    @property
    def failed(self) -> int:
        return sum(f.count for f in self.failures.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "target_cases": self.target_cases,
            "cases": self.cases,
            "generated_cases": self.generated_cases,
            "hostile_cases": self.hostile_cases,
            "failed_cases": self.failed,
            "wall_s": round(self.wall_s, 2),
            "schemathesis": schemathesis.__version__,
            "statuses": dict(sorted(self.statuses.items())),
            "per_credentials": {
                k: dict(sorted(v.items())) for k, v in self.per_credentials.items()
            },
            "operations": {
                op: {
                    "cases": sum(c.values()),
                    "mean_ms": round(1e3 * self.seconds.get(op, 0.0) / max(1, sum(c.values())), 2),
                    "statuses": dict(sorted(c.items())),
                    "media_types": dict(sorted(self.media_types.get(op, Counter()).items())),
                    "error_codes": dict(sorted(self.error_codes.get(op, Counter()).items())),
                    "error_examples": dict(sorted(self.error_examples.get(op, {}).items())),
                }
                for op, c in sorted(self.per_operation.items())
            },
            "usage": self.usage,
            "failures": [f.as_dict() for f in self._sorted_failures()],
            "schema_gaps": self.schema_gaps,
        }

    def _sorted_failures(self) -> list[FailureClass]:
        return sorted(self.failures.values(), key=lambda f: (f.operation, f.check, -f.count))

    def describe(self, *, examples: bool = True) -> str:
        """A human-readable summary: totals, per-operation table, failure classes."""
        lines = [
            f"{self.cases} cases ({self.generated_cases} generated, target {self.target_cases}, "
            f"seed {self.seed}; {self.hostile_cases} hostile) in {self.wall_s:.1f} s; "
            f"statuses {dict(sorted(self.statuses.items()))}",
            "",
            f"{'operation':<44} {'cases':>6} {'mean ms':>8}  statuses",
        ]
        for op, counts in sorted(self.per_operation.items()):
            n = sum(counts.values())
            histogram = " ".join(f"{s}:{k}" for s, k in sorted(counts.items()))
            lines.append(
                f"{op:<44} {n:>6} {1e3 * self.seconds.get(op, 0.0) / n:>8.1f}  {histogram}"
            )
        if self.usage:
            lines += ["", f"usage records: {self.usage}"]
        if self.schema_gaps:
            lines += ["", "schema gaps (filled in for fuzzing):"]
            lines += [f"  - {gap}" for gap in self.schema_gaps]
        failures = self._sorted_failures()
        lines += ["", f"{len(failures)} failure classes, {self.failed} failing responses"]
        for f in failures:
            lines.append(
                f"  - {f.operation} [{f.credentials}, {'/'.join(sorted(f.modes))}] {f.check} "
                f"status={f.status} x{f.count}"
            )
            if examples:
                lines += [f"      {line}" for line in f.message.splitlines()[:12]]
                lines.append(f"      reproduce: {f.reproduce[:600]}")
        return "\n".join(lines)


# ---- the run --------------------------------------------------------------------------------


def _wrong_headers(target: Target) -> list[dict[str, str]]:
    """The ``wrong`` credentials, cycled through case by case."""
    return [
        {"Authorization": f"Bearer sk-tg-{uuid.UUID(int=0).hex}"},
        {"Authorization": f"Bearer {target.revoked_key}"},
        {"Authorization": f"Bearer {target.suspended_key}"},
        {"Authorization": "Bearer "},
        {"Authorization": f"Basic {target.tenant_key}"},
        {"Authorization": f"Bearer {target.tenant_key}x"},
        {"Authorization": "Bearer " + "k" * 8192},
    ]


def _whole_number(value: object) -> bool:
    """An integer as JSON may carry it (``8`` or ``8.0``; not ``true``)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def shape_body(body: object, index: int, *, stream: bool = False) -> None:
    """Keep a generated `/v1` body quick to serve without making it valid or invalid (see the
    module docstring).

    A whole-number length above :data:`MAX_TOKENS_CAP` is capped (keeping its JSON type) if
    the engine would serve it — up to its context length — and in three bodies of four if it
    would not (the fourth keeps the refusal path: beyond the context, beyond int32); an absent
    one is set in three bodies of four; a string model names the served one in four of five;
    with ``stream``, an absent ``stream`` is set true (the fuzzer asks so for every other body
    without one: each run streams valid bodies, whatever the seed draws). Anything else (a zero,
    a negative, a string, a fraction) is left for the API to refuse.
    """
    if not isinstance(body, dict):
        return
    lengths = [k for k in ("max_tokens", "max_completion_tokens") if k in body]
    for key in lengths:
        value = body[key]
        if not _whole_number(value) or value <= MAX_TOKENS_CAP:
            continue
        if value <= MAX_MODEL_LEN or index % 4 != 1:
            body[key] = type(value)(MAX_TOKENS_CAP)
    if not lengths and index % 4:
        body["max_tokens"] = MAX_TOKENS_CAP
    if isinstance(body.get("model"), str) and index % 5:
        body["model"] = MODEL
    if stream and "stream" not in body:
        body["stream"] = True


WORKFLOW_ID_HEADER = "x-tiergate-workflow-id"
WORKFLOW_DEADLINE_HEADER = "x-tiergate-workflow-deadline-ms"


def shape_headers(headers: MutableMapping[str, Any] | None, index: int) -> None:
    """Complete a half pair of workflow headers (the relation between them, which no schema can
    say, would otherwise refuse every such case, 400): a workflow id without a deadline gets
    one (it starts the workflow, or joins it), a deadline without an id gets a fresh id. The
    generated value stays as it was, so an invalid one is still refused."""
    if not headers:
        return
    names = {name.lower() for name in headers}
    if WORKFLOW_ID_HEADER in names and WORKFLOW_DEADLINE_HEADER not in names:
        headers[WORKFLOW_DEADLINE_HEADER] = "60000"
    elif WORKFLOW_DEADLINE_HEADER in names and WORKFLOW_ID_HEADER not in names:
        headers[WORKFLOW_ID_HEADER] = f"fuzz-{index}"


ADMIN_REFERENCES = {"tier": "tiers", "tenant": "tenants"}
"""Query and body fields naming another admin resource (``tenant`` on a key, ``tier`` on a
tenant, the usage and listing filters), by the resource they name."""


def shape_admin(
    path: str,
    path_parameters: dict[str, Any] | None,
    query: dict[str, Any] | None,
    body: object,
    index: int,
    refs: Mapping[str, str],
) -> None:
    """Aim every other admin case at an existing entity, without making it valid or invalid:
    a generated string path parameter (``ref``, ``prefix``) or reference (``tier``,
    ``tenant``) becomes the :data:`TARGET` one; random names would only ever meet a 404 (or
    create from scratch), never an update, a suspension, a deletion or a conflict."""
    if index % 2:
        return
    resource = path.split("/")[3] if path.count("/") >= 3 else ""
    if path_parameters:
        for name in ("ref", "prefix"):
            if isinstance(path_parameters.get(name), str) and resource in refs:
                path_parameters[name] = refs[resource]
    for fields in (query, body):
        if not isinstance(fields, dict):
            continue
        for name, referenced in ADMIN_REFERENCES.items():
            if isinstance(fields.get(name), str) and referenced in refs:
                fields[name] = refs[referenced]


def has_negative_inputs(definition: Mapping[str, Any]) -> bool:
    """Whether an operation has an input that can be made invalid: a body, or a parameter
    constrained beyond "any string" (a path segment can only be a string)."""
    if "requestBody" in definition:
        return True
    for parameter in definition.get("parameters", []):
        schema = parameter.get("schema", {})
        constraints = {k: v for k, v in schema.items() if k not in ("title", "description")}
        if constraints != {"type": "string"}:
            return True
    return False


def sse_problem(content: bytes) -> str | None:
    """Why a ``text/event-stream`` body is not a well-formed OpenAI stream, or None."""
    for event in content.split(b"\n\n"):
        event = event.strip(b"\r\n")
        if not event or event.startswith(b":"):
            continue
        if not event.startswith(b"data: "):
            return f"event without `data: `: {event[:200]!r}"
        data = event[6:]
        if data == b"[DONE]":
            continue
        try:
            json.loads(data)
        except ValueError:
            return f"event data is not JSON: {data[:200]!r}"
    return None


def slot_seed_of(seed: int, round_: int, label: str, credentials: str, mode: str) -> int:
    """Hypothesis' seed for one slot of one round: stable across processes (no ``hash()``),
    and different per slot, so that the ``wrong`` credentials' negative cases of an operation
    are not its ``valid`` negative cases again."""
    slot = zlib.crc32(f"{label}|{credentials}|{mode}|{round_}".encode())
    return (seed * 1_000_003 + slot) % 2**32


_METHOD_ORDER = {"GET": 0, "POST": 1, "PUT": 2, "PATCH": 3, "DELETE": 4}


def operation_order(operation: Any) -> tuple[int, int, str]:
    """Admin reads, creations, updates, deletions, then `/v1`: the aimed-at entities are
    updated before they are deleted, and `/v1` runs on whatever the admin cases left (tiers
    with odd weights included: they weigh in the gain accounting of every request)."""
    admin = operation.path.startswith("/admin/")
    return (0 if admin else 1, _METHOD_ORDER.get(operation.method.upper(), 9), operation.path)


# ---- hostile inputs -------------------------------------------------------------------------

DEEP = "[" * 5000 + "]" * 5000
"""Nesting far past any parser's recursion limit, in 10 KB (under the body limit)."""
HUGE_INT = "9" * 5000
"""Past Python's 4300-digit limit for int(str): ``json.loads`` raises ``ValueError`` on it."""
STRING_PROBES = ('"\\ud800"', '"a\\u0000b"')
"""A lone surrogate (valid JSON, not encodable as UTF-8) and a NUL (PostgreSQL refuses it)."""
NUMBER_PROBES = ("NaN", "Infinity", "1e400", HUGE_INT)
"""Not JSON at all (Python's parser takes them), an overflow to infinity, a huge integer."""
BODY_PROBES: tuple[bytes, ...] = (
    DEEP.encode(),
    b"\xef\xbb\xbf{}",  # a UTF-8 byte order mark
    b"\xff\xfe{\x00}",  # not UTF-8
    b'{"a": 1, "a": 2}',
    b"null",
)
PARAMETER_PROBES = ("a\x00b", "x" * 5000)
NUMBER_PARAMETER_PROBES = ("NaN", "1e400", HUGE_INT)
_PROBE = "\x01probe\x01"


HOSTILE_TEMPLATES: dict[str, dict[str, Any]] = {
    "POST /v1/chat/completions": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    },
    "POST /v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 2},
    "POST /admin/v1/tiers": {"name": "hostile", "weight": 1.0, "ttft_ms": 1e3, "tpot_ms": 1e2},
    "POST /admin/v1/tenants": {"name": "hostile", "tier": TARGET},
    "POST /admin/v1/keys": {"tenant": TARGET},
    "POST /admin/v1/backends": {
        "name": "hostile",
        "base_url": "http://127.0.0.1:9/",
        "model": MODEL,
        "profile": PROFILE,
    },
}
"""Bodies the API accepts, into which :func:`hostile_bodies` puts one probe at a time, so that
the probe, not another field, is what the API meets (updates: the empty body, one field)."""


def _schema_types(schema: Mapping[str, Any]) -> set[str]:
    """The JSON types a (property) schema admits, through ``anyOf`` / ``oneOf``."""
    types: set[str] = set()
    kind = schema.get("type")
    if isinstance(kind, str):
        types.add(kind)
    elif isinstance(kind, list):
        types.update(k for k in kind if isinstance(k, str))
    for key in ("anyOf", "oneOf", "allOf"):
        for member in schema.get(key, ()):
            if isinstance(member, Mapping):
                types |= _schema_types(member)
    return types


def _resolve(raw: Mapping[str, Any], schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """``schema`` with a local ``$ref`` followed (the components FastAPI writes)."""
    seen = 0
    while isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#/") and seen < 8:
        node: Any = raw
        for part in schema["$ref"][2:].split("/"):
            node = node.get(part, {}) if isinstance(node, Mapping) else {}
        schema, seen = node if isinstance(node, Mapping) else {}, seen + 1
    return schema


def hostile_bodies(
    raw: Mapping[str, Any], definition: Mapping[str, Any], template: Mapping[str, Any]
) -> list[bytes]:
    """Raw JSON bodies no schema-driven generator writes: each probe of :data:`BODY_PROBES`,
    and ``template`` (an accepted body) with one documented field at a time set to a probe
    fitting its type (strings: :data:`STRING_PROBES`; numbers: :data:`NUMBER_PROBES`) or, for the
    first field, to :data:`DEEP`. A ``name`` in the template is made unique per body, so that a
    creation is not refused as a duplicate before its probe is looked at."""
    content = definition.get("requestBody", {}).get("content", {})
    schema = _resolve(raw, content.get("application/json", {}).get("schema", {}))
    properties = schema.get("properties", {}) if isinstance(schema, Mapping) else {}
    bodies = list(BODY_PROBES)
    for position, (name, prop) in enumerate(sorted(properties.items())):
        types = _schema_types(_resolve(raw, prop))
        probes: list[str] = [DEEP] if position == 0 else []
        if "string" in types:
            probes += STRING_PROBES
        if types & {"number", "integer"}:
            probes += NUMBER_PROBES
        for probe in probes:
            body = {**template, name: _PROBE}
            if isinstance(template.get("name"), str) and name != "name":
                body["name"] = f"{template['name']}-{len(bodies)}"
            text = json.dumps(body, ensure_ascii=True)
            bodies.append(text.replace(json.dumps(_PROBE), probe).encode())
    return bodies


def hostile_parameters(
    definition: Mapping[str, Any], refs: Mapping[str, str], path: str
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(path_parameters, query)`` pairs probing one parameter at a time (a NUL and a long
    string for strings; non-finite and huge numbers for numbers); the other path parameters
    name the :data:`TARGET` entity."""
    parameters = [p for p in definition.get("parameters", []) if p.get("in") in ("path", "query")]
    resource = path.split("/")[3] if path.count("/") >= 3 else ""
    base = {
        p["name"]: refs.get(resource, "x")
        for p in parameters
        if p.get("in") == "path" and isinstance(p.get("name"), str)
    }
    out = []
    for parameter in parameters:
        types = _schema_types(parameter.get("schema", {}))
        probes = list(PARAMETER_PROBES if "string" in types or not types else ())
        if types & {"number", "integer"}:
            probes += NUMBER_PARAMETER_PROBES
        for probe in probes:
            path_parameters, query = dict(base), {}
            if parameter.get("in") == "path":
                path_parameters[parameter["name"]] = probe
            else:
                query[parameter["name"]] = probe
            out.append((path_parameters, query))
    return out


class Fuzzer:
    """Runs the plan against a :class:`Target` and fills a :class:`Report`."""

    def __init__(
        self,
        target: Target,
        *,
        only: str | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.target = target
        raw, gaps = fuzzed_schema(target.openapi)
        if only is not None:
            prefix = "/v1/" if only == "v1" else "/admin/v1/"
            raw["paths"] = {p: o for p, o in raw["paths"].items() if p.startswith(prefix)}
        self.schema_gaps = gaps
        self.raw = raw
        config = schemathesis.Config.from_dict(SCHEMATHESIS_CONFIG)
        self.schema = schemathesis.openapi.from_dict(raw, config=config)
        operations, self.invalid_operations = [], []
        for result in self.schema.get_all_operations():
            if isinstance(result, Ok):
                operations.append(result.ok())
            else:  # schemathesis cannot use it: a defect of the schema, reported as a failure
                self.invalid_operations.append(result.err())
        self.operations = sorted(operations, key=operation_order)
        self.session = requests.Session()
        self.wrong = _wrong_headers(target)
        self.placeholders = {
            target.tenant_key: "$TENANT_KEY",
            target.admin_key: "$ADMIN_KEY",
            target.revoked_key: "$REVOKED_KEY",
            target.suspended_key: "$SUSPENDED_TENANT_KEY",
        }
        self.progress = progress
        self._index = 0
        self._unstreamed = 0
        """Generation bodies seen without ``stream``: every other one is streamed."""

    def run(self, cases: int, seed: int, *, hostile: bool = True) -> Report:
        """The hostile inputs (``hostile``: a fixed set, a few per field and parameter, first,
        while the aimed-at entities exist), then ``cases`` generated cases from ``seed``."""
        report = Report(seed=seed, target_cases=cases, schema_gaps=list(self.schema_gaps))
        for error in self.invalid_operations:
            report.record_failure(
                operation=error.label,
                credentials="-",
                mode="-",
                check="invalid_schema",
                status=None,
                message=str(error),
                reproduce="",
            )
        started = time.perf_counter()
        if hostile:
            self._run_hostile(report)
            report.hostile_cases = report.cases
            if self.progress is not None:
                self.progress(f"hostile: {report.cases} cases, {report.failed} failing")
        weights = {op.label: 3.0 if op.path in GENERATION_PATHS else 1.0 for op in self.operations}
        open_slots = self._slots()
        for round_ in range(TOP_UP_ROUNDS):
            remaining = cases - report.generated_cases
            if remaining <= 0 or not open_slots:
                break
            total_weight = sum(weights[op.label] * share for op, _, _, share in open_slots)
            still_open = []
            for op, creds, mode, share in open_slots:
                quota = max(1, round(remaining * weights[op.label] * share / total_weight))
                slot_seed = slot_seed_of(seed, round_, op.label, creds, mode)
                ran = self._run_slot(report, op, creds, mode, quota, slot_seed)
                if ran >= quota:  # not exhausted: may give more in the next round
                    still_open.append((op, creds, mode, share))
            open_slots = still_open
            if self.progress is not None:
                self.progress(
                    f"round {round_}: {report.generated_cases} generated cases, "
                    f"{report.failed} failing, {time.perf_counter() - started:.0f} s"
                )
        self._check_usage(report)
        report.wall_s = time.perf_counter() - started
        return report

    def _check_usage(self, report: Report) -> None:
        """Every request's usage record written: one the database refuses (a NUL on PostgreSQL)
        makes the writer drop its whole batch, other tenants' records with it."""
        writer = self.target.usage
        if writer is None:
            return
        writer.flush(timeout=USAGE_FLUSH_TIMEOUT_S)
        report.usage = {
            "submitted": writer.submitted,
            "written": writer.written,
            "dropped": writer.dropped,
        }
        if writer.dropped:
            report.record_failure(
                operation="(usage writer)",
                credentials="-",
                mode="-",
                check="usage_dropped",
                status=None,
                message=f"{writer.dropped} of {writer.submitted} usage records dropped: the "
                "database refused their batch (the gateway's log names the error)",
                reproduce="",
            )

    def _run_hostile(self, report: Report) -> None:
        """Every operation once per hostile input (:func:`hostile_bodies`,
        :func:`hostile_parameters`), with valid credentials, under the same checks."""
        for op in self.operations:
            definition = self.raw["paths"][op.path][op.method.lower()]
            base = {  # every path parameter (``ref``, ``prefix``, an operator's ``name``…)
                name: self.target.refs.get(op.path.split("/")[3], "x")
                for name in re.findall(r"\{(\w+)\}", op.path)
            }
            variants: list[tuple[dict[str, Any], dict[str, Any], Any]] = []
            template = HOSTILE_TEMPLATES.get(op.label, {})
            if "requestBody" in definition:
                bodies = hostile_bodies(self.raw, definition, template)
                variants += [(base, {}, body) for body in bodies]
            for path_parameters, query in hostile_parameters(definition, self.target.refs, op.path):
                body = json.dumps(template).encode()
                variants.append(
                    (path_parameters, query, body if "requestBody" in definition else NOT_SET)
                )
            for path_parameters, query, body in variants:
                case = self.schema.make_case(
                    operation=op,
                    path_parameters=path_parameters or None,
                    query=query or None,
                    body=body,
                    media_type="application/json" if body is not NOT_SET else None,
                )
                self._execute(report, case, "valid", HOSTILE, shape=False)

    def _slots(self) -> list[tuple[Any, str, GenerationMode, float]]:
        """The plan's (operation, credentials, mode, share), less the negative modes that an
        operation has no input for (hypothesis would search a while to find none): with
        invalid credentials, such an operation gets positive inputs instead."""
        slots = []
        for op in self.operations:
            definition = self.raw["paths"][op.path][op.method.lower()]
            negative = has_negative_inputs(definition)
            for creds, mode, share in PLAN:
                if mode is GenerationMode.NEGATIVE and not negative:
                    if creds == "valid":
                        continue
                    mode = GenerationMode.POSITIVE
                slots.append((op, creds, mode, share))
        return slots

    def _run_slot(
        self,
        report: Report,
        operation: Any,
        credentials: str,
        mode: GenerationMode,
        quota: int,
        seed: int,
    ) -> int:
        """Up to ``quota`` cases of one (operation, credentials, mode); returns how many ran."""
        ran = 0

        def execute(case: schemathesis.Case) -> None:
            nonlocal ran
            ran += 1
            self._execute(report, case, credentials, mode)

        try:
            strategy = operation.as_strategy(generation_mode=mode)
        except Exception as exc:  # e.g. no negative inputs exist for this operation
            self._generation_error(report, operation.label, credentials, mode, exc)
            return 0
        test = hypothesis.given(case=strategy)(execute)
        test = hypothesis.settings(
            max_examples=quota,
            database=None,
            deadline=None,
            derandomize=False,
            phases=(Phase.explicit, Phase.generate),
            suppress_health_check=list(HealthCheck),
            verbosity=hypothesis.Verbosity.quiet,
            print_blob=False,
        )(test)
        test = hypothesis.seed(seed)(test)
        try:
            test()
        except hypothesis.errors.Unsatisfiable:
            pass  # the mode has nothing (more) to generate here
        except Exception as exc:
            self._generation_error(report, operation.label, credentials, mode, exc)
        return ran

    def _generation_error(
        self, report: Report, label: str, credentials: str, mode: GenerationMode, exc: Exception
    ) -> None:
        report.record_failure(
            operation=label,
            credentials=credentials,
            mode=mode.value,
            check="generation_error",
            status=None,
            message=f"{type(exc).__name__}: {exc}",
            reproduce="",
            kind=type(exc).__name__,
        )

    def _headers(self, operation: Any, credentials: str) -> dict[str, str]:
        admin = operation.path.startswith("/admin/")
        own, other = (
            (self.target.admin_key, self.target.tenant_key)
            if admin
            else (self.target.tenant_key, self.target.admin_key)
        )
        if credentials == "valid":
            return {"Authorization": f"Bearer {own}"}
        if credentials == "swapped":
            return {"Authorization": f"Bearer {other}"}
        if credentials == "wrong":
            return dict(self.wrong[self._index % len(self.wrong)])
        return {}

    def _execute(
        self,
        report: Report,
        case: schemathesis.Case,
        credentials: str,
        mode: GenerationMode | str,
        *,
        shape: bool = True,
    ) -> None:
        self._index += 1
        operation = case.operation
        if not shape:
            pass
        elif operation.path in GENERATION_PATHS:
            unstreamed = isinstance(case.body, dict) and "stream" not in case.body
            if unstreamed:
                self._unstreamed += 1
            shape_body(case.body, self._index, stream=unstreamed and self._unstreamed % 2 == 0)
            shape_headers(case.headers, self._index)
        elif operation.path.startswith("/admin/"):
            shape_admin(
                operation.path,
                case.path_parameters,
                case.query,
                case.body,
                self._index,
                self.target.refs,
            )
        if case.headers:
            for name in [n for n in case.headers if n.lower() == "authorization"]:
                del case.headers[name]
        headers = self._headers(operation, credentials)
        reproduce = self._curl(case, headers)
        common = {"operation": operation.label, "credentials": credentials, "mode": str(mode)}
        try:
            response = case.call(
                base_url=self.target.base_url,
                session=self.session,
                headers=headers,
                timeout=REQUEST_TIMEOUT_S,
            )
        except requests.RequestException as exc:
            report.record_status(operation.label, credentials, "no-response")
            report.record_failure(
                **common,
                check="transport",
                status=None,
                message=f"{type(exc).__name__}: {exc}",
                reproduce=reproduce,
                kind=type(exc).__name__,
            )
            self.session = requests.Session()  # the connection may be gone
            return
        status = response.status_code
        content_type = _header(response.headers, "content-type")
        media_type = content_type.split(";")[0].strip()
        report.record_status(
            operation.label, credentials, str(status), response.elapsed, media_type
        )

        body_preview = response.content[:500].decode("utf-8", "replace")
        if status >= 400:
            report.record_error(operation.label, status, *_error_of(response.content))

        def fail(check: str, message: str, kind: str = "") -> None:
            report.record_failure(
                **common,
                check=check,
                status=status,
                message=f"{message}\nresponse: {body_preview}",
                reproduce=reproduce,
                kind=kind,
            )

        try:
            case.validate_response(
                response,
                checks=CHECKS,
                headers=headers,
                transport_kwargs={"base_url": self.target.base_url, "headers": headers},
            )
        except FailureGroup as group:
            for failure in group.exceptions:
                fail(_check_name(failure), f"{failure.title}\n{failure.message}", failure.title)
        except Failure as failure:
            fail(_check_name(failure), f"{failure.title}\n{failure.message}", failure.title)
        if credentials != "valid" and status != 401:
            fail("auth_enforced", f"invalid credentials answered {status}")
        if media_type == "text/event-stream" and not response.stream_cut_short:
            problem = sse_problem(response.content)
            if problem is not None:
                fail("sse_well_formed", problem)

    def _curl(self, case: schemathesis.Case, headers: dict[str, str]) -> str:
        """A curl command reproducing ``case``, the run's keys replaced by placeholders."""
        try:
            command = str(case.as_curl_command(headers=headers, base_url=self.target.base_url))
        except Exception as exc:  # a header value curl cannot carry
            command = f"(no curl command: {type(exc).__name__}) body={case.body!r}"
        for key, name in self.placeholders.items():
            command = command.replace(key, name)
        return command


def _check_name(failure: Failure) -> str:
    checks = getattr(failure, "checks", ())
    return str(checks[0]) if checks else type(failure).__name__


def _error_of(content: bytes) -> tuple[object, str]:
    """``error.code`` and ``error.message`` of an error body, or what the body is instead."""
    try:
        body = json.loads(content)
    except ValueError:
        return "(not JSON)", content[:300].decode("utf-8", "replace")
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body["error"].get("code"), str(body["error"].get("message"))
    return "(no error object)", json.dumps(body)[:300]


def _header(headers: Mapping[str, Any], name: str) -> str:
    for key, value in headers.items():
        if key.lower() == name:
            return str(value[0] if isinstance(value, list) and value else value)
    return ""


def fuzz(
    root: Path,
    *,
    cases: int,
    seed: int,
    only: str | None = None,
    database_url: str | None = None,
    time_scale: float = TIME_SCALE,
    hostile: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Start a gateway under ``root``, fuzz it (:meth:`Fuzzer.run`), stop it."""
    with running_gateway(root, database_url=database_url, time_scale=time_scale) as target:
        return Fuzzer(target, only=only, progress=progress).run(cases, seed, hostile=hostile)


# ---- command line ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--cases", type=int, default=10_000, help="generated cases (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: 150 cases")
    parser.add_argument("--only", choices=("v1", "admin"), help="one plane only")
    parser.add_argument("--no-hostile", action="store_true", help="generated cases only")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--database-url", help="an EMPTY database to seed (default: a temporary SQLite file)"
    )
    parser.add_argument("--time-scale", type=float, default=TIME_SCALE)
    args = parser.parse_args(argv)
    cases = 150 if args.quick else args.cases
    if cases < 1 or not math.isfinite(args.time_scale) or args.time_scale <= 0:
        parser.error("--cases must be >= 1 and --time-scale > 0")

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="tiergate-fuzz-") as tmp:
        report = fuzz(
            Path(tmp),
            cases=cases,
            seed=args.seed,
            only=args.only,
            database_url=args.database_url,
            time_scale=args.time_scale,
            hostile=not args.no_hostile,
            progress=progress,
        )
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(report.describe())
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
