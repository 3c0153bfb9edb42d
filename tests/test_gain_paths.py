"""The TDG's two counts — plain Python for a few tokens, numpy for many — agree exactly."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from priority.gain import SCALAR_TOKENS, _on_time_scalar, _on_time_vector
from priority.request import SLO

seconds = st.floats(min_value=0.0, max_value=50.0, allow_nan=False)
objective = st.floats(min_value=1e-3, max_value=5.0)
pace = st.one_of(st.none(), st.tuples(objective, objective))  # (TTFT, TPOT) go together


@settings(max_examples=400, deadline=None)
@given(
    arrival=seconds,
    paced=pace,
    deadline=st.one_of(st.none(), st.floats(min_value=1e-3, max_value=20.0)),
    gaps=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=SCALAR_TOKENS),
    start=st.floats(min_value=0.0, max_value=10.0),
    buffered=st.booleans(),
)
def test_the_scalar_count_is_the_vector_count(
    arrival: float,
    paced: tuple[float, float] | None,
    deadline: float | None,
    gaps: list[float],
    start: float,
    buffered: bool,
) -> None:
    assume(paced is not None or deadline is not None)  # an SLO needs one or the other
    ttft, tpot = paced if paced is not None else (None, None)
    slo = SLO(ttft_s=ttft, tpot_s=tpot, deadline_s=deadline)
    times = list(arrival + start + np.cumsum(gaps))
    expected = _on_time_vector(arrival, slo, times, buffered)
    assert _on_time_scalar(arrival, slo, times, buffered) == expected
    assert _on_time_scalar(arrival, slo, np.asarray(times), buffered) == expected


def test_a_token_exactly_at_its_due_time_is_late_on_both_paths() -> None:
    slo = SLO(ttft_s=1.0, tpot_s=0.5)
    times = [1.0, 1.5, 1.9999]  # due 1.0, 1.5, 2.0: the first two land on their due time
    assert _on_time_scalar(0.0, slo, times, True) == _on_time_vector(0.0, slo, times, True)
    assert _on_time_scalar(0.0, slo, times, True) == (False, 1)
