"""CI's dependency audit: ``pip-audit`` over the environment the tests run in, as a gate.

    python scripts/pip_audit_gate.py [--require]

The project has no lock file: the set CI locks in is what ``make install-dev`` resolved into
``.venv``, so that is what is audited (``pip-audit --local --skip-editable``: every installed
distribution but the project itself). pip-audit asks a vulnerability service about each
version: PyPI's JSON API first, then OSV if PyPI answered for none.

* A known vulnerability fails the gate (exit 1), whatever else happened.
* A service that cannot be reached (no network, a mirror without PyPI's JSON API, as on the
  project's own machines) audits nothing: the gate says so loudly and passes (exit 0), unless
  ``--require`` (or ``TIERGATE_PIP_AUDIT_REQUIRED=1``) makes an audit mandatory. CI must not
  fail because it is offline, and must not claim an audit it did not do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

SERVICES = ("pypi", "osv")
TIMEOUT_S = 600


@dataclass
class Verdict:
    """What one audit found; ``exit_code`` and ``lines`` are what the gate reports."""

    service: str
    audited: list[str] = field(default_factory=list)  # "name==version"
    skipped: list[str] = field(default_factory=list)  # "name: reason"
    vulnerable: list[str] = field(default_factory=list)  # "name==version: id (fix: ...)"
    error: str | None = None  # the audit did not run to a report

    @property
    def exit_code(self) -> int:
        return 1 if self.vulnerable else 0

    def lines(self) -> list[str]:
        if self.vulnerable:
            return [
                f"pip-audit ({self.service}): {len(self.vulnerable)} known vulnerabilit"
                f"{'y' if len(self.vulnerable) == 1 else 'ies'} in the installed dependencies:",
                *(f"  {v}" for v in self.vulnerable),
            ]
        if not self.audited:
            why = self.error or f"it knows none of the {len(self.skipped)} dependencies"
            return [f"pip-audit ({self.service}): nothing audited: {why}"]
        out = [f"pip-audit ({self.service}): no known vulnerability in {len(self.audited)} "]
        out[0] += f"audited dependencies ({len(self.skipped)} skipped)"
        out += [f"  skipped {s}" for s in self.skipped]
        return out


def verdict_of(service: str, report: dict[str, Any]) -> Verdict:
    """Sort a ``pip-audit --format json`` report into audited, skipped and vulnerable."""
    verdict = Verdict(service)
    for dep in report.get("dependencies", []):
        name = dep.get("name", "?")
        if "skip_reason" in dep:
            verdict.skipped.append(f"{name}: {dep['skip_reason']}")
            continue
        pinned = f"{name}=={dep.get('version', '?')}"
        verdict.audited.append(pinned)
        for vuln in dep.get("vulns", []):
            fixes = ", ".join(vuln.get("fix_versions", [])) or "none yet"
            verdict.vulnerable.append(f"{pinned}: {vuln.get('id', '?')} (fix: {fixes})")
    return verdict


def audit(service: str) -> Verdict:
    """Run pip-audit of this interpreter's environment against ``service``."""
    command = [
        sys.executable,
        "-m",
        "pip_audit",
        "--local",
        "--skip-editable",
        "--progress-spinner",
        "off",
        "--format",
        "json",
        "--vulnerability-service",
        service,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Verdict(service, error=f"no answer within {TIMEOUT_S} s")
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Verdict(service, error=f"pip-audit exited {done.returncode}: {last[:200]}")
    return verdict_of(service, report)


def gate(verdicts: Sequence[Verdict], *, required: bool) -> int:
    """The exit code: 1 on any vulnerability, or on no audit at all when one is required."""
    if any(v.vulnerable for v in verdicts):
        return 1
    if required and not any(v.audited for v in verdicts):
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--require",
        action="store_true",
        default=os.environ.get("TIERGATE_PIP_AUDIT_REQUIRED", "") == "1",
        help="fail when no vulnerability service could audit the dependencies",
    )
    args = parser.parse_args(argv)
    verdicts: list[Verdict] = []
    for service in SERVICES:
        verdict = audit(service)
        verdicts.append(verdict)
        print("\n".join(verdict.lines()), flush=True)
        if verdict.audited or verdict.vulnerable:
            break
    code = gate(verdicts, required=args.require)
    if not any(v.audited for v in verdicts):
        banner = "!" * 78
        print(
            f"{banner}\nDEPENDENCIES NOT AUDITED: no vulnerability service could be reached "
            f"({', '.join(SERVICES)}).\n"
            + ("Failing: an audit is required.\n" if code else "Passing anyway (offline); ")
            + ("" if code else "run `python scripts/pip_audit_gate.py --require` online.\n")
            + banner,
            file=sys.stderr,
            flush=True,
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
