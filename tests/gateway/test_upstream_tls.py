"""Engines behind https: the gateway verifies their certificate against
``TIERGATE_UPSTREAM_CA_FILE`` (default: the system store), streams through a trusted one, and
answers an untrusted one with an OpenAI-style 502/503, never a 500.

The certificates are made here with the ``openssl`` command: a test CA, an engine certificate
it signs for ``127.0.0.1``, and a second CA that signs nothing (trusting it must not trust the
engine). The engine is the emulated one, served by uvicorn with its TLS options.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from pydantic import ValidationError

from engine_emulated import EngineSpec
from gateway.app import BackendSpec, create_app
from gateway.app.server import GatewayThread
from gateway.app.upstream import Upstream, UpstreamError
from gateway.settings import Settings
from tests.gateway.seeded_app import app_settings, seed_database

MODEL = "tls-model"
SECRET = "tls-test-secret"

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@dataclass(frozen=True)
class Pki:
    ca: Path
    other_ca: Path
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_ca(directory: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
        "-subj", f"/CN=tiergate test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    _make_ca(root, "ca")
    _make_ca(root, "other-ca")
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "engine.key", "-out", "engine.csr", "-subj", "/CN=127.0.0.1",
        cwd=root,
    )  # fmt: skip
    (root / "engine.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    _openssl(
        "x509", "-req", "-in", "engine.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "engine.pem", "-days", "2", "-extfile", "engine.ext",
        cwd=root,
    )  # fmt: skip
    return Pki(root / "ca.pem", root / "other-ca.pem", root / "engine.pem", root / "engine.key")


@pytest.fixture(scope="module")
def https_engine(pki: Pki) -> Iterator[str]:
    """The emulated engine served over https; its URL."""
    app = EngineSpec("a100-qwen2-7b", "vllm-v1-priority", MODEL, time_scale=4.0).create_app()
    with GatewayThread(app, ssl_certfile=str(pki.cert), ssl_keyfile=str(pki.key)) as engine:
        yield f"https://127.0.0.1:{engine.port}"


@pytest.fixture
def key_and_url(tmp_path: Path) -> Iterator[tuple[str, str]]:
    url = f"sqlite:///{tmp_path / 'tiergate.db'}"
    engine, key = seed_database(url, SECRET)
    engine.dispose()
    yield key, url


def _gateway(engine_url: str, db_url: str, root: Path, **overrides: object) -> GatewayThread:
    settings = app_settings(db_url, root, SECRET, "admin-key", **overrides)
    backend = BackendSpec("tls-engine", engine_url, MODEL, "a100-qwen2-7b")
    return GatewayThread(create_app(settings, backends=[backend]))


def test_a_streamed_chat_completion_reaches_an_https_engine_trusted_by_the_ca_file(
    https_engine: str, key_and_url: tuple[str, str], pki: Pki, tmp_path: Path
) -> None:
    key, db_url = key_and_url
    with _gateway(https_engine, db_url, tmp_path, upstream_ca_file=pki.ca) as gateway:
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hello over TLS."}],
            max_tokens=5,
            stream=True,
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        ready = httpx.get(f"{gateway.url}/health/readiness").json()
    assert text  # tokens came through the TLS connection
    assert ready["healthy_backends"] == ["tls-engine"]  # probes and scrapes over https too


@pytest.mark.parametrize("trust", ["system store", "another CA"])
def test_an_untrusted_engine_certificate_is_a_clean_openai_error_not_a_500(
    trust: str, https_engine: str, key_and_url: tuple[str, str], pki: Pki, tmp_path: Path
) -> None:
    """The gateway's first liveness probe fails its handshake: the engine is out of routing
    before any request reaches it (the request's own handshake: the next test)."""
    key, db_url = key_and_url
    overrides = {"upstream_ca_file": pki.other_ca} if trust == "another CA" else {}
    with _gateway(https_engine, db_url, tmp_path, **overrides) as gateway:
        reply = httpx.post(
            f"{gateway.base_url}/chat/completions",
            headers={"authorization": f"Bearer {key}"},
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "Hello?"}],
                "max_tokens": 3,
                "stream": True,
            },
            timeout=30,
        )
    assert reply.status_code in (502, 503), reply.text
    error = reply.json()["error"]
    assert error["message"] and error["type"] and error["code"]
    assert "traceback" not in reply.text.lower()


def test_a_missing_ca_file_fails_at_configuration(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="upstream_ca_file"):
        Settings(upstream_ca_file=tmp_path / "missing.pem")


def test_the_upstream_client_verifies_the_engine_against_its_ca_file(
    https_engine: str, pki: Pki
) -> None:
    """What a request's attempt sees: a trusted engine streams; an untrusted certificate is an
    :class:`UpstreamError` naming the verification failure (the proxy's 502 and failover),
    not an unhandled ``ssl`` exception."""
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
         "stream": True}
    ).encode()  # fmt: skip

    async def stream(ca_file: Path) -> list[bytes]:
        upstream = Upstream(read_timeout_s=10.0, connect_timeout_s=5.0, ca_file=ca_file)
        try:
            response = await upstream.post_json(f"{https_engine}/v1/chat/completions", body)
            assert response.status == 200
            events = [e async for batch in response.event_batches() for e in batch]
            response.close()
            return events
        finally:
            await upstream.aclose()

    events = asyncio.run(stream(pki.ca))
    assert events[-1].startswith(b"data: [DONE]") and len(events) >= 2
    with pytest.raises(UpstreamError, match="SSLCertVerificationError"):
        asyncio.run(stream(pki.other_ca))
