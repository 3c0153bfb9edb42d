"""The CI dependency-audit gate (scripts/pip_audit_gate.py) decides on pip-audit's reports: a
vulnerability fails it, an unreachable service passes it loudly unless an audit is required.
No network: the reports are pip-audit's JSON format, written out here."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests.scripts_loader import load_script


@pytest.fixture(scope="module")
def gate() -> ModuleType:
    return load_script("scripts/pip_audit_gate.py")


CLEAN = {"dependencies": [{"name": "fastapi", "version": "0.165.0", "vulns": []}]}
VULNERABLE = {
    "dependencies": [
        {"name": "fastapi", "version": "0.165.0", "vulns": []},
        {
            "name": "h11",
            "version": "0.14.0",
            "vulns": [{"id": "GHSA-vqfr-h8mv-ghfj", "fix_versions": ["0.16.0"]}],
        },
        {"name": "torch", "skip_reason": "Dependency not found on PyPI"},
    ]
}
OFFLINE = {"dependencies": [{"name": "fastapi", "skip_reason": "Dependency not found on PyPI"}]}


def test_a_vulnerability_fails_the_gate_and_names_the_fix(gate: ModuleType) -> None:
    verdict = gate.verdict_of("pypi", VULNERABLE)
    assert verdict.audited == ["fastapi==0.165.0", "h11==0.14.0"]
    assert verdict.vulnerable == ["h11==0.14.0: GHSA-vqfr-h8mv-ghfj (fix: 0.16.0)"]
    assert verdict.exit_code == 1 and gate.gate([verdict], required=False) == 1
    assert "1 known vulnerability" in verdict.lines()[0]


def test_a_clean_audit_passes(gate: ModuleType) -> None:
    verdict = gate.verdict_of("pypi", CLEAN)
    assert gate.gate([verdict], required=True) == 0
    assert "no known vulnerability in 1 audited" in verdict.lines()[0]


def test_nothing_audited_passes_loudly_unless_required(gate: ModuleType) -> None:
    offline = [gate.verdict_of("pypi", OFFLINE), gate.Verdict("osv", error="no network")]
    assert gate.gate(offline, required=False) == 0
    assert gate.gate(offline, required=True) == 1
    assert "nothing audited" in offline[0].lines()[0] and "no network" in offline[1].lines()[0]


def test_main_tries_osv_when_pypi_audits_nothing(
    gate: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reports: dict[str, Any] = {"pypi": OFFLINE, "osv": VULNERABLE}
    asked: list[str] = []

    def fake_audit(service: str) -> Any:
        asked.append(service)
        return gate.verdict_of(service, reports[service])

    monkeypatch.setattr(gate, "audit", fake_audit)
    assert gate.main([]) == 1 and asked == ["pypi", "osv"]
    reports["osv"] = OFFLINE
    assert gate.main([]) == 0
    assert "DEPENDENCIES NOT AUDITED" in capsys.readouterr().err
    assert gate.main(["--require"]) == 1
    asked.clear()
    reports["pypi"] = CLEAN
    assert gate.main([]) == 0 and asked == ["pypi"]  # PyPI answered: OSV not needed
