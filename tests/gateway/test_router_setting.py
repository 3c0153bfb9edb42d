"""``TIERGATE_ROUTER``: every router the core registers serves behind the gateway; a typo stops
the gateway at start-up instead of failing every request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr, ValidationError

from engine_emulated import EngineSpec, EngineThread, RunningEngine
from gateway.app import BackendSpec, create_app
from gateway.app.server import GatewayThread
from gateway.db import crud
from gateway.db.models import Base
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import Settings
from priority.routing import ROUTER_NAMES

MODEL = "qwen2-7b"


@pytest.fixture(scope="module")
def engines() -> Iterator[list[RunningEngine]]:
    specs = [EngineSpec(p, "slide", MODEL) for p in ("a100-qwen2-7b", "910b-qwen2-7b")]
    with EngineThread(specs) as running:
        yield running


def test_an_unknown_router_is_refused_at_start_up() -> None:
    with pytest.raises(ValidationError, match="unknown router 'goroutes'"):
        Settings(router="goroutes")


@pytest.mark.parametrize("router", ROUTER_NAMES)
def test_every_registered_router_serves(
    router: str, engines: list[RunningEngine], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'tiergate.db'}"
    db = make_engine(url)
    Base.metadata.create_all(db)
    with make_session_factory(db).begin() as session:
        seed_defaults(session)
        crud.create_tenant(session, actor="test", name="acme", tier="standard")
        key = crud.create_key(session, actor="test", tenant="acme", secret="s").plaintext
    settings = Settings(
        database_url=url, secret=SecretStr("s"), data_dir=tmp_path, redis_url=None, router=router
    )
    backends = [BackendSpec(f"e{i}", e.url, MODEL, e.spec.profile) for i, e in enumerate(engines)]
    with GatewayThread(create_app(settings, backends=backends)) as gateway:
        for _ in range(4):
            response = httpx.post(
                f"{gateway.base_url}/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 4,
                },
                headers={"authorization": f"Bearer {key}"},
                timeout=30,
            )
            assert response.status_code == 200, response.text
    db.dispose()
