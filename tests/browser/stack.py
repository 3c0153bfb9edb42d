"""A real gateway for the browser tests and the screenshots: database, emulated engines, operator.

What ``make run`` starts, in this process: the database migrated and seeded the way ``tiergate
serve`` does it (:func:`gateway.serve.prepare_database`), emulated engines on free ports, and the
gateway app under uvicorn in a thread (:class:`~gateway.app.server.GatewayThread`) with the
admin key known to the caller, so that a browser can sign in. PostgreSQL when it answers (a
fresh schema, dropped afterwards), else SQLite in a temporary directory; ``require_postgres``
turns a missing PostgreSQL into an error (CI).

Both ``tests/browser/conftest.py`` and ``scripts/screenshots.py`` build it from here, so the
screenshots show exactly what the tests drive.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from engine_emulated import EngineSpec, EngineThread
from gateway.app.app import create_app
from gateway.app.backends import BackendSpec
from gateway.app.server import GatewayThread
from gateway.db import crud
from gateway.db.session import make_engine, make_session_factory
from gateway.serve import prepare_database, prepare_operator
from gateway.settings import Settings

MODEL = "qwen2-7b"
"""What the emulated engines serve (``tiergate serve``'s model name)."""
FLEET = ("a100-qwen2-7b", "910b-qwen2-7b")
"""One NVIDIA and one Ascend profile: the backends page shows both kinds of hardware."""
POSTGRES_URL = os.environ.get(
    "TIERGATE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
ADMIN_KEY = "tg-admin-" + uuid.uuid4().hex
"""The operator credential the browser signs in with (``TIERGATE_ADMIN_KEY``)."""
SECRET = "browser-test-secret-" + uuid.uuid4().hex


@dataclass
class UiStack:
    """A running gateway and what a test needs to drive it."""

    gateway: GatewayThread
    admin_key: str
    """``TIERGATE_ADMIN_KEY`` (sessions signed in with it are operator ``admin-key``)."""
    operator_credential: str
    """The ``tgop-...`` credential ``tiergate serve`` prints on its first start (operator
    ``operator``)."""
    tenant_key: str
    """The seeded demo tenant's API key: a valid key that is *not* an operator credential."""
    database_url: str
    session_factory: sessionmaker[Session]

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:<port>`` (the gateway's ``base_url`` ends in ``/v1``)."""
        return self.gateway.url

    @property
    def openai_base_url(self) -> str:
        return self.gateway.base_url

    def url(self, path: str) -> str:
        return self.origin + path


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def chromium_path() -> str | None:
    """Debian's Chromium (``.ci/browser.sh``); Playwright's own download cannot work here."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def postgres_reachable(url: str = POSTGRES_URL) -> str | None:
    """None when PostgreSQL answers at ``url``, else why not (in words, no password)."""
    engine = create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        return f"PostgreSQL unreachable at {make_url(url).render_as_string()}: {type(exc).__name__}"
    finally:
        engine.dispose()
    return None


@contextmanager
def database(root: Path, *, require_postgres: bool) -> Iterator[str]:
    """A URL of an empty database: a new PostgreSQL schema when it answers, else SQLite."""
    why_not = postgres_reachable()
    if why_not is not None:
        if require_postgres:
            raise RuntimeError(f"{why_not} (CI=true: the browser tests run on PostgreSQL)")
        yield f"sqlite:///{root / 'tiergate.db'}"
        return
    schema = f"ui_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text("SET lock_timeout = '5s'"))
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@contextmanager
def ui_stack(
    root: Path,
    *,
    require_postgres: bool = False,
    seed: Callable[[sessionmaker[Session]], None] | None = None,
) -> Iterator[UiStack]:
    """The gateway with the dashboard, on a migrated and seeded database, until the block ends.

    ``seed`` runs on the database before the gateway starts (demo data for the screenshots).
    """
    with database(root, require_postgres=require_postgres) as url:
        settings = Settings(
            database_url=url,
            secret=SecretStr(SECRET),
            admin_key=SecretStr(ADMIN_KEY),
            data_dir=root,
            redis_url=None,
            metrics_addr=None,
        )
        tenant_key = prepare_database(settings)  # migrations + seed, as `tiergate serve`
        # the first start without TIERGATE_ADMIN_KEY issues the operator's credential
        credential = prepare_operator(settings.model_copy(update={"admin_key": None}))
        if credential is None:
            raise RuntimeError("a new database got no operator credential")
        engine = make_engine(url)
        factory = make_session_factory(engine)
        if tenant_key is None:  # never: the database is new
            with factory.begin() as session:
                tenant_key = crud.create_key(
                    session, actor="test", tenant="demo", secret=SECRET
                ).plaintext
        if seed is not None:
            seed(factory)
        specs = [EngineSpec(profile, "slide", MODEL, seed=i) for i, profile in enumerate(FLEET)]
        try:
            with EngineThread(specs) as engines:
                backends = [
                    BackendSpec(
                        name=f"emulated-{i}-{spec.profile}",
                        base_url=running.url,
                        model=MODEL,
                        profile=str(spec.profile),
                        kind="emulated",
                    )
                    for i, (spec, running) in enumerate(zip(specs, engines, strict=True))
                ]
                with GatewayThread(create_app(settings, backends=backends)) as gateway:
                    wait_for(lambda: gateway.state.pool.ready, "the backends to be ready")
                    yield UiStack(gateway, ADMIN_KEY, credential, tenant_key, url, factory)
        finally:
            with suppress(Exception):
                engine.dispose()


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    """Poll a state another thread owns; the deadline only bounds a failing run."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
