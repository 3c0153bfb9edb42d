"""Short form of bench/head_limits.py: both protocols serve every request, the schema holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "head_limits.py"


def test_a_short_run_serves_every_request_and_prints_the_schema() -> None:
    result = subprocess.run(
        [sys.executable, str(BENCH), "--requests", "50", "--blocks", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr  # a protocol closing the connection fails it
    row = json.loads(result.stdout)
    assert list(row) == [
        "requests",
        "base_us_per_request",
        "limited_us_per_request",
        "added_us_per_request",
    ]
    assert row["requests"] == 100
    assert row["base_us_per_request"] > 0 and row["limited_us_per_request"] > 0
    added = row["limited_us_per_request"] - row["base_us_per_request"]
    assert abs(row["added_us_per_request"] - added) < 0.02
