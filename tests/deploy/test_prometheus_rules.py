"""tiergate's Prometheus rules and scrape configuration (``deploy/prometheus/``), by promtool.

* ``promtool check rules`` and ``promtool check config`` accept them;
* ``promtool test rules`` runs the unit tests in ``deploy/prometheus/tests/`` and they pass;
* every alert is tested firing and tested not firing there;
* every alert has a severity, a summary, a description and a runbook that exists in
  ``docs/operations/alerts.md``;
* every metric a rule reads is one the code defines, or one a recording rule writes.

promtool comes from Debian's ``prometheus`` package (``.ci/prometheus.sh``). Without it these
tests skip with a reason, except under ``CI``, where they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from metric_names import ROOT, defined_metrics, exposed_names, metric_names, recorded_names

PROMETHEUS = ROOT / "deploy/prometheus"
RULE_FILES = sorted((PROMETHEUS / "rules").glob("*.yml"))
TEST_FILES = sorted((PROMETHEUS / "tests").glob("*.yml"))
ALERTS_DOC = ROOT / "docs/operations/alerts.md"
SEVERITIES = {"page", "ticket"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: bash .ci/prometheus.sh installs it")
        pytest.skip("promtool is missing (apt-get install prometheus, or .ci/prometheus.sh)")
    return found


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=300
    )


def rules() -> Iterator[dict[str, Any]]:
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            yield from group["rules"]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


# ---- promtool -------------------------------------------------------------------------------


def test_there_are_rules_and_tests() -> None:
    assert RULE_FILES and TEST_FILES
    assert len({a["alert"] for a in alerts()}) >= 10


def test_promtool_checks_the_rules() -> None:
    result = run("check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_checks_the_scrape_config() -> None:
    result = run("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert {job["job_name"] for job in config["scrape_configs"]} == {
        "tiergate-gateway",
        "tiergate-engines",
    }
    assert config["rule_files"] == ["rules/*.yml"]


def test_the_kubernetes_variant_has_the_same_jobs() -> None:
    """Debian's promtool has no Kubernetes discovery, so this one is read, not checked."""
    fleet = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    kube = yaml.safe_load((PROMETHEUS / "kubernetes.yml").read_text())
    assert [j["job_name"] for j in kube["scrape_configs"]] == [
        j["job_name"] for j in fleet["scrape_configs"]
    ]
    assert kube["rule_files"] == fleet["rule_files"]
    engines = next(j for j in kube["scrape_configs"] if j["job_name"] == "tiergate-engines")
    targets = {r.get("target_label") for r in engines["relabel_configs"]}
    assert {"backend", "hardware", "instance"} <= targets  # what the dashboards group by


def test_promtool_unit_tests_pass() -> None:
    result = run("test", "rules", *(str(p.relative_to(PROMETHEUS)) for p in TEST_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(TEST_FILES)


def test_the_unit_tests_catch_a_broken_rule(tmp_path: Path) -> None:
    """promtool test rules is not vacuous here: a threshold changed in a copy fails its test."""
    rules_dir = tmp_path / "rules"
    shutil.copytree(PROMETHEUS / "rules", rules_dir)
    alerts_file = rules_dir / "tiergate-alerts.yml"
    text = alerts_file.read_text()
    assert "tiergate_usage_buffered_records) > 10000" in text
    alerts_file.write_text(
        text.replace(
            "tiergate_usage_buffered_records) > 10000", "tiergate_usage_buffered_records) > 1e9"
        )
    )
    tests_dir = tmp_path / "tests"
    shutil.copytree(PROMETHEUS / "tests", tests_dir)
    result = subprocess.run(
        [promtool(), "test", "rules", "tests/gateway.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "alertname: TiergateUsageBacklog" in output, output


# ---- every alert is tested, firing and not ------------------------------------------------


def alert_tests() -> dict[str, dict[str, int]]:
    """``{alert: {"firing": n, "quiet": n}}`` over every ``alert_rule_test`` case."""
    counts: dict[str, dict[str, int]] = {}
    for path in TEST_FILES:
        document = yaml.safe_load(path.read_text())
        assert document["rule_files"] == ["../rules/*.yml"], path
        for group in document["tests"]:
            for case in group.get("alert_rule_test", []):
                seen = counts.setdefault(case["alertname"], {"firing": 0, "quiet": 0})
                seen["firing" if case.get("exp_alerts") else "quiet"] += 1
    return counts


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    counts = alert_tests()
    for name in sorted({a["alert"] for a in alerts()}):
        assert counts.get(name, {}).get("firing"), f"{name}: no test where it fires"
        assert counts.get(name, {}).get("quiet"), f"{name}: no test where it stays quiet"
    unknown = set(counts) - {a["alert"] for a in alerts()}
    assert not unknown, f"tests for alerts that do not exist: {unknown}"


def test_every_burn_rate_window_pair_is_tested_firing() -> None:
    """Each of the four window pairs of each burn-rate alert fires in some test."""
    fired: set[tuple[str, str]] = set()
    for path in TEST_FILES:
        for group in yaml.safe_load(path.read_text())["tests"]:
            for case in group.get("alert_rule_test", []):
                for alert in case.get("exp_alerts") or []:
                    labels = alert["exp_labels"]
                    if "long_window" in labels:
                        fired.add((labels["objective"], labels["long_window"]))
    expected = {(o, w) for o in ("ttft", "tpot") for w in ("1h", "6h", "1d", "3d")}
    assert expected <= fired, sorted(expected - fired)


# ---- annotations and runbooks ---------------------------------------------------------------


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the markdown's headings (lowercased, punctuation dropped)."""
    anchors = set()
    for line in markdown.splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if match:
            title = match.group(1).strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_every_alert_has_severity_summary_description_and_runbook() -> None:
    anchors = _anchors(ALERTS_DOC.read_text())
    for alert in alerts():
        name = alert["alert"]
        assert alert["labels"]["severity"] in SEVERITIES, name
        annotations = alert["annotations"]
        assert annotations["summary"].strip() and annotations["description"].strip(), name
        url = annotations["runbook_url"]
        assert url == f"docs/operations/alerts.md#{name.lower()}", name
        assert name.lower() in anchors, f"{name}: no section in docs/operations/alerts.md"


def test_the_runbook_sections_are_alerts() -> None:
    """No runbook is left for an alert that was removed or renamed."""
    names = {a["alert"].lower() for a in alerts()}
    documented = {a for a in _anchors(ALERTS_DOC.read_text()) if a.startswith("tiergate")}
    assert documented == names


# ---- metric names ---------------------------------------------------------------------------


def test_every_metric_a_rule_reads_is_defined() -> None:
    known = exposed_names(defined_metrics()) | recorded_names(RULE_FILES)
    unknown = {
        (rule.get("alert") or rule.get("record"), name)
        for rule in rules()
        for name in metric_names(rule["expr"])
        if name not in known
    }
    assert not unknown, sorted(unknown)


def test_the_unit_tests_feed_real_metric_names() -> None:
    """The series the unit tests make up are named as the code exports them."""
    known = exposed_names(defined_metrics())
    for path in TEST_FILES:
        for group in yaml.safe_load(path.read_text())["tests"]:
            for series in group.get("input_series", []):
                name = series["series"].split("{", 1)[0]
                assert name in known, f"{path.name}: {name}"
