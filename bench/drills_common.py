"""What the drill scripts and ``bench/gateway_overhead.py`` share: child servers and their end.

Each of those scripts runs its servers (emulated engines, the gateway) as child processes of
the script itself in a server role, so that the load generator, the servers and the faults it
injects never share an event loop. The helpers here start such a child, wait for it, stop it,
read its CPU time and summarise what it wrote to stderr. A script imports them after putting
its own directory on ``sys.path`` (``bench/`` is no package), and keeps its old private names
as aliases where tests or sibling scripts use them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, TypeVar

T = TypeVar("T")


def free_port() -> int:
    """A port free now on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_on_uvloop(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop when installed (uvicorn's own choice for the servers)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def spawn_ready(
    script: str,
    args: list[str],
    env: dict[str, str],
    log: IO[bytes],
    *,
    marker: str,
    timeout_s: float,
    stop: Callable[[subprocess.Popen[bytes]], None],
) -> tuple[subprocess.Popen[bytes], str]:
    """``script`` in a server role, reading its stdout until it prints ``<marker> <value>``
    (once it accepts connections); returns the child and the value. Closing the child's stdin
    asks it to stop, so it also stops if this process dies; ``stop`` ends one that failed."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(script).resolve()), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
    )
    assert proc.stdout is not None
    prefix = f"{marker} "
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            line = proc.stdout.readline().decode().strip()
            if line.startswith(prefix):
                return proc, line[len(prefix) :]
            if not line and proc.poll() is not None:
                break
        elif proc.poll() is not None:
            break
    stop(proc)
    raise RuntimeError(f"server {args[:2]} did not start (exit code {proc.poll()})")


def stop_child(
    proc: subprocess.Popen[bytes], *, timeout_s: float = 15.0, resume: bool = False
) -> None:
    """Close the child's stdin (its signal to stop), wait, then kill it. ``resume``: send it
    SIGCONT first (a frozen child cannot read its stdin)."""
    if resume:
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signal.SIGCONT)
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def spawn_session(
    script: str, args: list[str], env: dict[str, str], log: Any
) -> subprocess.Popen[bytes]:
    """``script`` in a server role in a session of its own (its stdout and stderr to ``log``),
    so that :func:`terminate` can end its whole process group (a supervisor's workers too)."""
    return subprocess.Popen(
        [sys.executable, str(Path(script).resolve()), *args],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env=env,
        start_new_session=True,
    )


def wait_up(
    url: str,
    proc: subprocess.Popen[bytes],
    *,
    up: Callable[[int], bool],
    timeout_s: float,
) -> None:
    """Poll ``url`` until its status satisfies ``up``; fails if ``proc`` exits first."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"a server exited at start-up (code {proc.returncode})")
        with contextlib.suppress(httpx.HTTPError):
            if up(httpx.get(url, timeout=2).status_code):
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def terminate(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM (a graceful stop: the gateway's usage writer flushes), then SIGKILL to the whole
    process group (a supervisor's workers too)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def report_server_log(path: Path, tail: int) -> None:
    """The servers' stderr, summarised: an overload can make them log thousands of tracebacks."""
    lines = path.read_text(errors="replace").splitlines()
    if not lines:
        return
    tracebacks = sum(line.startswith("Traceback") for line in lines)
    print(
        f"servers wrote {len(lines)} lines to stderr ({tracebacks} tracebacks); the last:",
        *lines[-tail:],
        sep="\n  ",
        file=sys.stderr,
    )


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the gateway's workers), from ``/proc``."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        with contextlib.suppress(OSError, ValueError):
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
    return tree


def process_cpu_seconds(pid: int, *, user: bool = True) -> float:
    """User plus system CPU time of ``pid`` (system time only when not ``user``); NaN where
    ``/proc`` cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return math.nan
    # after the command name: state is field 3, utime and stime fields 14 and 15 (man 5 proc)
    ticks = int(fields[12]) + (int(fields[11]) if user else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and its descendants (a proxy and its workers or children)."""
    return sum(process_cpu_seconds(p) for p in process_tree(pid))


def exception_outcome(exc: BaseException) -> str:
    """A client-side failure as an outcome class: ``timeout``, ``connection`` (refused, reset,
    closed by the server) or ``error``, with the exception's class — so that a request that
    got no HTTP status can be told apart from one the gateway answered."""
    name = type(exc).__name__
    if isinstance(exc, TimeoutError) or "Timeout" in name:
        return f"timeout:{name}"
    if isinstance(exc, OSError) or "Connect" in name or "Disconnect" in name:
        return f"connection:{name}"
    return f"error:{name}"


def error_code(raw: bytes) -> str:
    """The ``code`` of an OpenAI error body or event payload (``{"error": {"code": ...}}``)."""
    try:
        return str(json.loads(raw)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "unparsed"


def has_content(event: bytes) -> bool:
    """Whether an SSE event (or ``data:`` line) carries generated text."""
    if not event.startswith(b"data: {"):
        return False
    try:
        data = json.loads(event[6:])
    except ValueError:
        return False
    return any((c.get("delta") or {}).get("content") for c in data.get("choices") or ())


def serve_engine_or_gateway(args: argparse.Namespace, model: str) -> int:
    """Child process of the database and Redis drills: serve one emulated A100 engine
    (``args.role == "engine"``) or the gateway in front of it (``args.workers`` processes),
    until SIGTERM."""
    import uvicorn

    if args.role == "engine":
        from engine_emulated.serve import EngineSpec

        app = EngineSpec(
            "a100-qwen2-7b", "vllm-v1", model, seed=0, time_scale=args.time_scale
        ).create_app()
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
        return 0
    from gateway.app import BackendSpec

    backend = BackendSpec("drill-engine", args.engine_url, model, "a100-qwen2-7b", kind="emulated")
    if args.workers > 1:
        from gateway import serve as serving
        from gateway.settings import get_settings

        @contextlib.asynccontextmanager
        async def backends() -> Any:
            yield [backend]

        return int(
            asyncio.run(
                serving.run_workers(
                    get_settings(),
                    host="127.0.0.1",
                    port=args.port,
                    log_level="warning",
                    workers=args.workers,
                    backends=backends,
                )
            )
        )
    from gateway.app import create_app

    app = create_app(backends=[backend])
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
        backlog=4096,
    )
    return 0


# ---- one engine and a gateway in front of it (the database and Redis drills) ---------------


@dataclasses.dataclass(frozen=True)
class EngineAndGateway:
    """The two child servers of a drill and where to reach the gateway."""

    engine: subprocess.Popen[bytes]
    gateway: subprocess.Popen[bytes]
    gateway_url: str
    metrics_url: str


@contextlib.contextmanager
def engine_and_gateway(
    script: str,
    workdir: Path,
    env: Mapping[str, str],
    *,
    workers: int,
    time_scale: float,
    gateway_up: tuple[str, Callable[[int], bool]],
    startup_timeout_s: float,
    gateway_stop_s: float,
) -> Iterator[EngineAndGateway]:
    """``script`` as an emulated engine (``--role engine``) and as the gateway in front of it
    (``--role gateway``, ``workers`` processes), both logging to ``workdir/servers.log``; the
    gateway is up when its ``gateway_up`` path answers a status the predicate accepts. ``env``
    is the children's whole environment; the gateway's metrics address is added to it."""
    engine_port, gateway_port, metrics_port = free_port(), free_port(), free_port()
    child_env = {**env, "TIERGATE_METRICS_ADDR": f"127.0.0.1:{metrics_port}"}
    path, up = gateway_up
    log = (workdir / "servers.log").open("ab")
    engine = spawn_session(
        script,
        ["--role", "engine", "--port", str(engine_port), "--time-scale", str(time_scale)],
        child_env,
        log,
    )
    gateway: subprocess.Popen[bytes] | None = None
    try:
        wait_up(
            f"http://127.0.0.1:{engine_port}/health",
            engine,
            up=lambda status: status == 200,
            timeout_s=startup_timeout_s,
        )
        engine_url = f"http://127.0.0.1:{engine_port}"
        role = ["--role", "gateway", "--port", str(gateway_port), "--engine-url", engine_url]
        gateway = spawn_session(script, [*role, "--workers", str(workers)], child_env, log)
        wait_up(
            f"http://127.0.0.1:{gateway_port}{path}", gateway, up=up, timeout_s=startup_timeout_s
        )
        yield EngineAndGateway(
            engine,
            gateway,
            f"http://127.0.0.1:{gateway_port}",
            f"http://127.0.0.1:{metrics_port}/metrics",
        )
    finally:
        if gateway is not None:
            terminate(gateway, gateway_stop_s)
        terminate(engine, 10.0)
        log.close()


# ---- a child server that lives until its parent closes its stdin -------------------------------


async def until_stdin_closes() -> None:
    """Return once the parent closes this process's stdin (it ended or was killed)."""
    loop = asyncio.get_running_loop()
    closed = asyncio.Event()

    def on_stdin() -> None:
        if not os.read(sys.stdin.fileno(), 4096):
            loop.remove_reader(sys.stdin.fileno())
            closed.set()

    loop.add_reader(sys.stdin.fileno(), on_stdin)
    await closed.wait()


async def serve_gateway_until_stdin_closes(engine_urls: str, model: str, profile: str) -> None:
    """The gateway in front of the comma-separated emulated ``engine_urls`` (all on
    ``profile``), on a free port it prints as ``READY <port>``, until stdin closes."""
    import uvicorn

    from gateway.app import BackendSpec, create_app

    backends = [
        BackendSpec(f"engine-{i}", url, model, profile, kind="emulated")
        for i, url in enumerate(engine_urls.split(","))
    ]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(backends=backends),
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=2,
            backlog=4096,
        )
    )
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    print(f"READY {sock.getsockname()[1]}", flush=True)
    stop = asyncio.ensure_future(until_stdin_closes())
    await asyncio.wait((task, stop), return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    await task


def outage_phase(sent: float, down_at: float | None, up_at: float | None) -> str:
    """Where a request sent at ``sent`` falls in an outage drill: before, during or after."""
    if down_at is None or sent < down_at:
        return "before"
    if up_at is None or sent < up_at:
        return "during"
    return "after"
