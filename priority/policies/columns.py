"""Columnar views of queued requests for vectorized policies.

A decision over thousands of queued requests cannot afford thousands of attribute reads per
field. Static scheduling attributes (arrival, SLOs, weight, prompt length) never change, so they
are stored once per request in a numpy table; a decision gathers them with one fancy index and
reads only the two dynamic counters per request.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from priority.request import Request

ARRIVAL, TTFT, TPOT, DEADLINE, WEIGHT, PROMPT = range(6)
_computed = attrgetter("num_computed_tokens")
_outputs = attrgetter("num_output_tokens")
_request_id = attrgetter("request_id")


class RequestColumns:
    """Static per-request columns; unset SLO fields are ``inf`` (TTFT, deadline) or 0 (TPOT)."""

    def __init__(self, capacity: int = 1024) -> None:
        self._rows: dict[str, int] = {}
        self._data = np.empty((capacity, 6), dtype=np.float64)

    def _row_of(self, request: Request) -> int:
        row = len(self._rows)
        if row == self._data.shape[0]:
            self._data = np.concatenate([self._data, np.empty_like(self._data)])
        slo = request.slo
        self._data[row] = (
            request.arrival_s,
            slo.ttft_s if slo.ttft_s is not None else math.inf,
            slo.tpot_s if slo.tpot_s is not None else 0.0,
            slo.deadline_s if slo.deadline_s is not None else math.inf,
            request.weight,
            request.prompt_tokens,
        )
        self._rows[request.request_id] = row
        return row

    def _compact(self, live: Sequence[Request]) -> None:
        """Forget finished requests once the table is mostly stale."""
        rows = [self._rows[r.request_id] for r in live if r.request_id in self._rows]
        ids = [r.request_id for r in live if r.request_id in self._rows]
        self._data = np.concatenate([self._data[rows], np.empty((1024, 6))])
        self._rows = {rid: i for i, rid in enumerate(ids)}

    def gather(
        self, requests: Sequence[Request]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(static columns [n, 6], num_computed_tokens [n], num_output_tokens [n])."""
        n = len(requests)
        if len(self._rows) > 4 * n + 65536:
            self._compact(requests)
        rows_map = self._rows
        index = np.fromiter(
            map(rows_map.get, map(_request_id, requests), repeat(-1)), dtype=np.int64, count=n
        )
        missing = np.flatnonzero(index < 0)
        for i in missing:
            index[i] = self._row_of(requests[int(i)])
        static = self._data[index]
        computed = np.fromiter(map(_computed, requests), dtype=np.int64, count=n)
        outputs = np.fromiter(map(_outputs, requests), dtype=np.int64, count=n)
        return static, computed, outputs
