"""Command-line value parsers shared by the simulator sweeps (``policy_sweep``, ``goodput``).

``bench/`` is no package: a script puts its own directory on ``sys.path`` and imports this.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence


def csv(value: str) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``."""
    return tuple(v.strip() for v in value.split(",") if v.strip())


def names(value: str, known: Sequence[str], what: str) -> tuple[str, ...]:
    """Comma-separated names, each one of ``known`` (at least one)."""
    given = csv(value)
    unknown = [n for n in given if n not in known]
    if unknown or not given:
        raise argparse.ArgumentTypeError(
            f"unknown {what} {', '.join(unknown)}; known: {', '.join(known)}"
        )
    return given


def load_multiples(value: str) -> tuple[float, ...]:
    """Comma-separated positive, finite multiples of capacity."""
    try:
        loads = tuple(float(v) for v in csv(value))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {value!r}"
        ) from None
    if not loads or any(not (x > 0 and math.isfinite(x)) for x in loads):
        raise argparse.ArgumentTypeError("loads must be positive numbers")
    return loads
