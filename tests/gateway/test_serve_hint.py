"""What `tiergate serve --no-emulated` tells a new operator to try: the model it really serves."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from pydantic import SecretStr
from rich.console import Console

import gateway.serve
from gateway.db import crud
from gateway.db.models import Base
from gateway.db.session import make_engine, make_session_factory
from gateway.serve import announce, served_model
from gateway.settings import Settings


def _settings(tmp_path: Path) -> Settings:
    url = f"sqlite:///{tmp_path / 'tiergate.db'}"
    Base.metadata.create_all(make_engine(url))
    return Settings(database_url=url, secret=SecretStr("s"), data_dir=tmp_path, redis_url=None)


def test_the_example_names_the_backends_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(gateway.serve, "console", Console(file=screen, width=300))

    def printed() -> str:
        text = screen.getvalue()
        screen.seek(0)
        screen.truncate()
        return text

    settings = _settings(tmp_path)
    assert served_model(settings) is None
    announce(settings, base="http://127.0.0.1:8000", demo_key=None, model=None)
    out = printed()
    assert "tiergate backends add" in out and "Try:" not in out and "qwen2-7b" not in out
    factory = make_session_factory(make_engine(settings.database_url))
    with factory.begin() as session:
        crud.create_backend(
            session,
            actor="test",
            name="gpu-0",
            base_url="http://10.0.0.5:8000",
            model="Qwen/Qwen2-7B-Instruct",
            profile="a100-qwen2-7b",
        )
    model = served_model(settings)
    assert model == "Qwen/Qwen2-7B-Instruct"
    announce(settings, base="http://127.0.0.1:8000", demo_key=None, model=model)
    out = printed()
    assert "Try:" in out and "Qwen/Qwen2-7B-Instruct" in out and 'qwen2-7b"' not in out
