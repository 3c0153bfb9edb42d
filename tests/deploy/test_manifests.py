"""Offline checks of ``deploy/k8s/``: render, validate against Kubernetes' schemas, cross-check.

No cluster is reachable here, and kustomize installs from neither PyPI nor Debian's archive:
each overlay is rendered by ``kustomize_lite`` (the subset of kustomize the manifests use; any
other field fails) and every rendered object is validated with ``kubernetes-validate`` against
Kubernetes 1.30's schemas, strictly (unknown fields fail). The PodMonitors are custom resources
whose schema no installable package ships: they get the structural checks below instead. Then
the manifests are checked against the code: env vars are real settings, probes are real routes,
ports, selectors, image tags and backend lists agree.
"""

from __future__ import annotations

import copy
import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploy_checks import (
    DEPLOY,
    ENGINE_HEALTH,
    ENGINE_IMAGES,
    GATEWAY_IMAGE,
    K8S,
    LIVENESS,
    OVERLAYS,
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
    yamllint,
)
from kustomize_lite import KustomizeError, build, containers, pod_spec, split_image

K8S_VERSION = "1.30"
"""The Kubernetes version the manifests target (HPA autoscaling/v2, PDB policy/v1, ...)."""

CRD_KINDS = {("monitoring.coreos.com/v1", "PodMonitor")}
"""Custom resources: no schema for them is installable here (checked structurally)."""

SECRETS_EXAMPLE = {K8S / "base" / "secrets.env": K8S / "base" / "secrets.env.example"}
"""``secrets.env`` is git-ignored (the operator writes it); the tests render its template."""

Obj = dict[str, Any]


def render(target: str) -> list[Obj]:
    directory = K8S / "base" if target == "base" else K8S / "overlays" / target
    return build(directory, files=SECRETS_EXAMPLE)


@pytest.fixture(scope="module", params=("base", *OVERLAYS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[Obj]]:
    return request.param, render(request.param)


def by_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[Obj], kind: str, name: str) -> Obj:
    matches = [o for o in by_kind(objects, kind) if o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind} {name}: {len(matches)} found"
    return matches[0]


def workloads(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if pod_spec(o) is not None]


def pod_labels(obj: Obj) -> dict[str, str]:
    return dict(obj["spec"]["template"]["metadata"].get("labels", {}))


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def selected_pods(objects: list[Obj], selector: dict[str, str]) -> list[Obj]:
    return [w for w in workloads(objects) if selects(selector, pod_labels(w))]


def is_gateway(obj: Obj) -> bool:
    return pod_labels(obj).get("app.kubernetes.io/component") == "gateway"


def is_engine(obj: Obj) -> bool:
    return pod_labels(obj).get("app.kubernetes.io/component") == "engine"


def tiergate_image(container: Obj) -> bool:
    return split_image(container["image"])[0] == GATEWAY_IMAGE


def container_env(objects: list[Obj], container: Obj) -> dict[str, str]:
    """Every variable a container gets: ``env`` and the keys of ``envFrom`` sources."""
    env = {e["name"]: e.get("value", "<from a reference>") for e in container.get("env", [])}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(named(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
        if "secretRef" in source:
            secret = named(objects, "Secret", source["secretRef"]["name"])
            env.update(dict.fromkeys(secret["data"], "<secret>"))
    return env


# ---- rendering and schemas -----------------------------------------------------------


def test_every_overlay_renders_the_gateway_and_its_engines(rendered: tuple[str, list[Obj]]):
    target, objects = rendered
    kinds = {o["kind"] for o in objects}
    assert {
        "Namespace",
        "ServiceAccount",
        "ConfigMap",
        "Secret",
        "Job",
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "PodMonitor",
    } <= kinds
    assert [w["metadata"]["name"] for w in workloads(objects) if is_gateway(w)] == [
        "tiergate-gateway"
    ]
    engines = [w for w in workloads(objects) if is_engine(w)]
    assert (len(engines) > 0) == (target != "base"), target
    for obj in objects:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == "tiergate", obj["metadata"]["name"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "tiergate"


def test_every_object_is_valid_for_kubernetes_1_30(rendered: tuple[str, list[Obj]]):
    _, objects = rendered
    checked = 0
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue  # test_podmonitors_scrape_what_prometheus_yml_scrapes
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {exc.message}")
        checked += 1
    assert checked >= len(objects) - 2


def test_the_validation_rejects_a_broken_manifest():
    """A negative control: the same validator refuses a typo and a wrong type."""
    deployment = named(render("base"), "Deployment", "tiergate-gateway")
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "two"
    for broken in (typo, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_the_renderer_refuses_what_it_does_not_render(tmp_path: Path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\nreplicas: [{name: x}]\n")
    with pytest.raises(KustomizeError, match="replicas"):
        build(tmp_path)


def test_yamllint_passes_on_everything_under_deploy():
    paths = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yml", ".yaml"))
    assert any(p.parent.name == "compose" for p in paths)
    result = yamllint(paths)
    errors = [line for line in result.stdout.splitlines() if "[error]" in line]
    assert result.returncode == 0 and not errors, result.stdout + result.stderr


# ---- the gateway against the code --------------------------------------------------------


def test_gateway_and_job_variables_are_gateway_settings(rendered: tuple[str, list[Obj]]):
    _, objects = rendered
    known = gateway_settings()
    for workload in workloads(objects):
        for container in containers(workload):
            if not tiergate_image(container) or is_engine(workload):
                continue
            env = container_env(objects, container)
            unknown = {k for k in env if k.startswith("TIERGATE_")} - known
            assert not unknown, f"{workload['metadata']['name']}: not settings: {unknown}"


def test_engine_variables_are_engine_plugin_settings(rendered: tuple[str, list[Obj]]):
    _, objects = rendered
    known = engine_settings()
    assert {"TIERGATE_POLICY", "TIERGATE_PROFILE"} <= known
    for workload in workloads(objects):
        if not is_engine(workload):
            continue
        for container in containers(workload):
            env = container_env(objects, container)
            unknown = {k for k in env if k.startswith("TIERGATE_")} - known
            assert not unknown, f"{workload['metadata']['name']}: not settings: {unknown}"


def test_probes_and_ports_match_the_gateway():
    objects = render("base")
    routes = gateway_routes()
    assert {LIVENESS, READINESS} <= routes
    pod = pod_spec(named(objects, "Deployment", "tiergate-gateway"))
    assert pod is not None
    gateway = next(c for c in pod["containers"] if c["name"] == "gateway")
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert ports["http"] == int(option(gateway["args"], "--port") or 0)
    assert option(gateway["args"], "--host") == "0.0.0.0"
    assert "--no-emulated" in gateway["args"]
    assert gateway["readinessProbe"]["httpGet"]["path"] == READINESS
    assert gateway["livenessProbe"]["httpGet"]["path"] == LIVENESS
    assert gateway["startupProbe"]["httpGet"]["path"] == LIVENESS
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert gateway[probe]["httpGet"]["port"] == "http"
    # the operator listener: every interface of the pod, on the port named `metrics`
    env = container_env(objects, gateway)
    host, _, port = env["TIERGATE_METRICS_ADDR"].rpartition(":")
    assert host == "0.0.0.0" and int(port) == ports["metrics"] == metrics_port()
    # drain: the pod's grace period covers the delay and the drain
    delay = float(env["TIERGATE_SHUTDOWN_DELAY_S"]) + float(env["TIERGATE_SHUTDOWN_DRAIN_S"])
    assert pod["terminationGracePeriodSeconds"] > delay


def test_the_metrics_port_is_for_prometheus_only():
    objects = render("base")
    service = named(objects, "Service", "tiergate")
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    policy = named(objects, "NetworkPolicy", "tiergate-gateway")
    for rule in policy["spec"]["ingress"]:
        ports = {p["port"] for p in rule["ports"]}
        if "metrics" in ports:
            sources = rule.get("from", [])
            assert sources and all(set(s) == {"namespaceSelector"} for s in sources), rule
        else:
            assert ports == {"http"}


def test_the_limits_share_covers_every_process_the_hpa_may_run():
    objects = render("base")
    config = named(objects, "ConfigMap", "tiergate-config")["data"]
    hpa = named(objects, "HorizontalPodAutoscaler", "tiergate-gateway")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "tiergate-gateway"
    share = int(config["TIERGATE_LIMITS_SHARE"])
    assert share == int(config["TIERGATE_WORKERS"]) * hpa["maxReplicas"]


def test_secret_keys_and_references_resolve(rendered: tuple[str, list[Obj]]):
    _, objects = rendered
    template = env_assignments(K8S / "base" / "secrets.env.example")
    secret = named(objects, "Secret", "tiergate-secrets")
    assert (
        set(secret["data"])
        == set(template)
        == {
            "TIERGATE_SECRET",
            "TIERGATE_SECRET_PREVIOUS",
            "TIERGATE_ADMIN_KEY",
            "TIERGATE_DATABASE_URL",
        }
    )
    for workload in workloads(objects):
        pod = pod_spec(workload)
        assert pod is not None
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                named(objects, "ConfigMap", volume["configMap"]["name"])
        for container in containers(workload):
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    assert ref["key"] in named(objects, "Secret", ref["name"])["data"]
            container_env(objects, container)  # every envFrom source exists


def test_selectors_select_pods(rendered: tuple[str, list[Obj]]):
    target, objects = rendered
    for workload in workloads(objects):
        if workload["kind"] != "Job":
            selector = workload["spec"]["selector"]["matchLabels"]
            assert selects(selector, pod_labels(workload)), workload["metadata"]["name"]
    for kind in ("Service", "PodDisruptionBudget", "NetworkPolicy", "PodMonitor"):
        for obj in by_kind(objects, kind):
            spec = obj["spec"]
            selector = (
                spec["selector"]
                if kind == "Service"
                else spec.get("podSelector", spec.get("selector", {})).get("matchLabels", {})
            )
            pods = selected_pods(objects, selector)
            if target == "base" and selector.get("app.kubernetes.io/component") == "engine":
                continue  # base has no engines: the overlays do
            assert pods, f"{kind} {obj['metadata']['name']} selects no pod"
            port_names = {
                p["name"] for w in pods for c in containers(w) for p in c.get("ports", [])
            }
            wanted = (
                [p["targetPort"] for p in spec.get("ports", [])]
                + [p["port"] for r in spec.get("ingress", []) for p in r.get("ports", [])]
                + [e["port"] for e in spec.get("podMetricsEndpoints", [])]
            )
            assert set(wanted) <= port_names, f"{kind} {obj['metadata']['name']}"


def test_the_migrate_job_and_the_wait_share_one_bootstrap():
    objects = render("base")
    job = named(objects, "Job", "tiergate-migrate")
    pod = pod_spec(job)
    assert pod is not None and pod["restartPolicy"] == "Never"
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    command = pod["containers"][0]["command"]
    assert command[-1].endswith("/bootstrap.sh")
    bootstrap = named(objects, "ConfigMap", "tiergate-bootstrap")["data"]
    assert bootstrap["bootstrap.sh"] == (DEPLOY / "compose" / "bootstrap.sh").read_text()
    gateway = pod_spec(named(objects, "Deployment", "tiergate-gateway"))
    assert gateway is not None
    wait = gateway["initContainers"][0]
    assert Path(wait["command"][-1]).name in bootstrap


# ---- engines -------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_backends_are_the_overlays_engines(overlay: str):
    objects = render(overlay)
    listed = named(objects, "ConfigMap", "tiergate-backends")["data"]["backends.txt"]
    source = K8S / "overlays" / overlay / "backends.txt"
    assert listed == source.read_text()
    backends = read_backends(source)
    engines = {pod_labels(w)["tiergate.io/backend"]: w for w in workloads(objects) if is_engine(w)}
    assert [b.name for b in backends] == list(engines)
    services = {s["metadata"]["name"]: s for s in by_kind(objects, "Service")}
    for backend in backends:
        assert backend.kind in backend_kinds()
        assert backend.profile in known_profiles()
        engine = engines[backend.name]
        assert pod_labels(engine)["tiergate.io/hardware"]
        service = services[backend.host]
        assert selects(service["spec"]["selector"], pod_labels(engine))
        assert backend.port in [p["port"] for p in service["spec"]["ports"]]
        (container,) = containers(engine)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert int(option(container["args"], "--port") or 0) == ports["http"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        if backend.kind == "emulated":
            assert option(container["args"], "--profile") == backend.profile
            assert option(container["args"], "--model") == backend.model
            probe_paths = {container[p]["httpGet"]["path"] for p in ("readinessProbe",)}
            assert probe_paths == {ENGINE_HEALTH} and ENGINE_HEALTH in engine_sim_routes()
        else:
            assert env["TIERGATE_PROFILE"] == backend.profile
            assert container["args"][0] == backend.model
            assert option(container["args"], "--scheduler-cls") == SCHEDULER_CLS[backend.kind]


@pytest.mark.parametrize(
    ("overlay", "resource"), [("nvidia", "nvidia.com/gpu"), ("ascend", "huawei.com/Ascend910")]
)
def test_accelerator_engines_ask_for_their_device(overlay: str, resource: str):
    engines = [w for w in workloads(render(overlay)) if is_engine(w)]
    assert engines
    for engine in engines:
        (container,) = containers(engine)
        assert container["resources"]["limits"][resource] == 1
        assert engine["spec"]["strategy"]["type"] == "Recreate"
        module, _, cls = option(container["args"], "--scheduler-cls").rpartition(".")  # type: ignore[union-attr]
        assert hasattr(importlib.import_module(module), cls)


def test_podmonitors_scrape_what_prometheus_yml_scrapes():
    """The PodMonitors (no CRD schema here) against deploy/prometheus/kubernetes.yml: the same
    job names, ports, and the engine labels the dashboards join on."""
    shipped = DEPLOY / "prometheus" / "kubernetes.yml"
    if not shipped.is_file():
        pytest.skip("deploy/prometheus/kubernetes.yml not written yet")
    jobs = {j["job_name"]: j for j in yaml.safe_load(shipped.read_text())["scrape_configs"]}
    objects = render("emulated")
    monitors = by_kind(objects, "PodMonitor")
    assert {m["apiVersion"] for m in monitors} == {"monitoring.coreos.com/v1"}
    seen = set()
    for monitor in monitors:
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert set(endpoint) <= {
            "port",
            "path",
            "interval",
            "relabelings",
            "metricRelabelings",
        }
        relabel = endpoint["relabelings"]
        job = next(r["replacement"] for r in relabel if r["targetLabel"] == "job")
        seen.add(job)
        expected = jobs[job]
        port = next(
            r["regex"]
            for r in expected["relabel_configs"]
            if r.get("source_labels") == ["__meta_kubernetes_pod_container_port_name"]
        )
        assert endpoint["port"] == port and endpoint["path"] == "/metrics"
        wanted = {
            r["target_label"]: r["source_labels"]
            for r in expected["relabel_configs"]
            if r.get("target_label")
        }
        ours = {r["targetLabel"]: r.get("sourceLabels") for r in relabel}
        for label, sources in wanted.items():
            if label != "namespace":  # the Prometheus Operator adds it itself
                assert ours[label] == sources, (job, label)
        keep = [
            {"source_labels": r["sourceLabels"], "regex": r["regex"], "action": r["action"]}
            for r in endpoint.get("metricRelabelings", [])
        ]
        assert keep == expected.get("metric_relabel_configs", [])
        assert selected_pods(objects, monitor["spec"]["selector"]["matchLabels"])
    assert seen == set(jobs)


# ---- images ----------------------------------------------------------------------------------


def test_images_are_the_projects_at_its_version(rendered: tuple[str, list[Obj]]):
    _, objects = rendered
    version = project_version()
    for workload in workloads(objects):
        for container in containers(workload):
            name, tag = split_image(container["image"])
            assert name in {GATEWAY_IMAGE, *ENGINE_IMAGES}, container["image"]
            assert tag == version, container["image"]
            assert (ROOT / ENGINE_IMAGES.get(name, "Dockerfile")).is_file()


# ---- the init container's wait, for real ----------------------------------------------------


@pytest.mark.slow
def test_wait_for_schema_passes_only_at_head(tmp_path: Path):
    script = K8S / "base" / "wait-for-schema.py"
    database = f"sqlite:///{tmp_path / 'tiergate.db'}"
    env = {**os.environ, "TIERGATE_DATABASE_URL": database, "PYTHONPATH": str(ROOT)}

    def wait() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), "--attempts", "1"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            cwd=tmp_path,
        )

    before = wait()
    assert before.returncode == 1 and "not migrated" in before.stdout
    from gateway.db import migrate

    migrate.upgrade(database)
    after = wait()
    assert after.returncode == 0, after.stdout + after.stderr
    assert "tiergate.db" not in before.stdout + after.stdout  # never the URL
