"""A gateway serving the backends table routes to a backend whose profile is a stored one.

The stored document is the only place the custom profile exists (no file on disk, a name no
release ships), so the gateway can only have its numbers by reading them from the database.
"""

from __future__ import annotations

from pathlib import Path

import openai
from pydantic import SecretStr
from sqlalchemy import select

from engine_emulated import EngineSpec, EngineThread
from gateway.app import create_app
from gateway.app.server import GatewayThread
from gateway.db import crud
from gateway.db.models import Base, UsageRecord
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import Settings
from priority.profiles import Profile, available_profiles, load_profile

MODEL = "qwen2-7b"
SECRET = "profiles-test-secret"
SEQS = 5  # unlike any shipped profile's max_num_seqs: shows which document the pool loaded


def _calibrated() -> Profile:
    document = load_profile("a100-qwen2-7b").to_dict()
    document["engine"] = {**document["engine"], "max_num_seqs": SEQS}
    return Profile.from_dict({**document, "name": "site-a100", "hardware": "site A100"})


def test_gateway_routes_to_a_backend_on_a_stored_profile(tmp_path: Path) -> None:
    profile = _calibrated()
    assert profile.name not in available_profiles()
    url = f"sqlite:///{tmp_path / 'tiergate.db'}"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    settings = Settings(
        database_url=url, secret=SecretStr(SECRET), data_dir=tmp_path, redis_url=None
    )
    with EngineThread([EngineSpec(profile, "vllm-v1-priority", MODEL)]) as engines:
        with factory.begin() as s:
            seed_defaults(s)
            crud.create_tenant(s, actor="test", name="acme", tier="standard")
            key = crud.create_key(s, actor="test", tenant="acme", secret=SECRET).plaintext
            crud.import_profile(s, profile.to_dict(), actor="test")
            crud.create_backend(
                s,
                actor="test",
                name="site-0",
                base_url=engines[0].url,
                model=MODEL,
                profile="site-a100",
                kind="emulated",
            )
        with GatewayThread(create_app(settings)) as gateway:
            (backend,) = gateway.state.pool.backends
            assert backend.profile == profile and backend.spec.profile == profile
            assert gateway.state.pool.capacity == SEQS
            client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
            reply = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
            assert reply.usage is not None and reply.usage.completion_tokens == 3
    with factory() as s:  # the gateway's shutdown flushed the usage writer
        (record,) = s.scalars(select(UsageRecord)).all()
        assert (record.backend, record.status) == ("site-0", "ok")
    engine.dispose()
