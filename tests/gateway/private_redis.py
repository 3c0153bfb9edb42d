"""A redis-server of a test's own, on a free port: to stop (saving its data), kill, restart or
pause — never the shared one at 127.0.0.1:6379, which other tests use. Shared by the outage
tests of the rate limits and of the spend budgets; skipped where ``redis-server`` is not
installed, except in CI (``CI=true``), where these tests must run."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """A redis-server of this test's: stopped with its data saved (so it comes back with its
    counters, as a Redis restart with persistence does), or paused for writes (slow)."""

    def __init__(self, workdir: Path) -> None:
        self.port = _free_port()
        self.workdir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client = self.client()
        try:
            for _ in range(400):
                try:
                    client.ping()
                    return
                except redis.RedisError:
                    time.sleep(0.025)
        finally:
            client.close()
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        """Save the data and stop: every connection is refused until :meth:`start`."""
        if self.process is None:
            return
        client = self.client()
        try:
            client.shutdown(save=True)
        except redis.ConnectionError:
            pass  # the server closes the connection as it goes
        finally:
            client.close()
        self.process.wait(timeout=30)
        self.process = None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_connect_timeout=1)


def need_redis_server() -> None:
    """Skip without ``redis-server``; in CI, fail (there it must be installed)."""
    if shutil.which("redis-server") is None:
        reason = "redis-server is not on PATH: the outage tests need one of their own"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: these tests must run)")
        pytest.skip(reason)
