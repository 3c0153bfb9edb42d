"""Database outage drill: PostgreSQL goes away for ~10 s under open-loop load.

    python bench/drill_database.py [--requests 10000] [--rps 250] [--outage-s 10]
        [--outage stop|proxy] [--workers N] [--buffer-records 1000] [--json]

An emulated engine and the gateway run in child processes of their own (the gateway with
``--workers N`` processes behind one port, :func:`gateway.serve.run_workers`, when N > 1), on a
PostgreSQL database migrated to head and seeded with an unlimited tier, ``--tenants`` tenants
with a key each ("warm" keys: every request of the load uses one), a pool of "cold" keys (each
used once, by a probe) and nothing else. This process sends ``--requests`` streamed chat
completions as an open-loop Poisson stream at ``--rps``, and two probes a second beside it: a
cold key (never used before: the cache cannot know it) and a key that does not exist.

After ``--outage-at`` of the run, PostgreSQL is made unavailable for ``--outage-s``:

* ``--outage stop`` (default where it can be done): a private PostgreSQL cluster of this run
  (``initdb`` into a temporary directory, run as the ``postgres`` user when this process is
  root) is stopped with ``pg_ctl stop -m fast`` (connections ended with ``admin_shutdown``,
  then refused) and started again — a real restart that leaves the machine's shared server
  alone;
* ``--outage proxy``: the gateway reaches the shared server through a TCP proxy of this
  process (:class:`TcpProxy`), which is cut (every connection closed, new ones refused) and
  restored. Deterministic, and what the test form uses.

Reported (``--json``: one object): requests sent; answers by status and, for errors, by code;
whether every error was JSON in the gateway's dialect (``plain_500s``, ``non_json_errors``
must be 0) and every 503 had ``retry-after``; answers by phase (before, during, after the
outage) and by probe; readiness as seen during the outage; the usage table after the gateway
stopped (rows, ``ok`` rows, distinct request ids) against what the client saw: ``lost`` (rows
missing for requests that passed authentication) and ``duplicated`` (rows minus distinct ids)
must be 0, ``ok`` rows must equal the 2xx answers; the writer's own counts (written, spilled,
replayed, dropped, from the operator listener's metrics); ``usage_flush_s``, the time from the
database's return until the records held meanwhile were all written (the spool empty and the
memory backlog back under one batch).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.append(str(Path(__file__).resolve().parent))  # bench/ is no package
import drills_common as common  # the drills' shared child-process helpers

_free_port = common.free_port


MODEL = "drill-model"
SECRET = "database-drill-secret"
TIER = "drill"
PROMPT = "Say hello to the drill."
DEFAULT_SERVER_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
STARTUP_TIMEOUT_S = 60.0
AUTH_REFUSALS = frozenset({"invalid_api_key", "database_unavailable", "database_busy"})
"""Error codes answered before a request resolved to a tenant: no usage record is due."""
PG_BIN = Path("/usr/lib/postgresql")
PROBE_INTERVAL_S = 0.5


# ---- a TCP proxy that can be cut ---------------------------------------------------------


class TcpProxy:
    """A TCP relay on 127.0.0.1 in a thread of its own: ``cut()`` closes every connection and
    stops listening (new connections are refused), ``restore()`` listens again on the same
    port. Stands in for a database server that goes away and comes back."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def start(self) -> TcpProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def cut(self) -> None:
        self._call(self._cut())

    def restore(self) -> None:
        self._call(self._listen())

    def close(self) -> None:
        self._call(self._cut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    async def _listen(self) -> None:
        if self._server is not None:
            return
        self._server = await asyncio.start_server(
            self._relay, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()  # RST: the database "went away" mid-conversation
        self._writers.clear()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        pair = {writer, up_writer}
        self._writers |= pair

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort() if dst.transport.is_closing() else dst.close()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self._writers -= pair


# ---- the database and how it goes away ---------------------------------------------------


@dataclass
class Outage:
    """A database URL for the gateway, and how to take its server away and bring it back."""

    url: str
    mode: str
    stop: Callable[[], None]
    start: Callable[[], None]


def _create_database(server_url: str) -> str:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"tiergate_drill_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def _drop_database(server_url: str, url: str) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = make_url(url).database
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@contextlib.contextmanager
def proxied_database(server_url: str) -> Iterator[Outage]:
    """A fresh database on the shared server, reached through a :class:`TcpProxy`."""
    from sqlalchemy.engine import make_url

    url = _create_database(server_url)
    target = make_url(url)
    try:
        with TcpProxy(target.host or "127.0.0.1", target.port or 5432) as proxy:
            through = target.set(host="127.0.0.1", port=proxy.port)
            yield Outage(
                through.render_as_string(hide_password=False), "proxy", proxy.cut, proxy.restore
            )
    finally:
        _drop_database(server_url, url)


def _pg_bin() -> Path | None:
    versions = sorted(PG_BIN.glob("*/bin/pg_ctl"), key=lambda p: p.parts[-3])
    return versions[-1].parent if versions else None


def can_stop_a_cluster() -> bool:
    """Whether a private cluster can be made here: PostgreSQL's binaries, and either this user
    may run them (not root) or ``runuser`` can run them as ``postgres``."""
    if _pg_bin() is None:
        return False
    return os.geteuid() != 0 or shutil.which("runuser") is not None


@contextlib.contextmanager
def private_cluster() -> Iterator[Outage]:
    """A PostgreSQL cluster of this run's own (``initdb``, ``pg_ctl``), stopped and started
    for real; removed at the end."""
    bin_dir = _pg_bin()
    assert bin_dir is not None
    root = Path(tempfile.mkdtemp(prefix="tiergate-drill-pg-"))
    data, port = root / "data", _free_port()
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:
        shutil.chown(root, "postgres")
    log_file = root / "postgres.log"

    def pg(*args: str) -> None:
        subprocess.run(
            [*as_postgres, str(bin_dir / args[0]), *args[1:]],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"

    def start() -> None:
        pg("pg_ctl", "-D", str(data), "-l", str(log_file), "-o", options, "-w", "start")

    def stop() -> None:
        pg("pg_ctl", "-D", str(data), "-m", "fast", "-w", "stop")

    pg("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
    start()
    try:
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        yield Outage(url, "stop", stop, start)
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            stop()
        shutil.rmtree(root, ignore_errors=True)


def seed(url: str, tenants: int, cold_keys: int) -> tuple[list[str], list[str]]:
    """Migrate to head; an unlimited tier, ``tenants`` tenants with a key each, and
    ``cold_keys`` more keys (on the first tenant) that nothing uses before the drill."""
    from gateway.db import crud, migrate
    from gateway.db.session import make_engine, make_session_factory

    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        with make_session_factory(engine).begin() as session:
            crud.create_tier(
                session,
                actor="drill",
                name=TIER,
                weight=1.0,
                ttft_ms=60_000.0,
                tpot_ms=10_000.0,
                best_effort_allowed=True,
            )
            warm = []
            for i in range(tenants):
                crud.create_tenant(session, actor="drill", name=f"drill-{i}", tier=TIER)
                key = crud.create_key(session, actor="drill", tenant=f"drill-{i}", secret=SECRET)
                warm.append(key.plaintext)
            cold = [
                crud.create_key(session, actor="drill", tenant="drill-0", secret=SECRET).plaintext
                for _ in range(cold_keys)
            ]
    finally:
        engine.dispose()
    return warm, cold


def usage_table(url: str) -> dict[str, int]:
    from sqlalchemy import func, select

    from gateway.db.models import UsageRecord
    from gateway.db.session import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(func.count()).select_from(UsageRecord)).scalar_one()
            distinct = conn.execute(
                select(func.count(func.distinct(UsageRecord.request_id)))
            ).scalar_one()
            by_status = dict(
                conn.execute(
                    select(UsageRecord.status, func.count()).group_by(UsageRecord.status)
                ).all()
            )
    finally:
        engine.dispose()
    return {
        "rows": rows,
        "distinct_request_ids": distinct,
        **{f"rows_{k}": v for k, v in by_status.items()},
    }


# ---- servers (child processes) -----------------------------------------------------------


Servers = common.EngineAndGateway


@contextlib.contextmanager
def running_servers(
    db_url: str, workdir: Path, *, workers: int, buffer_records: int, time_scale: float
) -> Iterator[Servers]:
    env = dict(os.environ)
    env.pop("TIERGATE_REDIS_URL", None)
    env.update(
        TIERGATE_DATABASE_URL=db_url,
        TIERGATE_SECRET=SECRET,
        TIERGATE_DATA_DIR=str(workdir),
        TIERGATE_USAGE_BUFFER_RECORDS=str(buffer_records),
    )
    with common.engine_and_gateway(
        __file__,
        workdir,
        env,
        workers=workers,
        time_scale=time_scale,
        gateway_up=("/health/liveliness", lambda status: status < 500),
        startup_timeout_s=STARTUP_TIMEOUT_S,
        gateway_stop_s=60.0,
    ) as servers:
        yield servers


def workers_supported() -> bool:
    """Whether this gateway has a worker mode (``gateway.serve.run_workers``)."""
    from gateway import serve as serving

    return hasattr(serving, "run_workers")


# ---- load ----------------------------------------------------------------------------------


@dataclass
class Answer:
    kind: str  # load | cold | bad
    sent: float  # seconds since the run started
    status: int = 0
    code: str | None = None
    retry_after: bool = False
    json_error: bool = True
    stream_error: bool = False
    client_error: str | None = None
    phase: str = ""


@dataclass
class Timeline:
    down_at: float | None = None
    up_at: float | None = None
    stopped_at: float | None = None
    """When the database's stop had taken effect (``down_at`` is when it began)."""
    restarting_at: float | None = None
    """When its restart began (``up_at`` is when it had taken effect)."""
    readiness: list[tuple[float, int, str, bool]] = field(default_factory=list)
    """(sent at, status, database, degraded): stamped when the check was sent, so that one
    answered before the cut is not counted as during the outage."""
    t0: float = 0.0
    """``time.perf_counter()`` at the start of the run: the times above are relative to it."""


async def _request(session: Any, url: str, key: str, body: bytes, answer: Answer) -> None:
    import aiohttp

    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            answer.status = resp.status
            if resp.status == 200:
                async for line in resp.content:
                    if line.startswith(b"data: {") and b'"error"' in line:
                        answer.stream_error = True
                return
            answer.retry_after = "retry-after" in resp.headers
            raw = await resp.read()
            try:
                answer.code = json.loads(raw)["error"]["code"]
            except (ValueError, KeyError, TypeError):
                answer.json_error = False
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        answer.client_error = type(exc).__name__


async def _metrics(session: Any, url: str) -> dict[str, float]:
    """The gateway's usage and database series, summed over labels other than ``outcome``."""
    async with session.get(url) as resp:
        text = await resp.text()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("tiergate_requests_total{"):  # every answer, counted once
            values["requests_total"] = values.get("requests_total", 0.0) + float(line.split()[-1])
            if 'tier="unauthenticated"' in line:
                key = "requests_total_unauthenticated"
                values[key] = values.get(key, 0.0) + float(line.split()[-1])
            continue
        if not line.startswith(("tiergate_usage_", "tiergate_database_", "tiergate_auth_")):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        if name.endswith("_created"):
            continue
        if 'outcome="' in name_labels:
            name += ":" + name_labels.split('outcome="', 1)[1].split('"', 1)[0]
        values[name] = values.get(name, 0.0) + float(value)
    return values


async def drive(
    servers: Servers,
    outage: Outage,
    warm: list[str],
    cold: list[str],
    *,
    requests: int,
    rps: float,
    outage_at: float,
    outage_s: float,
    max_tokens: int,
    seed: int,
) -> tuple[list[Answer], Timeline, dict[str, float]]:
    import aiohttp

    rng = np.random.default_rng(seed)
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens,
            "stream": True,
        }
    ).encode()
    url = f"{servers.gateway_url}/v1/chat/completions"
    arrivals = np.cumsum(rng.exponential(1.0 / rps, size=requests))
    duration = float(arrivals[-1])
    down_at = outage_at * duration
    answers: list[Answer] = []
    timeline = Timeline()
    tasks: set[asyncio.Task[None]] = set()
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = timeline.t0 = time.perf_counter()

        def now() -> float:
            return time.perf_counter() - t0

        def send(kind: str, key: str) -> None:
            answer = Answer(kind, now())
            answers.append(answer)
            task = asyncio.ensure_future(_request(session, url, key, body, answer))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        async def outage_control() -> None:
            await asyncio.sleep(max(0.0, down_at - now()))
            timeline.down_at = now()
            await asyncio.to_thread(outage.stop)
            timeline.stopped_at = now()
            await asyncio.sleep(max(0.0, timeline.down_at + outage_s - now()))
            timeline.restarting_at = now()
            await asyncio.to_thread(outage.start)
            timeline.up_at = now()

        async def probes() -> None:
            spare = iter(cold)
            while True:
                await asyncio.sleep(PROBE_INTERVAL_S)
                key = next(spare, None)
                if key is not None:
                    send("cold", key)
                send("bad", f"tg-zzzzzzzz-{uuid.uuid4().hex}")

        async def readiness() -> None:
            while True:
                await asyncio.sleep(PROBE_INTERVAL_S)
                sent = now()
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                    async with session.get(f"{servers.gateway_url}/health/readiness") as resp:
                        data = await resp.json()
                    timeline.readiness.append(
                        (sent, resp.status, str(data.get("database")), bool(data.get("degraded")))
                    )

        helpers = [
            asyncio.ensure_future(outage_control()),
            asyncio.ensure_future(probes()),
            asyncio.ensure_future(readiness()),
        ]
        for offset in arrivals:
            delay = float(offset) - now()
            if delay > 0:
                await asyncio.sleep(delay)
            send("load", warm[len(answers) % len(warm)])
        await helpers[0]  # the database is back before the load is judged
        for helper in helpers[1:]:
            helper.cancel()
        while tasks:
            await asyncio.gather(*list(tasks), return_exceptions=True)
        flush_deadline = time.perf_counter() + 120
        usage: dict[str, float] = {}
        while time.perf_counter() < flush_deadline:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                usage = await _metrics(session, servers.metrics_url)
                if (
                    usage.get("tiergate_usage_spooled_records", 0) == 0
                    and usage.get("tiergate_usage_buffered_records", 0) == 0
                    and usage.get("tiergate_database_unavailable", 0) == 0
                ):
                    break
            await asyncio.sleep(0.1)
    for answer in answers:
        answer.phase = common.outage_phase(answer.sent, timeline.down_at, timeline.up_at)
    return answers, timeline, usage


# ---- the drill -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    requests: int = 10_000
    rps: float = 250.0
    outage_s: float = 10.0
    outage_at: float = 0.35
    outage: str = "auto"  # stop | proxy | auto
    workers: int = 1
    buffer_records: int = 1000
    tenants: int = 8
    max_tokens: int = 16
    time_scale: float = 4.0
    seed: int = 0
    server_url: str = DEFAULT_SERVER_URL


@contextlib.contextmanager
def _database(setup: Setup) -> Iterator[Outage]:
    mode = setup.outage
    if mode == "auto":
        mode = "stop" if can_stop_a_cluster() else "proxy"
    if mode == "stop":
        with private_cluster() as outage:
            yield outage
    else:
        with proxied_database(setup.server_url) as outage:
            yield outage


def run_drill(setup: Setup) -> dict[str, Any]:
    workers = setup.workers if setup.workers <= 1 or workers_supported() else 1
    cold_count = int(2 * (setup.requests / setup.rps + setup.outage_s)) + 10
    with _database(setup) as outage, tempfile.TemporaryDirectory(prefix="tiergate-drill-") as tmp:
        warm, cold = seed(outage.url, setup.tenants, cold_count)
        workdir = Path(tmp)
        flush_poll: dict[str, Any] = {}
        with running_servers(
            outage.url,
            workdir,
            workers=workers,
            buffer_records=setup.buffer_records,
            time_scale=setup.time_scale,
        ) as servers:
            answers, timeline, usage = asyncio.run(
                _drive_and_time_flush(servers, outage, warm, cold, setup, flush_poll)
            )
        table = usage_table(outage.url)
        spool_left = sum(p.stat().st_size for p in workdir.glob("usage-spool/*.jsonl"))
    return report(
        setup, outage.mode, workers, answers, timeline, usage, table, flush_poll, spool_left
    )


async def _drive_and_time_flush(
    servers: Servers,
    outage: Outage,
    warm: list[str],
    cold: list[str],
    setup: Setup,
    flush_poll: dict[str, Any],
) -> tuple[list[Answer], Timeline, dict[str, float]]:
    """:func:`drive`, with a watcher of the metrics that notes when, after the database came
    back, the records held meanwhile were written."""
    import aiohttp

    stop = asyncio.Event()

    async def watch() -> None:
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    values = await _metrics(session, servers.metrics_url)
                    at = time.perf_counter()
                    peak = flush_poll.setdefault("peak", {})
                    for name in (
                        "tiergate_usage_buffered_records",
                        "tiergate_usage_spooled_records",
                    ):
                        peak[name] = max(peak.get(name, 0.0), values.get(name, 0.0))
                    flush_poll.setdefault("samples", []).append(
                        (
                            at,
                            values.get("tiergate_usage_buffered_records", 0.0),
                            values.get("tiergate_usage_spooled_records", 0.0),
                            values.get("tiergate_database_unavailable", 0.0),
                        )
                    )
                await asyncio.sleep(0.1)

    watcher = asyncio.ensure_future(watch())
    try:
        answers, timeline, usage = await drive(
            servers,
            outage,
            warm,
            cold,
            requests=setup.requests,
            rps=setup.rps,
            outage_at=setup.outage_at,
            outage_s=setup.outage_s,
            max_tokens=setup.max_tokens,
            seed=setup.seed,
        )
    finally:
        stop.set()
        await watcher
    return answers, timeline, usage


def _flush_seconds(
    timeline: Timeline, flush_poll: dict[str, Any], batch: int = 500
) -> float | None:
    """From the database's return to the first metrics sample after it with nothing spooled,
    the database not failing, and the memory backlog under one batch (what normal batching
    holds)."""
    if timeline.up_at is None:
        return None
    for absolute, buffered, spooled, unavailable in flush_poll.get("samples", []):
        at = absolute - timeline.t0
        if at >= timeline.up_at and spooled == 0 and unavailable == 0 and buffered < batch:
            return round(at - timeline.up_at, 2)
    return None


def report(
    setup: Setup,
    mode: str,
    workers: int,
    answers: list[Answer],
    timeline: Timeline,
    usage: dict[str, float],
    table: dict[str, int],
    flush_poll: dict[str, Any],
    spool_left: int,
) -> dict[str, Any]:
    load = [a for a in answers if a.kind == "load"]
    statuses = Counter(str(a.status) if a.status else f"client:{a.client_error}" for a in answers)
    codes = Counter(f"{a.status} {a.code}" for a in answers if a.status and a.status != 200)
    ok = sum(1 for a in answers if a.status == 200)
    due = sum(
        1 for a in answers if a.status and not (a.status in (401, 503) and a.code in AUTH_REFUSALS)
    )
    client_errors = sum(1 for a in answers if not a.status)

    def by(kind: str) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for phase in ("before", "during", "after"):
            group = [a for a in answers if a.kind == kind and a.phase == phase]
            out[phase] = dict(Counter(f"{a.status} {a.code or ''}".strip() for a in group))
        return out

    stopped, restarting = timeline.stopped_at, timeline.restarting_at
    during = [  # checks sent once the stop had taken effect, before the restart began
        r for r in timeline.readiness if stopped and restarting and stopped <= r[0] < restarting
    ]
    return {
        "outage_mode": mode,
        "workers": workers,
        "requests": len(load),
        "probes": len(answers) - len(load),
        "rps": setup.rps,
        "outage_s": round((timeline.up_at or 0) - (timeline.down_at or 0), 2),
        "answered_2xx": ok,
        "statuses": dict(statuses),
        "error_codes": dict(codes),
        "plain_500s": sum(1 for a in answers if a.status >= 500 and not a.json_error),
        "status_500": sum(1 for a in answers if a.status == 500),
        "non_json_errors": sum(
            1 for a in answers if a.status and a.status != 200 and not a.json_error
        ),
        "503_without_retry_after": sum(1 for a in answers if a.status == 503 and not a.retry_after),
        "stream_errors": sum(1 for a in answers if a.stream_error),
        "client_errors": client_errors,
        "load_by_phase": by("load"),
        "cold_key_by_phase": by("cold"),
        "bad_key_by_phase": by("bad"),
        "readiness_during_outage": dict(
            Counter(f"{s} database={d} degraded={g}" for _, s, d, g in during)
        ),
        "usage_rows": table.get("rows", 0),
        "usage_rows_ok": table.get("rows_ok", 0),
        "usage_rows_by_status": {k[5:]: v for k, v in table.items() if k.startswith("rows_")},
        "usage_rows_due": due,
        "lost": max(0, due - table.get("rows", 0)),
        "extra_rows": max(0, table.get("rows", 0) - due - client_errors),
        "duplicated": table.get("rows", 0) - table.get("distinct_request_ids", 0),
        "ok_rows_equal_2xx": table.get("rows_ok", 0) == ok,
        "counted_in_requests_total": int(usage.get("requests_total", 0)),
        "counted_unauthenticated": int(usage.get("requests_total_unauthenticated", 0)),
        "writer": {
            k.removeprefix("tiergate_"): v
            for k, v in sorted(usage.items())
            if not k.startswith("requests_total")
        },
        "peak_buffered": flush_poll.get("peak", {}).get("tiergate_usage_buffered_records"),
        "peak_spooled": flush_poll.get("peak", {}).get("tiergate_usage_spooled_records"),
        "usage_flush_s": _flush_seconds(timeline, flush_poll),
        "spool_bytes_left": spool_left,
    }


def _print(result: dict[str, Any]) -> None:
    for name, value in result.items():
        print(f"{name:>26}: {value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("engine", "gateway"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--engine-url", help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, default=Setup.requests)
    parser.add_argument("--rps", type=float, default=Setup.rps)
    parser.add_argument("--outage-s", type=float, default=Setup.outage_s)
    parser.add_argument(
        "--outage-at", type=float, default=Setup.outage_at, help="fraction of the run"
    )
    parser.add_argument("--outage", choices=("auto", "stop", "proxy"), default=Setup.outage)
    parser.add_argument("--workers", type=int, default=Setup.workers)
    parser.add_argument("--buffer-records", type=int, default=Setup.buffer_records)
    parser.add_argument("--tenants", type=int, default=Setup.tenants)
    parser.add_argument("--max-tokens", type=int, default=Setup.max_tokens)
    parser.add_argument("--time-scale", type=float, default=Setup.time_scale)
    parser.add_argument("--seed", type=int, default=Setup.seed)
    parser.add_argument(
        "--server-url", default=os.environ.get("TIERGATE_TEST_POSTGRES_URL", DEFAULT_SERVER_URL)
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.role is not None:
        return common.serve_engine_or_gateway(args, MODEL)
    setup = Setup(
        requests=args.requests,
        rps=args.rps,
        outage_s=args.outage_s,
        outage_at=args.outage_at,
        outage=args.outage,
        workers=args.workers,
        buffer_records=args.buffer_records,
        tenants=args.tenants,
        max_tokens=args.max_tokens,
        time_scale=args.time_scale,
        seed=args.seed,
        server_url=args.server_url,
    )
    result = run_drill(setup)
    if args.json:
        print(json.dumps(result))
    else:
        _print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
