"""Properties of the shared length distribution every layer refines (priority/lengths)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from priority.lengths import DEFAULT_LEVELS, OVERRUN_GROWTH, LengthDistribution


@st.composite
def distributions(draw: st.DrawFn) -> LengthDistribution:
    levels = sorted(draw(st.sets(st.floats(0.01, 0.99), min_size=1, max_size=9)))
    steps = draw(st.lists(st.floats(0, 500), min_size=len(levels), max_size=len(levels)))
    values, total = [], 1.0
    for s in steps:
        total += s
        values.append(total)
    cap = draw(st.none() | st.integers(1, 5000))
    return LengthDistribution(tuple(levels), tuple(values), max_tokens=cap)


@given(distributions(), st.floats(0.01, 0.99), st.floats(0.01, 0.99), st.integers(0, 4000))
def test_bound_is_monotone_in_q(d: LengthDistribution, q1: float, q2: float, g: int) -> None:
    lo, hi = sorted((q1, q2))
    assert d.bound(lo, g) <= d.bound(hi, g)


@given(distributions(), st.floats(0.01, 0.99), st.integers(0, 4000), st.integers(0, 4000))
def test_bound_is_monotone_in_generated_and_above_it(
    d: LengthDistribution, q: float, g1: int, g2: int
) -> None:
    lo, hi = sorted((g1, g2))
    assert d.bound(q, lo) <= d.bound(q, hi)
    assert d.bound(q, lo) >= lo + 1


@given(distributions())
def test_wire_round_trip(d: LengthDistribution) -> None:
    flat = d.to_wire()
    assert all(isinstance(x, float) for x in flat)
    assert LengthDistribution.from_wire(flat, max_tokens=d.max_tokens) == d


def test_overrun_rule_grows_geometrically_and_respects_max_tokens() -> None:
    d = LengthDistribution(DEFAULT_LEVELS, (5, 10, 20, 40, 80, 100, 150))
    assert d.bound(0.95, 150) == 150 + math.ceil(OVERRUN_GROWTH * 150)
    assert d.bound(0.95, 1000) == 1500
    capped = LengthDistribution(DEFAULT_LEVELS, d.values, max_tokens=200)
    assert capped.bound(0.95, 150) == 200
    assert capped.bound(0.95, 250) == 251  # past the cap: still one token to come


@pytest.mark.parametrize("flat", [[], [0.5], [0.5, 10, 0.4, 20], [1.5, 10], [0.5, 0]])
def test_malformed_wire_is_rejected(flat: list[float]) -> None:
    with pytest.raises(ValueError):
        LengthDistribution.from_wire(flat)
