"""Offline checks of ``deploy/compose/``: the Compose schema, and the files against the code.

No container registry is reachable here, so the stack cannot be started: the Compose files are
validated against the Compose Specification's JSON schema (vendored in
``deploy/compose/schema/``) with ``jsonschema``, HAProxy's configuration with ``haproxy -c``
and Prometheus' with ``promtool check config`` where those are installed, and everything is
cross-checked against the code and against each other. The one-shot ``bootstrap.sh`` runs for
real, on SQLite, with this checkout's ``tiergate``.
"""

from __future__ import annotations

import copy
import hashlib
import ipaddress
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from deploy_checks import (
    COMPOSE,
    DEPLOY,
    ENGINE_HEALTH,
    ENGINE_IMAGES,
    GATEWAY_IMAGE,
    LIVENESS,
    READINESS,
    ROOT,
    SCHEDULER_CLS,
    backend_kinds,
    engine_settings,
    engine_sim_routes,
    env_assignments,
    gateway_routes,
    gateway_settings,
    known_profiles,
    metrics_port,
    option,
    project_version,
    read_backends,
    require_tool,
)
from kustomize_lite import split_image

SCHEMA = COMPOSE / "schema" / "compose-spec.json"
FILES = ("compose.yaml", "compose.vllm.yaml")

Obj = dict[str, Any]


def load(name: str) -> Obj:
    document: Obj = yaml.safe_load((COMPOSE / name).read_text())
    return document


def merged() -> Obj:
    """compose.yaml with compose.vllm.yaml applied, by Compose's merge rules for the fields
    used: maps merged, ``volumes`` merged by container path, other lists replaced."""
    out = copy.deepcopy(load("compose.yaml"))
    for name, override in load("compose.vllm.yaml")["services"].items():
        service = out["services"].setdefault(name, {})
        for key, value in override.items():
            if key == "volumes" and key in service:
                by_target = {v.split(":")[1]: v for v in service[key]}
                by_target.update({v.split(":")[1]: v for v in value})
                service[key] = list(by_target.values())
            else:
                service[key] = copy.deepcopy(value)
    out.setdefault("volumes", {}).update(load("compose.vllm.yaml").get("volumes", {}))
    return out


def is_gateway(service: Obj) -> bool:
    return (service.get("command") or [None])[0] == "serve"


def is_emulated_engine(service: Obj) -> bool:
    return (service.get("command") or [None])[0] == "engine-sim"


def environment(service: Obj) -> dict[str, str]:
    env = service.get("environment", {})
    assert isinstance(env, dict), "environment as a map"
    return {k: str(v) for k, v in env.items()}


def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


# ---- the Compose schema ------------------------------------------------------------------


@pytest.mark.parametrize("name", FILES)
def test_compose_files_follow_the_compose_specification(name: str):
    errors = sorted(validator().iter_errors(load(name)), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_the_merged_vllm_stack_follows_it_too():
    errors = list(validator().iter_errors(merged()))
    assert not errors, [e.message for e in errors]


def test_the_schema_rejects_a_broken_compose_file():
    """A negative control: a misspelt key and a wrong condition fail the same validator."""
    typo = load("compose.yaml")
    typo["services"]["gateway-1"]["depends_onn"] = typo["services"]["gateway-1"]["depends_on"]
    condition = load("compose.yaml")
    condition["services"]["gateway-1"]["depends_on"]["migrate"]["condition"] = "finished"
    for broken in (typo, condition):
        assert list(validator().iter_errors(broken))


def test_the_vendored_schema_is_the_one_its_readme_names():
    digest = hashlib.sha256(SCHEMA.read_bytes()).hexdigest()
    readme = (SCHEMA.parent / "README.md").read_text()
    assert f"sha256: `{digest}`" in readme
    assert "Apache License" in (SCHEMA.parent / "LICENSE").read_text()


# ---- secrets and settings ------------------------------------------------------------------


def test_variables_are_settings_of_what_they_configure():
    gateway, engine = gateway_settings(), engine_settings()
    for name, service in merged()["services"].items():
        env = {k for k in environment(service) if k.startswith("TIERGATE_")}
        image = split_image(service.get("image", ""))[0]
        known = engine if image in ENGINE_IMAGES else gateway
        assert env <= known, f"{name}: not settings: {env - known}"


def test_every_interpolated_variable_is_in_env_example_and_nothing_else():
    text = "".join((COMPOSE / name).read_text() for name in FILES)
    used = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", text))
    example = env_assignments(COMPOSE / ".env.example")
    assert used == set(example)
    required = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*):\?", text))
    assert {"TIERGATE_SECRET", "TIERGATE_ADMIN_KEY", "POSTGRES_PASSWORD"} <= required
    assert ".env" in (COMPOSE / ".gitignore").read_text().split()


def test_secrets_come_from_env_and_nowhere_else():
    for name, service in merged()["services"].items():
        for key, value in environment(service).items():
            if any(word in key for word in ("SECRET", "PASSWORD", "ADMIN_KEY", "TOKEN")):
                assert value.startswith("${"), f"{name}: {key} is written in the file"
        url = environment(service).get("TIERGATE_DATABASE_URL")
        if url:
            assert "${POSTGRES_PASSWORD" in url


# ---- services against the code ---------------------------------------------------------------


def test_gateways_serve_the_port_the_balancer_checks():
    compose = load("compose.yaml")
    services = compose["services"]
    gateways = {n: s for n, s in services.items() if is_gateway(s)}
    assert len(gateways) == 2
    routes = gateway_routes()
    assert {LIVENESS, READINESS} <= routes
    haproxy = (COMPOSE / "haproxy.cfg").read_text()
    servers = re.findall(r"^\s*server (\S+) (\S+):(\d+)", haproxy, re.M)
    assert {(n, h) for n, h, _ in servers} == {(n, n) for n in gateways}
    assert re.search(rf"option httpchk GET {READINESS}\s", haproxy)
    for name, service in gateways.items():
        port = int(option(service["command"], "--port") or 0)
        assert {int(p) for _, _, p in servers} == {port}
        assert option(service["command"], "--host") == "0.0.0.0"
        assert "--no-emulated" in service["command"]
        assert LIVENESS in " ".join(service["healthcheck"]["test"])
        env = environment(service)
        host, _, metrics = env["TIERGATE_METRICS_ADDR"].rpartition(":")
        assert host == "0.0.0.0" and int(metrics) == metrics_port()
        assert {str(port), metrics} == set(service["expose"])
        assert "ports" not in service, f"{name}: only the balancer publishes a port"
        conditions = {k: v["condition"] for k, v in service["depends_on"].items()}
        assert conditions["migrate"] == "service_completed_successfully"
        # the balancer's address is the one trusted proxy (audit: the client's address)
        lb_ip = services["lb"]["networks"]["default"]["ipv4_address"]
        assert env["TIERGATE_TRUSTED_PROXIES"] == lb_ip
        subnet = compose["networks"]["default"]["ipam"]["config"][0]["subnet"]
        assert ipaddress.ip_address(lb_ip) in ipaddress.ip_network(subnet)
        workers = int(env["TIERGATE_WORKERS"])
        assert int(env["TIERGATE_LIMITS_SHARE"]) == workers * len(gateways)
        delay = float(env["TIERGATE_SHUTDOWN_DELAY_S"])
        grace = int(service["stop_grace_period"].rstrip("s"))
        assert grace > delay + 30  # TIERGATE_SHUTDOWN_DRAIN_S's default
    published = [p for s in services.values() for p in s.get("ports", [])]
    assert all(p.startswith("127.0.0.1:") for p in published if not p.startswith("${"))


def test_haproxy_accepts_its_configuration():
    haproxy = require_tool("haproxy", "apt-get install haproxy")
    result = subprocess.run(
        [haproxy, "-c", "-f", str(COMPOSE / "haproxy.cfg")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_depends_on_name_services_and_one_shots_do_not_restart():
    services = merged()["services"]
    for name, service in services.items():
        for other in service.get("depends_on", {}):
            assert other in services, f"{name} depends on unknown {other}"
            if service["depends_on"][other]["condition"] == "service_healthy":
                assert "healthcheck" in services[other] or other == "migrate", other
    migrate = services["migrate"]
    assert migrate["restart"] == "no" and migrate["healthcheck"] == {"disable": True}
    assert migrate["entrypoint"][-1] == "/etc/tiergate/bootstrap.sh"


@pytest.mark.parametrize(
    ("stack", "backends_file"), [("emulated", "backends.txt"), ("vllm", "backends.vllm.txt")]
)
def test_backends_are_the_stacks_engines(stack: str, backends_file: str):
    compose = load("compose.yaml") if stack == "emulated" else merged()
    services = compose["services"]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in services["migrate"]["volumes"] if ":" in v}
    assert mounted["/etc/tiergate/backends.txt"] == f"./{backends_file}"
    backends = read_backends(COMPOSE / backends_file)
    engines = {
        n: s
        for n, s in services.items()
        if (is_emulated_engine(s) and stack == "emulated")
        or (split_image(s.get("image", ""))[0] in ENGINE_IMAGES and stack == "vllm")
    }
    assert {b.host for b in backends} == set(engines)
    for backend in backends:
        assert backend.kind in backend_kinds() and backend.profile in known_profiles()
        service = engines[backend.host]
        command = service["command"]
        assert str(backend.port) in service["expose"]
        assert int(option(command, "--port") or 0) == backend.port
        assert ENGINE_HEALTH in " ".join(service["healthcheck"]["test"])
        if backend.kind == "emulated":
            assert ENGINE_HEALTH in engine_sim_routes()
            assert option(command, "--profile") == backend.profile
            assert option(command, "--model") == backend.model
        else:
            assert command[0] == backend.model
            assert environment(service)["TIERGATE_PROFILE"] == backend.profile
            assert option(command, "--scheduler-cls") == SCHEDULER_CLS[backend.kind]
            assert service["build"]["dockerfile"] == ENGINE_IMAGES[service["image"].split(":")[0]]


def test_accelerators_are_requested():
    services = merged()["services"]
    (gpu,) = services["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    devices = {d.split(":")[0] for d in services["vllm-ascend"]["devices"]}
    assert {"/dev/davinci0", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"} <= devices
    assert services["vllm"]["profiles"] == ["nvidia"]
    assert services["vllm-ascend"]["profiles"] == ["ascend"]
    emulated = [n for n, s in services.items() if is_emulated_engine(s)]
    assert emulated and all(services[n]["profiles"] == ["emulated"] for n in emulated)


def test_images_are_pinned_and_the_projects_are_at_its_version():
    version = project_version()
    for name, service in merged()["services"].items():
        image, tag = split_image(service["image"])
        assert tag and tag != "latest", f"{name}: {service['image']} is not pinned"
        if image == GATEWAY_IMAGE or image in ENGINE_IMAGES:
            assert tag == version, f"{name}: {service['image']}"
            dockerfile = service["build"]["dockerfile"]
            assert (ROOT / dockerfile).is_file()
            assert (COMPOSE / service["build"]["context"]).resolve() == ROOT


def test_bind_mounts_exist():
    for stack in (load("compose.yaml"), merged()):
        for name, service in stack["services"].items():
            for volume in service.get("volumes", []):
                source = volume.split(":")[0]
                if source.startswith("."):
                    assert (COMPOSE / source).exists(), f"{name}: {source}"
                elif source.startswith("/"):
                    assert name == "vllm-ascend", f"{name}: host path {source}"
                else:
                    assert source in stack["volumes"], f"{name}: volume {source}"


# ---- Prometheus and Grafana ---------------------------------------------------------------


def prometheus_layout(tmp_path: Path, targets: str) -> Path:
    """/etc/prometheus as the Compose stack mounts it, in a temporary directory."""
    shutil.copy(DEPLOY / "prometheus" / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copytree(DEPLOY / "prometheus" / "rules", tmp_path / "rules")
    shutil.copytree(COMPOSE / targets, tmp_path / "targets")
    return tmp_path / "prometheus.yml"


@pytest.mark.parametrize(
    ("targets", "backends_file"),
    [("prometheus-targets", "backends.txt"), ("prometheus-targets.vllm", "backends.vllm.txt")],
)
def test_prometheus_targets_are_the_stacks(targets: str, backends_file: str):
    compose = load("compose.yaml")
    gateways = [n for n, s in compose["services"].items() if is_gateway(s)]
    (gateway_group,) = yaml.safe_load((COMPOSE / targets / "gateways.yml").read_text())
    assert gateway_group["targets"] == [f"{g}:{metrics_port()}" for g in gateways]
    groups = yaml.safe_load((COMPOSE / targets / "engines.yml").read_text())
    backends = read_backends(COMPOSE / backends_file)
    assert [(g["targets"], g["labels"]["backend"]) for g in groups] == [
        ([f"{b.host}:{b.port}"], b.name) for b in backends
    ]
    assert all(g["labels"]["hardware"] for g in groups)
    shipped = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    patterns = [
        Path(f).name
        for job in shipped["scrape_configs"]
        for sd in job["file_sd_configs"]
        for f in sd["files"]
    ]
    for target_file in ("gateways.yml", "engines.yml"):
        assert any(Path(target_file).match(p) for p in patterns), (target_file, patterns)


@pytest.mark.parametrize("targets", ["prometheus-targets", "prometheus-targets.vllm"])
def test_promtool_accepts_the_stacks_prometheus(tmp_path: Path, targets: str):
    promtool = require_tool("promtool", "bash .ci/prometheus.sh: Debian's prometheus")
    config = prometheus_layout(tmp_path, targets)
    result = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_grafana_mounts_match_its_provisioning():
    grafana = load("compose.yaml")["services"]["grafana"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    provider = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "tiergate.yaml").read_text()
    )
    (path,) = {p["options"]["path"] for p in provider["providers"]}
    assert mounts["../grafana/dashboards"] == path
    assert mounts["../grafana/provisioning"] == "/etc/grafana/provisioning"
    datasources = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    )
    urls = {d["url"] for d in datasources["datasources"]}
    assert urls == {"http://prometheus:9090"}  # the Compose service name and port


# ---- the one-shot, for real ------------------------------------------------------------------


@pytest.mark.slow
def test_bootstrap_migrates_seeds_and_registers_backends_idempotently(tmp_path: Path):
    database = tmp_path / "tiergate.db"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TIERGATE_")},
        "TIERGATE_DATABASE_URL": f"sqlite:///{database}",
        "TIERGATE_SECRET": "test-only-secret",
        "TIERGATE_DATA_DIR": str(tmp_path / "data"),
        "BACKENDS_FILE": str(COMPOSE / "backends.txt"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    runs = [
        subprocess.run(
            ["sh", str(COMPOSE / "bootstrap.sh")],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stdout + run.stderr
    assert "already registered" in runs[1].stdout
    with sqlite3.connect(database) as connection:
        rows = connection.execute("SELECT name, base_url, model, profile, kind FROM backends")
        registered = sorted(rows)
        tiers = {r[0] for r in connection.execute("SELECT name FROM tiers")}
    listed = read_backends(COMPOSE / "backends.txt")
    expected = sorted((b.name, b.url, b.model, b.profile, b.kind) for b in listed)
    assert registered == expected
    assert {"premium", "standard", "batch"} <= tiers


def test_a_bad_backend_line_fails_the_bootstrap(tmp_path: Path):
    """The one-shot must fail (and the gateways not start) on a line it cannot register."""
    bad = tmp_path / "backends.txt"
    bad.write_text("x http://x:8000 m no-such-profile vllm\n")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    # a stand-in `tiergate`: migrations and seed succeed, `backends add` fails as the real one
    # does for an unknown profile (its own test covers the real message)
    (fake_bin / "tiergate").write_text(
        '#!/bin/sh\nif [ "$1" = backends ]; then echo "Error: unknown profile" >&2; exit 2; fi\n'
    )
    (fake_bin / "tiergate").chmod(0o755)
    env = {
        "PATH": f"{fake_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "BACKENDS_FILE": str(bad),
    }
    run = subprocess.run(
        ["sh", str(COMPOSE / "bootstrap.sh")], env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode != 0 and "unknown profile" in run.stderr
