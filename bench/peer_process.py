"""A peer proxy (LiteLLM, vLLM's router) as a child process of a side-by-side bench.

The benches that put tiergate beside a peer start the peer the same way: on a free port, in a
session of its own (so its workers go with it), logging to a file shown when it ends; ready
once a chat completion goes through it (liveness alone comes before its routes are set);
optionally pinned with its whole process tree; its CPU read over the whole tree; stopped with
SIGTERM to the group (SIGKILL after 15 s). Only the command line and the request that proves
it serves differ.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.append(str(Path(__file__).resolve().parent))  # bench/ is no package
import drills_common as common  # process trees, CPU time, server logs

STOP_TIMEOUT_S = 15.0


@dataclass
class PeerProcess:
    url: str
    process: subprocess.Popen[bytes]

    def cpu_seconds(self) -> float:
        """CPU time of the peer and all its workers and threads (the whole process tree)."""
        return common.tree_cpu_seconds(self.process.pid)


@dataclass(frozen=True)
class ReadyCheck:
    """The chat completion that proves the peer serves, and how long it may take to."""

    name: str
    model: str
    timeout_s: float
    headers: Mapping[str, str] | None = None
    poll_s: float = 0.3


@contextlib.contextmanager
def running_peer(
    command: list[str],
    *,
    port: int,
    ready: ReadyCheck,
    log_path: Path,
    cpus: set[int] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[PeerProcess]:
    """The peer until the block ends; its log's tail is reported when it stops."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_serving(url, proc, ready)
            if cpus:
                for pid in common.process_tree(proc.pid):
                    os.sched_setaffinity(pid, cpus)
            yield PeerProcess(url, proc)
        finally:
            stop_group(proc)
            log.close()
            common.report_server_log(log_path, 6)


def wait_serving(url: str, proc: subprocess.Popen[bytes], ready: ReadyCheck) -> None:
    """Until a 2-token chat completion goes through the peer."""
    deadline = time.monotonic() + ready.timeout_s
    body: dict[str, Any] = {
        "model": ready.model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    }
    headers = dict(ready.headers or {})
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{ready.name} exited with code {proc.returncode} while starting")
        with contextlib.suppress(httpx.HTTPError):
            answer = httpx.post(
                f"{url}/v1/chat/completions", json=body, headers=headers, timeout=10
            )
            if answer.status_code == 200:
                return
        time.sleep(ready.poll_s)
    raise RuntimeError(f"{ready.name} did not serve a request within the start-up timeout")


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the peer's process group; SIGKILL if it has not gone in 15 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
