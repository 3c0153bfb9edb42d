#!/usr/bin/env python3
"""tiergate on one machine: two gateways on PostgreSQL + Redis, emulated engines, Prometheus.

``start`` brings up, in order: PostgreSQL and Redis (the running ones when they answer, else
Debian's), the emulated engines (``tiergate engine-sim``, one process each), the database
(created if missing, migrated, seeded, the engines registered as backends), the gateway
processes (``tiergate serve --no-emulated``, sharing the engines, the database and Redis's
limits), and Prometheus scraping all of them with ``deploy/prometheus/``'s jobs and rules. It
returns once every process answers and every scrape target is up. ``status`` says what runs,
``stop`` stops it all (gateways drain first). Everything listens on 127.0.0.1; each process logs
to ``<dir>/logs/<name>.log``. The why and the ports: ``deploy/local/README.md``.

Run it with the Python that has tiergate installed (``.venv/bin/python deploy/local/stack.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs  # this folder is not a package: run as a script, it finds its modules
import prometheus_config as promcfg
from procs import Proc

ROOT = Path(__file__).resolve().parents[2]
MODEL = "qwen2-7b"
DEFAULT_ENGINES = "910b-qwen2-7b,910b-qwen2-7b,a100-qwen2-7b,a100-qwen2-7b"
DEFAULT_DB = "postgresql+psycopg://postgres@127.0.0.1:5432/tiergate_local"
HARDWARE = {"910b": "ascend-910b", "a100": "nvidia-a100", "h100": "nvidia-h100"}
STATE = "stack.json"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 40.0
"""Longer than a gateway's drain (``TIERGATE_SHUTDOWN_DRAIN_S`` is 30 s by default)."""


# ---- configuration ------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("start", "status", "stop", "env"):
        cmd = sub.add_parser(name)
        cmd.add_argument(
            "--dir",
            type=Path,
            default=Path(os.environ.get("TIERGATE_STACK_DIR", "~/.tiergate/local-stack")),
            help="state, logs, secrets and Prometheus data (default ~/.tiergate/local-stack)",
        )
        if name == "status":
            cmd.add_argument("--json", action="store_true", help="the state as JSON")
    start = sub.choices["start"]
    ports = "; 0 = a free port"
    start.add_argument("--gateways", type=int, default=2, help="gateway processes (2)")
    start.add_argument("--workers", type=int, default=1, help="worker processes per gateway (1)")
    start.add_argument("--api-port", type=int, default=8100, help=f"first gateway API port{ports}")
    start.add_argument(
        "--metrics-port", type=int, default=9464, help=f"first gateway /metrics port{ports}"
    )
    start.add_argument("--engine-port", type=int, default=8200, help=f"first engine port{ports}")
    start.add_argument("--prometheus-port", type=int, default=9190, help=f"Prometheus{ports}")
    start.add_argument(
        "--engines", default=DEFAULT_ENGINES, help="latency profile of each engine, comma-separated"
    )
    start.add_argument("--policy", default="slide", help="the engines' scheduling policy")
    start.add_argument(
        "--engine-time-scale",
        type=float,
        default=1.0,
        help="engines run this many times faster than their profile (<1: slower)",
    )
    start.add_argument(
        "--database-url",
        default=os.environ.get("TIERGATE_DATABASE_URL", DEFAULT_DB),
        help="PostgreSQL (created if missing) or SQLite URL",
    )
    start.add_argument(
        "--redis-url", default=os.environ.get("TIERGATE_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    start.add_argument("--redis-prefix", default="tiergate-local", help="Redis key prefix")
    start.add_argument(
        "--prometheus-config",
        type=Path,
        default=ROOT / "deploy/prometheus/prometheus.yml",
        help="the shipped scrape configuration whose jobs are used",
    )
    start.add_argument(
        "--rules",
        type=Path,
        default=ROOT / "deploy/prometheus/rules",
        help="a rule file, or a folder of *.yml rule files",
    )
    start.add_argument("--scrape-interval", default="15s")
    start.add_argument("--evaluation-interval", default="15s")
    start.add_argument(
        "--tenant-labels",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="label metrics by tenant too (the tenants dashboard needs it)",
    )
    return parser.parse_args(argv)


def port(wanted: int, offset: int = 0) -> int:
    return procs.free_port() if wanted == 0 else wanted + offset


def hardware(profile: str) -> str:
    return HARDWARE.get(profile.split("-", 1)[0], profile.split("-", 1)[0])


def load_secrets(path: Path) -> dict[str, str]:
    """The server secret and the admin key, made once per stack directory (mode 0600)."""
    if path.is_file():
        return dict(json.loads(path.read_text()))
    values = {
        "TIERGATE_SECRET": secrets.token_urlsafe(32),
        "TIERGATE_ADMIN_KEY": secrets.token_urlsafe(32),
    }
    path.touch(mode=0o600)
    path.write_text(json.dumps(values))
    return values


def tiergate_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tiergate_cli", *args]


# ---- PostgreSQL, Redis and the database -----------------------------------------------------


def ensure_postgres(url: str) -> None:
    """The server ``url`` names answers, starting Debian's cluster(s) if none does; the
    database is created if missing."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if not parsed.drivername.startswith("postgresql"):
        return
    host, pg_port = parsed.host or "127.0.0.1", parsed.port or 5432
    if not procs.answers(host, pg_port) and shutil.which("pg_lsclusters"):
        say(f"PostgreSQL does not answer on {host}:{pg_port}: starting Debian's cluster(s)")
        listing = subprocess.run(
            ["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=False
        )
        for line in listing.stdout.splitlines():
            version, cluster, *_ = line.split()
            subprocess.run(["pg_ctlcluster", version, cluster, "start"], check=False)
    for _ in range(60):
        if procs.answers(host, pg_port):
            break
        time.sleep(0.5)
    else:
        raise SystemExit(f"PostgreSQL does not answer on {host}:{pg_port}")
    admin = create_engine(parsed.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :name"),
                {"name": parsed.database},
            ).first()
            if exists is None:
                conn.execute(text(f'CREATE DATABASE "{parsed.database}"'))
                say(f"created database {parsed.database}")
    finally:
        admin.dispose()


def ensure_redis(url: str, logs: Path) -> Proc | None:
    """Redis at ``url`` answers; started here (nothing kept on disk) if it does not, and then
    returned so that ``stop`` stops it."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host, redis_port = parts.hostname or "127.0.0.1", parts.port or 6379
    if procs.answers(host, redis_port):
        return None
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit(f"Redis does not answer on {host}:{redis_port} and redis-server is absent")
    cmd = [server, "--bind", host, "--port", str(redis_port), "--save", "", "--appendonly", "no"]
    proc = procs.spawn("redis", cmd, logs=logs, ports={"redis": redis_port})
    for _ in range(40):
        if procs.answers(host, redis_port):
            return proc
        time.sleep(0.25)
    raise SystemExit(f"redis-server did not start: {proc.log}")


def prepare_database(url: str, secret: str, engines: Sequence[tuple[str, str, int]]) -> None:
    """Migrate and seed, and register the engines as the backends (updated in place when the
    stack restarts on other ports). Runs before any gateway, so they never migrate at once."""
    from gateway.db import crud, migrate
    from gateway.db.crud.backends import find_backend
    from gateway.db.seed import DEMO_TENANT, seed_defaults
    from gateway.db.session import make_engine, make_session_factory

    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        with make_session_factory(engine).begin() as session:
            seeded = seed_defaults(session, actor="local-stack")
            if seeded.demo_key_needed:
                key = crud.create_key(
                    session, actor="local-stack", tenant=DEMO_TENANT, secret=secret, name="demo"
                )
                say("demo API key for tenant demo (shown once, store it now):")
                print(key.plaintext, flush=True)
            for name, profile, engine_port in engines:
                base_url = f"http://127.0.0.1:{engine_port}"
                wanted: dict[str, object] = {
                    "base_url": base_url,
                    "profile": profile,
                    "model": MODEL,
                }
                backend = find_backend(session, name)
                if backend is None:
                    crud.create_backend(
                        session,
                        actor="local-stack",
                        name=name,
                        base_url=base_url,
                        model=MODEL,
                        profile=profile,
                        kind="emulated",
                    )
                else:
                    changes = {k: v for k, v in wanted.items() if getattr(backend, k) != v}
                    if not backend.enabled:
                        changes["enabled"] = True
                    if changes:
                        crud.update_backend(session, name, changes, actor="local-stack")
    finally:
        engine.dispose()


# ---- the commands -----------------------------------------------------------------------------


def say(message: str) -> None:
    print(f"stack: {message}", file=sys.stderr, flush=True)


def start(args: argparse.Namespace) -> int:
    home: Path = args.dir.expanduser().resolve()
    state_path = home / STATE
    running, _ = procs.load(state_path)
    if any(procs.alive(p) for p in running):
        say(f"already running (state in {state_path}); `stop` it first")
        return 1
    logs = home / "logs"
    home.mkdir(parents=True, exist_ok=True)
    keys = load_secrets(home / "secrets.json")
    started: list[Proc] = []
    info: dict[str, Any] = {"database_url": args.database_url, "redis_url": args.redis_url}
    try:
        ensure_postgres(args.database_url)
        redis = ensure_redis(args.redis_url, logs)
        if redis is not None:
            started.append(redis)

        # engines, each a process of its own
        profiles = [p.strip() for p in args.engines.split(",") if p.strip()]
        engines: list[tuple[str, str, int]] = []
        counts: dict[str, int] = {}
        for i, profile in enumerate(profiles):
            kind = hardware(profile)
            name = f"{kind}-{counts.setdefault(kind, 0)}"
            counts[kind] += 1
            engine_port = port(args.engine_port, i)
            cmd = tiergate_cmd(
                "engine-sim",
                f"--profile={profile}",
                f"--policy={args.policy}",
                "--host=127.0.0.1",
                f"--port={engine_port}",
                f"--model={MODEL}",
                f"--seed={i}",
                f"--time-scale={args.engine_time_scale}",
                "--log-level=warning",
            )
            health = f"http://127.0.0.1:{engine_port}/health"
            started.append(
                procs.spawn(
                    f"engine-{name}", cmd, logs=logs, health_url=health, ports={"api": engine_port}
                )
            )
            engines.append((name, profile, engine_port))
        check(procs.wait_healthy(started, START_TIMEOUT_S))
        info["engines"] = [
            {"backend": n, "profile": p, "hardware": hardware(p), "url": f"http://127.0.0.1:{q}"}
            for n, p, q in engines
        ]

        prepare_database(args.database_url, keys["TIERGATE_SECRET"], engines)

        # gateways: one database, one Redis, the same engines
        env = dict(os.environ)
        env.update(keys)
        env.update(
            TIERGATE_DATABASE_URL=args.database_url,
            TIERGATE_REDIS_URL=args.redis_url,
            TIERGATE_REDIS_PREFIX=args.redis_prefix,
            TIERGATE_LIMITS_SHARE=str(args.gateways * args.workers),
            TIERGATE_METRICS_TENANT_LABELS="true" if args.tenant_labels else "false",
        )
        gateways = []
        for i in range(args.gateways):
            api, metrics = port(args.api_port, i), port(args.metrics_port, i)
            env_i = dict(env, TIERGATE_DATA_DIR=str(home / "data" / f"gateway-{i}"))
            cmd = tiergate_cmd(
                "serve",
                "--no-emulated",
                "--host=127.0.0.1",
                f"--port={api}",
                f"--metrics-addr=127.0.0.1:{metrics}",
                f"--workers={args.workers}",
                "--log-level=info",
            )
            gateway = procs.spawn(
                f"gateway-{i}",
                cmd,
                logs=logs,
                env=env_i,
                health_url=f"http://127.0.0.1:{api}/health/readiness",
                ports={"api": api, "metrics": metrics},
            )
            started.append(gateway)
            gateways.append(gateway)
        check(procs.wait_healthy(gateways, START_TIMEOUT_S))
        info["gateways"] = [
            {
                "url": f"http://127.0.0.1:{g.ports['api']}",
                "metrics": f"http://127.0.0.1:{g.ports['metrics']}/metrics",
            }
            for g in gateways
        ]

        prometheus = start_prometheus(args, home, logs, engines, gateways)
        started.append(prometheus)
        check(procs.wait_healthy([prometheus], START_TIMEOUT_S))
        prom_url = f"http://127.0.0.1:{prometheus.ports['api']}"
        info["prometheus"] = prom_url
        wait_targets_up(prom_url, START_TIMEOUT_S)
    except BaseException:
        say("start failed: stopping what was started")
        procs.terminate(list(reversed(started)), STOP_TIMEOUT_S)
        procs.save(state_path, [], info)
        raise
    procs.save(state_path, started, info)
    for line in describe(info):
        say(line)
    say(f"logs in {logs}; `stack.py env --dir {home}` for the CLI's environment")
    return 0


def start_prometheus(
    args: argparse.Namespace,
    home: Path,
    logs: Path,
    engines: Sequence[tuple[str, str, int]],
    gateways: Sequence[Proc],
) -> Proc:
    """Prometheus on this stack's targets, with the shipped jobs and rules (checked first)."""
    binary, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if binary is None or promtool is None:
        raise SystemExit("prometheus/promtool missing: run `bash .ci/prometheus.sh` (as root)")
    prom_port = port(args.prometheus_port)
    rules_path: Path = args.rules
    rule_files = sorted(rules_path.glob("*.yml")) if rules_path.is_dir() else [rules_path]
    rule_files = [f for f in rule_files if f.is_file()]
    template = (
        promcfg.load_template(args.prometheus_config)
        if args.prometheus_config.is_file()
        else promcfg.default_template()
    )
    targets = {
        "gateways": [promcfg.Target(f"127.0.0.1:{g.ports['metrics']}") for g in gateways],
        "engines": [
            promcfg.Target(
                f"127.0.0.1:{engine_port}",
                {"backend": name, "hardware": hardware(profile)},
            )
            for name, profile, engine_port in engines
        ],
        "prometheus": [promcfg.Target(f"127.0.0.1:{prom_port}")],
    }
    config = promcfg.local_config(
        template,
        targets,
        scrape_interval=args.scrape_interval,
        evaluation_interval=args.evaluation_interval,
        rule_files=rule_files,
    )
    folder = home / "prometheus"
    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / "prometheus.yml"
    config_path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
    checked = subprocess.run(
        [promtool, "check", "config", str(config_path)], capture_output=True, text=True
    )
    if checked.returncode != 0:
        raise SystemExit(f"promtool check config failed:\n{checked.stdout}{checked.stderr}")
    cmd = [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
        "--storage.tsdb.retention.time=2d",
    ]
    return procs.spawn(
        "prometheus",
        cmd,
        logs=logs,
        health_url=f"http://127.0.0.1:{prom_port}/-/ready",
        ports={"api": prom_port},
    )


def wait_targets_up(prom_url: str, timeout_s: float) -> None:
    """Every scrape target has been scraped successfully at least once."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout_s
    down: list[str] = []
    while time.monotonic() < deadline:
        with opener.open(f"{prom_url}/api/v1/targets?state=active", timeout=5) as response:
            active = json.load(response)["data"]["activeTargets"]
        down = [
            f"{t['labels'].get('job')} {t['scrapeUrl']}: {t['health']} {t.get('lastError', '')}"
            for t in active
            if t["health"] != "up"
        ]
        if active and not down:
            return
        time.sleep(0.5)
    raise SystemExit("Prometheus targets not up:\n  " + "\n  ".join(down or ["(none found)"]))


def check(failed: Sequence[Proc]) -> None:
    if failed:
        details = "\n".join(
            f"--- {p.name} (exit status {procs.exit_status(p)}, log {p.log}):\n{procs.tail(p.log)}"
            for p in failed
        )
        raise SystemExit(f"not ready: {', '.join(p.name for p in failed)}\n{details}")


def describe(info: dict[str, Any]) -> list[str]:
    lines = [f"gateway {g['url']} (metrics {g['metrics']})" for g in info.get("gateways", [])]
    lines += [f"engine {e['backend']} ({e['profile']}) {e['url']}" for e in info.get("engines", [])]
    if "prometheus" in info:
        lines.append(f"prometheus {info['prometheus']}")
    return lines


def status(args: argparse.Namespace) -> int:
    home = args.dir.expanduser().resolve()
    running, info = procs.load(home / STATE)
    rows = [
        {"name": p.name, "pid": p.pid, "alive": procs.alive(p), "healthy": procs.healthy(p)}
        for p in running
    ]
    if args.json:
        print(json.dumps({"info": info, "procs": rows}, indent=2))
    elif not rows:
        print("not running")
    else:
        for row in rows:
            state = "up" if row["healthy"] else ("unhealthy" if row["alive"] else "down")
            print(f"{row['name']:<24} pid {row['pid']:<8} {state}")
        for line in describe(info):
            print(line)
    return 0 if rows and all(r["healthy"] for r in rows) else 1


def stop(args: argparse.Namespace) -> int:
    """Prometheus first, then the gateways (each drains), the engines and a Redis we started."""
    home = args.dir.expanduser().resolve()
    running, info = procs.load(home / STATE)
    order = sorted(running, key=lambda p: _stop_rank(p.name))
    procs.terminate(order, STOP_TIMEOUT_S)
    left = [p.name for p in running if procs.alive(p)]
    procs.save(home / STATE, [], info)
    if left:
        say(f"still running: {', '.join(left)}")
        return 1
    say(f"stopped {len(running)} process(es)")
    return 0


def _stop_rank(name: str) -> int:
    for rank, prefix in enumerate(("prometheus", "gateway", "engine", "redis")):
        if name.startswith(prefix):
            return rank
    return 99


def env(args: argparse.Namespace) -> int:
    """``export`` lines for running ``tiergate`` commands against this stack's database."""
    home = args.dir.expanduser().resolve()
    _, info = procs.load(home / STATE)
    values = dict(load_secrets(home / "secrets.json"))
    if "database_url" in info:
        values["TIERGATE_DATABASE_URL"] = str(info["database_url"])
    for key, value in values.items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    command = {"start": start, "status": status, "stop": stop, "env": env}[args.command]
    return command(args)


if __name__ == "__main__":
    sys.exit(main())
