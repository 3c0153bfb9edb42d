"""Who reads the gateway's metrics: operators, never the API port's clients.

``/metrics`` is served only on the operator listener (``TIERGATE_METRICS_ADDR``; ``tiergate
serve`` defaults it to 127.0.0.1:9464), and tenant names appear in it only where the operator
turns tenant labels on.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr, ValidationError

from gateway.app import create_app
from gateway.app.metrics import OTHER_TENANT, GatewayMetrics
from gateway.app.server import GatewayThread
from gateway.serve import metrics_address
from gateway.settings import Settings

SAMPLE = 'tiergate_requests_total{status="200",tier="standard"} 1.0'


def _settings(tmp_path: Path, **options: Any) -> Settings:
    return Settings(
        database_url=f"sqlite:///{tmp_path / 'tiergate.db'}",
        secret=SecretStr("metrics-access-secret"),
        data_dir=tmp_path,
        redis_url=None,
        **options,
    )


@contextmanager
def _gateway(tmp_path: Path, **options: Any) -> Iterator[GatewayThread]:
    """A gateway with no backends: enough for who-can-read-what, nothing to wait for."""
    with GatewayThread(create_app(_settings(tmp_path, **options), backends=[])) as gateway:
        yield gateway


def _metrics_url(gateway: GatewayThread) -> str:
    url: str = gateway.app.state.metrics_listener.metrics_url
    return url


# ---- the API port serves no metrics ------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer tg-not-a-key"}])
def test_the_api_port_serves_no_metrics(tmp_path: Path, headers: dict[str, str]) -> None:
    with _gateway(tmp_path, metrics_addr="127.0.0.1:0") as gateway:
        gateway.state.metrics.requests.labels("acme", "standard", "200").inc()
        response = httpx.get(f"{gateway.url}/metrics", headers=headers)
    assert response.status_code == 404
    error = response.json()["error"]  # the gateway's one error dialect, OpenAI's
    assert error["code"] == "not_found" and error["type"] == "invalid_request_error"
    assert "TIERGATE_METRICS_ADDR" in error["message"]  # says where they went
    assert "tiergate_" not in response.text and "acme" not in response.text


def test_the_api_port_serves_no_metrics_without_a_listener(tmp_path: Path) -> None:
    with _gateway(tmp_path) as gateway:
        assert gateway.app.state.metrics_listener is None
        assert httpx.get(f"{gateway.url}/metrics").status_code == 404
        paths = httpx.get(f"{gateway.url}/openapi.json").json()["paths"]
    assert "/metrics" not in paths


# ---- the operator listener serves them ---------------------------------------------------------


def test_the_operator_listener_serves_metrics_and_nothing_else(tmp_path: Path) -> None:
    with _gateway(tmp_path, metrics_addr="127.0.0.1:0") as gateway:
        listener = gateway.app.state.metrics_listener
        assert listener.host == "127.0.0.1" and listener.port not in (0, gateway.port)
        gateway.state.metrics.requests.labels("acme", "standard", "200").inc()
        scraped = httpx.get(_metrics_url(gateway))
        elsewhere = httpx.get(f"{listener.url}/v1/models")
    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("text/plain")
    assert SAMPLE in scraped.text and "tiergate_queue_depth 0.0" in scraped.text
    assert elsewhere.status_code == 404 and elsewhere.json()["error"]["message"] == "Not Found"


def test_the_listener_stops_with_the_gateway(tmp_path: Path) -> None:
    with _gateway(tmp_path, metrics_addr="127.0.0.1:0") as gateway:
        url = _metrics_url(gateway)
    with pytest.raises(httpx.ConnectError):
        httpx.get(url, timeout=2)


def test_a_taken_metrics_address_fails_the_start(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        app = create_app(_settings(tmp_path, metrics_addr=f"127.0.0.1:{port}"), backends=[])
        gateway = GatewayThread(app)
        try:
            with pytest.raises(RuntimeError, match="failed to start"):
                gateway.start()
        finally:
            gateway.stop()
    assert f"cannot serve metrics on 127.0.0.1:{port}" in capfd.readouterr().err  # uvicorn's log


# ---- tenant labels: off by default, bounded when on ---------------------------------------------


def test_tenant_names_are_not_in_the_exposition_by_default(tmp_path: Path) -> None:
    with _gateway(tmp_path, metrics_addr="127.0.0.1:0") as gateway:
        metrics = gateway.state.metrics
        metrics.requests.labels(metrics.tenant_label("acme-corp"), "standard", "200").inc()
        text = httpx.get(_metrics_url(gateway)).text
    assert SAMPLE in text
    assert "acme-corp" not in text and "tenant=" not in text


def test_tenant_labels_when_the_operator_turns_them_on(tmp_path: Path) -> None:
    with _gateway(
        tmp_path, metrics_addr="127.0.0.1:0", metrics_tenant_labels=True, metrics_max_tenants=1
    ) as gateway:
        metrics = gateway.state.metrics
        for tenant in ("acme-corp", "globex"):
            metrics.requests.labels(metrics.tenant_label(tenant), "standard", "200").inc()
        text = httpx.get(_metrics_url(gateway)).text
    assert 'tiergate_requests_total{status="200",tenant="acme-corp",tier="standard"} 1.0' in text
    assert f'tenant="{OTHER_TENANT}"' in text and "globex" not in text  # bounded as before


def test_tenant_labels_setting_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIERGATE_METRICS_TENANT_LABELS", raising=False)
    assert Settings().metrics_tenant_labels is False
    monkeypatch.setenv("TIERGATE_METRICS_TENANT_LABELS", "true")
    assert Settings().metrics_tenant_labels is True


def test_request_counter_keeps_one_call_for_both_shapes() -> None:
    off, on = GatewayMetrics(), GatewayMetrics(tenant_labels=True, max_tenants=5)
    for metrics in (off, on):
        metrics.requests.labels(tenant=metrics.tenant_label("t"), tier="batch", status="429").inc()
    assert b'tiergate_requests_total{status="429",tier="batch"} 1.0' in off.render()
    assert b'tiergate_requests_total{status="429",tenant="t",tier="batch"} 1.0' in on.render()


# ---- the address: TIERGATE_METRICS_ADDR and tiergate serve's default ----------------------------


@pytest.mark.parametrize(
    ("given", "stored"),
    [("127.0.0.1:9464", "127.0.0.1:9464"), (" 0.0.0.0:1 ", "0.0.0.0:1"), ("[::1]:0", "[::1]:0")],
)
def test_metrics_addr_is_host_and_port(
    monkeypatch: pytest.MonkeyPatch, given: str, stored: str
) -> None:
    monkeypatch.setenv("TIERGATE_METRICS_ADDR", given)
    assert Settings().metrics_addr == stored


@pytest.mark.parametrize("bad", ["9464", ":9464", "localhost:", "host:99999", "::1:9464", "h:p"])
def test_a_malformed_metrics_addr_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setenv("TIERGATE_METRICS_ADDR", bad)
    with pytest.raises(ValidationError, match="metrics_addr"):
        Settings()


def test_serve_defaults_to_a_local_port_and_moves_aside_when_it_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    monkeypatch.setattr("gateway.serve.DEFAULT_METRICS_PORT", free)
    assert metrics_address(None) == f"127.0.0.1:{free}"
    with socket.socket() as taken:  # a first gateway holds the default port
        taken.bind(("127.0.0.1", free))
        taken.listen()
        host, _, port = metrics_address(None).rpartition(":")
        assert host == "127.0.0.1" and int(port) not in (0, free)
        # an address the operator chose is kept even when taken: the start fails and says so
        assert metrics_address(f"127.0.0.1:{free}") == f"127.0.0.1:{free}"
    assert metrics_address("0.0.0.0:9464") == "0.0.0.0:9464"
    assert not metrics_address("127.0.0.1:0").endswith(":0")  # resolved, so it can be printed


# ---- tiergate serve (what make run starts) ----------------------------------------------------


@contextmanager
def _tiergate_serve(workdir: Path) -> Iterator[str]:
    """``tiergate serve`` on free ports; yields its output once the API is ready."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERGATE_")}
    env |= {"TIERGATE_DATA_DIR": str(workdir), "TIERGATE_METRICS_ADDR": "127.0.0.1:0"}
    log = workdir / "serve.log"
    command = [sys.executable, "-m", "tiergate_cli", "serve", "--port", str(port)]
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*command, "--log-level", "warning"],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"tiergate serve did not start: {log.read_text()}")
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/health/readiness", timeout=1)
                if ready.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.slow
def test_tiergate_serve_prints_where_metrics_are_and_serves_them_only_there(
    tmp_path: Path,
) -> None:
    with _tiergate_serve(tmp_path) as output:
        api = re.search(r"gateway on (http://\S+)", output)
        printed = re.search(r"(http://127\.0\.0\.1:\d+/metrics)", output)
        assert api is not None and printed is not None, output
        scraped = httpx.get(printed.group(1))
        public = httpx.get(f"{api.group(1)}/metrics")
    assert scraped.status_code == 200 and "tiergate_backend_healthy" in scraped.text
    assert public.status_code == 404 and "tiergate_" not in public.text
