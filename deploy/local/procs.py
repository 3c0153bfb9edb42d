"""The stack's processes: started detached with a log file each, recorded, checked and stopped.

A process is recorded with its pid and its command line; ``stop`` signals a pid only while
``/proc/<pid>/cmdline`` still shows that command, so a pid the kernel has since given to another
program is never signalled.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Proc:
    """One supervised process."""

    name: str
    cmd: list[str]
    pid: int
    log: str
    health_url: str | None = None
    """GET here answers 200 while the process serves (None: alive is enough)."""
    ports: dict[str, int] = field(default_factory=dict)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the caller binds it soon after; a small race only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether anything accepts a TCP connection on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether GET ``url`` answers 200 (no proxy: everything here is on 127.0.0.1)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            return int(response.status) == 200
    except (OSError, urllib.error.URLError):
        return False


def spawn(
    name: str,
    cmd: Sequence[str],
    *,
    logs: Path,
    env: Mapping[str, str] | None = None,
    health_url: str | None = None,
    ports: Mapping[str, int] | None = None,
) -> Proc:
    """Start ``cmd`` in a session of its own (it outlives this script), output to its log."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    with open(log, "ab") as out:
        child = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    _children[child.pid] = child
    return Proc(name, list(cmd), child.pid, str(log), health_url, dict(ports or {}))


_children: dict[int, subprocess.Popen[bytes]] = {}
"""What this process started, to say how one that failed to start exited."""


def exit_status(proc: Proc) -> int | None:
    """The exit status of a process started by this one that has exited (else None)."""
    child = _children.get(proc.pid)
    return None if child is None else child.poll()


def alive(proc: Proc) -> bool:
    """Whether ``proc``'s pid still runs the command recorded for it (and is no zombie)."""
    try:
        raw = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
    except OSError:
        return False
    if stat.rpartition(")")[2].split()[0] == "Z":
        return False
    return raw.rstrip(b"\0").split(b"\0") == [part.encode() for part in proc.cmd]


def exited(proc: Proc) -> bool:
    """Whether ``proc``'s pid is gone or a zombie. Unlike ``not alive``, a pid between fork and
    exec (its command line still the spawning Python's) has not exited: it is starting."""
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def healthy(proc: Proc) -> bool:
    return alive(proc) and (proc.health_url is None or http_ok(proc.health_url))


def wait_healthy(procs: Sequence[Proc], timeout_s: float) -> list[Proc]:
    """Wait until every process answers its health URL; returns those that did not in time
    (a process that exited is given up on at once)."""
    deadline = time.monotonic() + timeout_s
    pending = list(procs)
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if not healthy(p)]
        if any(exited(p) for p in pending):
            break
        if pending:
            time.sleep(0.25)
    return [p for p in pending if not healthy(p)]


def terminate(procs: Sequence[Proc], timeout_s: float) -> None:
    """SIGTERM each in the order given and wait for it (a gateway drains, then exits);
    SIGKILL the process group of one that outlives ``timeout_s``."""
    for proc in procs:
        if not alive(proc):
            continue
        _signal(proc.pid, signal.SIGTERM, group=False)  # it stops its own children
        deadline = time.monotonic() + timeout_s
        while alive(proc) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(proc):
            _signal(proc.pid, signal.SIGKILL, group=True)


def _signal(pid: int, sig: signal.Signals, *, group: bool) -> None:
    """``group``: the whole process group :func:`spawn` gave it, workers included."""
    try:
        if group and os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def tail(path: str, lines: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def save(path: Path, procs: Sequence[Proc], info: Mapping[str, object]) -> None:
    """The stack's state: what runs (for status and stop) and where it listens."""
    document = {"info": dict(info), "procs": [asdict(p) for p in procs]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    tmp.replace(path)


def load(path: Path) -> tuple[list[Proc], dict[str, object]]:
    if not path.is_file():
        return [], {}
    document = json.loads(path.read_text())
    return [Proc(**p) for p in document.get("procs", [])], dict(document.get("info", {}))
