"""Trace files: the CSV contract, named public traces, and where the shared data lives.

Contract (header required, extra columns ignored):

* required: ``arrival_s`` (seconds, >= 0, non-decreasing), ``prompt_tokens`` and
  ``output_tokens`` (integers >= 1);
* optional per-row overrides: ``tenant``, ``tier``, ``weight``, ``ttft_slo_ms``, ``tpot_slo_ms``,
  ``deadline_ms``. A blank cell means "use the workload's default assignment". In the two
  streaming-SLO columns ``none`` (or ``inf``) removes the streaming SLO for that row, making it a
  deadline-only request (it then needs a ``deadline_ms``);
* optional request kinds and workflows: ``kind`` (``latency|deadline|compound|
  best-effort``; blank = latency), ``workflow_id``, ``stage`` (0, 1, …) and ``think_ms``. The
  calls of one workflow run in stage order: stage 0 arrives at its ``arrival_s``, stage k > 0
  arrives ``think_ms`` after stage k − 1 finished (its own ``arrival_s`` is ignored). A compound
  row's ``deadline_ms`` is the workflow's end-to-end deadline from stage 0's arrival.

Unsorted arrivals are rejected, not sorted: a trace is a time series, and disorder usually means
a wrong column or a concatenation mistake that silently sorting would hide.

Named traces resolve inside the shared data directory: ``$TIERGATE_SHARED_DATA`` if set, else
``../shared/data`` next to the repository (or the working directory). ``arxiv`` holds lengths
only (``num_prefill_tokens``, ``num_decode_tokens``) and needs synthetic arrivals.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

SHARED_DATA_ENV = "TIERGATE_SHARED_DATA"
NAMED_TRACES: dict[str, str] = {
    "azure_conv": "azure_conv.csv",
    "azure_code": "azure_code.csv",
    "mooncake_conv": "mooncake_conv.csv",
    "arxiv": "arxiv_summarization_lengths.csv",
}
LENGTH_ONLY_COLUMNS: dict[str, tuple[str, str]] = {
    "arxiv": ("num_prefill_tokens", "num_decode_tokens"),
}
REQUIRED_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
OVERRIDE_COLUMNS = ("tenant", "tier", "weight", "ttft_slo_ms", "tpot_slo_ms", "deadline_ms")
WORKFLOW_COLUMNS = ("kind", "workflow_id", "stage", "think_ms")
_NO_SLO = {"none", "inf"}


@dataclass(frozen=True, eq=False)
class Trace:
    """A parsed trace. Override arrays hold NaN / None where the cell was blank."""

    name: str
    arrival_s: FloatArray | None
    """None for a lengths-only trace (pair it with synthetic arrivals)."""
    prompt_tokens: IntArray
    output_tokens: IntArray
    tenant: list[str | None] | None = None
    tier: list[str | None] | None = None
    weight: FloatArray | None = None
    ttft_slo_s: FloatArray | None = None
    """Seconds; ``inf`` = no streaming SLO for that row."""
    tpot_slo_s: FloatArray | None = None
    deadline_s: FloatArray | None = None
    kind: list[str | None] | None = None
    workflow_id: list[str | None] | None = None
    stage: IntArray | None = None
    think_s: FloatArray | None = None
    """Seconds after the previous stage finished (0 where blank)."""

    def __len__(self) -> int:
        return int(self.prompt_tokens.size)

    @property
    def lengths_only(self) -> bool:
        return self.arrival_s is None


def shared_data_dir() -> Path:
    """The shared public-data directory (holding ``traces/``)."""
    env = os.environ.get(SHARED_DATA_ENV)
    if env:
        path = Path(env)
        if not path.is_dir():
            raise FileNotFoundError(f"${SHARED_DATA_ENV} points to {path}, not a directory")
        return path
    repo_root = Path(__file__).resolve().parents[2]
    for base in (repo_root, Path.cwd()):
        candidate = base.parent / "shared" / "data"
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"shared data not found next to {repo_root} or {Path.cwd()}; set ${SHARED_DATA_ENV}"
    )


BUNDLED_TRACES: dict[str, str] = {"azure_conv_20min": "azure_conv_20min.csv"}
"""Traces shipped inside the package (``priority/sim/data``), usable without the shared data."""


def resolve_trace(name_or_path: str | Path) -> Path:
    """A bundled trace (``azure_conv_20min``), a named shared-data trace or a CSV path."""
    path = Path(name_or_path)
    if path.suffix == ".csv" or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"trace file {path} does not exist")
        return path
    name = str(name_or_path)
    if name in BUNDLED_TRACES:
        return Path(__file__).resolve().parent / "data" / BUNDLED_TRACES[name]
    if name not in NAMED_TRACES:
        known = ", ".join([*BUNDLED_TRACES, *NAMED_TRACES])
        raise ValueError(f"unknown trace {name!r}: give a CSV path or one of {known}")
    return shared_data_dir() / "traces" / NAMED_TRACES[name]


def load_trace(name_or_path: str | Path) -> Trace:
    """Parse a trace by name or path, checking the contract (``ValueError`` on violations)."""
    path = resolve_trace(name_or_path)
    key = str(name_or_path)
    name = key if key in NAMED_TRACES else path.stem
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows or not any(cell.strip() for cell in rows[0]):
        raise ValueError(f"trace {path}: empty file or missing header")
    header = [cell.strip() for cell in rows[0]]
    body = [row for row in rows[1:] if any(cell.strip() for cell in row)]
    if not body:
        raise ValueError(f"trace {path}: no data rows")
    parser = _Columns(path, header, body)
    if key in LENGTH_ONLY_COLUMNS:
        prompt_col, output_col = LENGTH_ONLY_COLUMNS[key]
        parser.require((prompt_col, output_col))
        return Trace(
            name=name,
            arrival_s=None,
            prompt_tokens=parser.tokens(prompt_col),
            output_tokens=parser.tokens(output_col),
        )
    parser.require(REQUIRED_COLUMNS)
    return Trace(
        name=name,
        arrival_s=parser.arrivals("arrival_s"),
        prompt_tokens=parser.tokens("prompt_tokens"),
        output_tokens=parser.tokens("output_tokens"),
        tenant=parser.optional_text("tenant"),
        tier=parser.optional_text("tier"),
        weight=parser.optional_float("weight", scale=1.0),
        ttft_slo_s=parser.optional_float("ttft_slo_ms", scale=1e-3, allow_none=True),
        tpot_slo_s=parser.optional_float("tpot_slo_ms", scale=1e-3, allow_none=True),
        deadline_s=parser.optional_float("deadline_ms", scale=1e-3),
        kind=parser.kinds("kind"),
        workflow_id=parser.optional_text("workflow_id"),
        stage=parser.optional_count("stage"),
        think_s=parser.optional_count("think_ms", scale=1e-3),
    )


class _Columns:
    """Column access with error messages naming the file, line and column."""

    def __init__(self, path: Path, header: list[str], body: list[list[str]]) -> None:
        self.path = path
        self.header = header
        self.index = {name: i for i, name in enumerate(header)}
        self.body = body
        for line, row in enumerate(body, start=2):
            if len(row) != len(header):
                raise ValueError(
                    f"trace {path} line {line}: {len(row)} cells, header has {len(header)}"
                )

    def require(self, columns: tuple[str, ...]) -> None:
        missing = [c for c in columns if c not in self.index]
        if missing:
            raise ValueError(
                f"trace {self.path}: missing required column(s) {', '.join(missing)}; "
                f"found {', '.join(self.header)}"
            )

    def _cells(self, column: str) -> list[str]:
        i = self.index[column]
        return [row[i].strip() for row in self.body]

    def _error(self, line: int, column: str, message: str) -> ValueError:
        return ValueError(f"trace {self.path} line {line} column {column}: {message}")

    def _number(self, cell: str, line: int, column: str) -> float:
        try:
            value = float(cell)
        except ValueError:
            raise self._error(line, column, f"{cell!r} is not a number") from None
        if math.isnan(value):
            raise self._error(line, column, "NaN is not allowed")
        return value

    def tokens(self, column: str) -> IntArray:
        out = np.empty(len(self.body), dtype=np.int64)
        for k, cell in enumerate(self._cells(column)):
            line = k + 2
            value = self._number(cell, line, column)
            if not (math.isfinite(value) and value.is_integer()):
                raise self._error(line, column, f"{cell!r} is not a whole number of tokens")
            if value < 1:
                raise self._error(line, column, f"token counts must be >= 1, got {cell}")
            out[k] = int(value)
        return out

    def arrivals(self, column: str) -> FloatArray:
        out = np.empty(len(self.body), dtype=np.float64)
        previous = 0.0
        for k, cell in enumerate(self._cells(column)):
            line = k + 2
            value = self._number(cell, line, column)
            if not (math.isfinite(value) and value >= 0):
                raise self._error(line, column, f"arrival must be finite and >= 0, got {cell}")
            if k and value < previous:
                raise self._error(
                    line,
                    column,
                    f"arrivals must be non-decreasing ({value} after {previous} on line "
                    f"{line - 1}); sort the file by {column}",
                )
            out[k] = previous = value
        return out

    def optional_text(self, column: str) -> list[str | None] | None:
        if column not in self.index:
            return None
        return [cell or None for cell in self._cells(column)]

    def kinds(self, column: str) -> list[str | None] | None:
        from priority.request import REQUEST_KINDS

        cells = self.optional_text(column)
        if cells is None:
            return None
        for k, cell in enumerate(cells):
            if cell is not None and cell not in REQUEST_KINDS:
                raise self._error(
                    k + 2, column, f"{cell!r} is not one of {', '.join(REQUEST_KINDS)}"
                )
        return cells

    def optional_count(self, column: str, *, scale: float = 1.0) -> npt.NDArray[Any] | None:
        """A column of numbers >= 0 (blank = 0): whole numbers when ``scale`` is 1."""
        if column not in self.index:
            return None
        whole = scale == 1.0
        out = np.zeros(len(self.body), dtype=np.int64 if whole else np.float64)
        for k, cell in enumerate(self._cells(column)):
            if not cell:
                continue
            value = self._number(cell, k + 2, column)
            if not (math.isfinite(value) and value >= 0) or (whole and not value.is_integer()):
                kind = "a whole number >= 0" if whole else "a number >= 0"
                raise self._error(k + 2, column, f"must be {kind}, got {cell}")
            out[k] = int(value) if whole else value * scale
        return out

    def optional_float(
        self, column: str, *, scale: float, allow_none: bool = False
    ) -> FloatArray | None:
        if column not in self.index:
            return None
        out = np.full(len(self.body), np.nan)
        for k, cell in enumerate(self._cells(column)):
            if not cell:
                continue
            line = k + 2
            if allow_none and cell.lower() in _NO_SLO:
                out[k] = math.inf
                continue
            value = self._number(cell, line, column)
            if not (math.isfinite(value) and value > 0):
                raise self._error(line, column, f"must be a positive number, got {cell}")
            out[k] = value * scale
        return out
