"""The local stack's Prometheus configuration, made from ``deploy/prometheus/prometheus.yml``.

The shipped file is written for a fleet (service discovery, the ports of a pod); here every
process is on 127.0.0.1 at ports chosen at start. So its jobs are kept by name, with what they
say about how to scrape (path, scheme, metric relabelling), and their targets are replaced by
the stack's own, as static targets carrying the labels discovery would have added (``backend``,
``hardware``, ``instance``). The rule files are used as they are, by absolute path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DISCOVERY_KEYS = ("relabel_configs", "scrape_interval", "scrape_timeout")
"""Job keys dropped along with service discovery: relabelling reads discovery's ``__meta_*``
labels, and a job's own interval would override the one chosen for this stack."""


@dataclass(frozen=True)
class Target:
    """One scrape target and the labels it carries."""

    address: str
    labels: Mapping[str, str] = field(default_factory=dict)


def job_role(name: str) -> str:
    """Which of the stack's processes a job of the shipped file scrapes, by its name
    (``other``: none here; the job is left out)."""
    lowered = name.lower()
    if "engine" in lowered or "vllm" in lowered:
        return "engines"
    if "prometheus" in lowered:
        return "prometheus"
    if "gateway" in lowered or "tiergate" in lowered:
        return "gateways"
    return "other"


def load_template(path: Path) -> dict[str, Any]:
    """The shipped configuration (YAML; PyYAML is needed only here)."""
    import yaml  # a development dependency; the stack runs from a checkout

    document = yaml.safe_load(path.read_text())
    if not isinstance(document, dict):
        raise ValueError(f"{path}: not a Prometheus configuration")
    return document


def default_template() -> dict[str, Any]:
    """What the stack scrapes when no shipped file is given."""
    return {
        "scrape_configs": [
            {"job_name": "tiergate-gateway"},
            {"job_name": "tiergate-engines"},
        ]
    }


def local_config(
    template: Mapping[str, Any],
    targets: Mapping[str, Sequence[Target]],
    *,
    scrape_interval: str,
    evaluation_interval: str,
    rule_files: Sequence[Path],
) -> dict[str, Any]:
    """The configuration the stack's Prometheus runs: ``template``'s jobs on ``targets`` (by
    role: ``gateways``, ``engines``, ``prometheus``), this stack's intervals and rules."""
    jobs: list[dict[str, Any]] = []
    for job in template.get("scrape_configs") or []:
        role = job_role(str(job["job_name"]))
        local = {
            key: value
            for key, value in job.items()
            if not key.endswith("_sd_configs") and key not in DISCOVERY_KEYS
        }
        local["static_configs"] = [
            {"targets": [t.address], "labels": dict(t.labels)} for t in targets.get(role, ())
        ]
        if local["static_configs"]:
            jobs.append(local)
    roles = {job_role(str(j["job_name"])) for j in jobs}
    if "prometheus" not in roles and targets.get("prometheus"):
        jobs.append(
            {
                "job_name": "prometheus",
                "static_configs": [{"targets": [t.address]} for t in targets["prometheus"]],
            }
        )
    glob = dict(template.get("global") or {})
    glob.update(scrape_interval=scrape_interval, evaluation_interval=evaluation_interval)
    glob["scrape_timeout"] = scrape_interval  # may not exceed the interval
    return {
        "global": glob,
        "rule_files": [str(p.resolve()) for p in rule_files],
        "scrape_configs": jobs,
    }
