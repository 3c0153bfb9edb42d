"""``tiergate serve``: the embedded default works with no configuration, twice side by side."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from tiergate_cli import MODEL_NAME


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(workdir: Path, port: int) -> Iterator[tuple[str, str]]:
    """Start ``tiergate serve`` in ``workdir``; yields (base URL, its stdout+stderr so far)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERGATE_")}
    env["TIERGATE_DATA_DIR"] = str(workdir)
    log = workdir / f"serve-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tiergate_cli",
                "serve",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"tiergate serve exited: {log.read_text()}")
            try:
                if httpx.get(f"{base}/health/readiness", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            pytest.fail(f"tiergate serve not ready: {log.read_text()}")
        yield base, log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def demo_key(output: str) -> str:
    keys = [line.strip() for line in output.splitlines() if line.strip().startswith("tg-")]
    assert len(keys) == 1, output
    return keys[0]


@pytest.mark.slow
def test_serve_from_scratch_and_side_by_side(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    with serve(first, free_port()) as (url_a, out_a), serve(second, free_port()) as (url_b, out_b):
        for url, out in ((url_a, out_a), (url_b, out_b)):
            assert "TIERGATE_ADMIN_KEY" in out  # says how to enable the admin API
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=demo_key(out))
            assert [m.id for m in client.models.list()] == [MODEL_NAME]
            stream = client.chat.completions.create(
                model=MODEL_NAME,
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = list(stream)
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
        # the four emulated engines (two 910B, two A100) are on free ports, listed at start
        assert out_a.count("emulated engine") == 4 and out_a.count("910b") == 2
    # a restart keeps the database and does not print a second key
    with serve(first, free_port()) as (_, again):
        assert not [line for line in again.splitlines() if line.strip().startswith("tg-")]
        assert "tiergate keys create --tenant demo" in " ".join(again.split())


def test_try_line_works_when_pasted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The printed ``Try:`` command is one line that a shell runs with ``$KEY`` expanded."""
    import io
    import shlex

    from rich.console import Console

    from gateway import serve as serve_module
    from gateway.settings import Settings

    out = io.StringIO()
    monkeypatch.setattr(serve_module, "console", Console(file=out, width=80))
    settings = Settings(data_dir=tmp_path)
    serve_module.announce(
        settings, base="http://127.0.0.1:8000", demo_key="tg-demo", model=MODEL_NAME
    )
    lines = [line for line in out.getvalue().splitlines() if line.startswith("Try:")]
    assert len(lines) == 1, out.getvalue()
    command = lines[0].removeprefix("Try:").strip()
    argv = shlex.split(command)
    assert argv[0] == "curl" and argv[1] == "http://127.0.0.1:8000/v1/chat/completions"
    body = json.loads(argv[argv.index("-d") + 1])
    assert body["model"] == MODEL_NAME and body["messages"][0]["content"] == "hello"
    # what the shell passes curl: the header with the key, not the literal "$KEY"
    shown = subprocess.run(
        ["bash", "-c", 'KEY=tg-abc; curl() { printf "%s\\n" "$@"; }; ' + command],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert "Authorization: Bearer tg-abc" in shown
    # it says where the key comes from
    assert "KEY=" in out.getvalue()
