"""Recorded engine steps: the file format an engine writes and a profile is built from.

Each row is one executed step, as the engine measured it: when it ended, its real duration, the
estimator's uncorrected prediction at the time, and the batch's shape (prefill chunks as
``l_q:l_kv`` pairs, decodes as their ``l_kv``). The shape, not derived features, is recorded, so a
later estimator with other terms can be fitted from the same file.

Writer: the engine plugin, when ``TIERGATE_STEP_LOG`` names a file (``engine_common``'s driver,
one row per measured step). Readers: ``tiergate profile from-steps`` (a profile for a new model or
card from a running vLLM) and ``bench/estimator_refit.py`` (held-out error of the refit).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

HEADER = ("end_s", "real_s", "raw_predicted_s", "prefill", "decode_kv")


@dataclass(frozen=True, slots=True)
class RecordedStep:
    end_s: float
    """Engine clock (Unix seconds) when the step's output arrived."""
    real_s: float
    """Measured duration of the step."""
    raw_predicted_s: float
    """The engine estimator's prediction without beta, when the step was scheduled."""
    prefill: tuple[tuple[int, int], ...]
    """Prefill chunks: (new tokens l_q, cached tokens l_kv)."""
    decode_kv: tuple[int, ...]
    """Decodes: cached tokens l_kv of each."""


def format_row(step: RecordedStep) -> list[str]:
    return [
        f"{step.end_s:.6f}",
        f"{step.real_s:.9f}",
        f"{step.raw_predicted_s:.9f}",
        ";".join(f"{q}:{kv}" for q, kv in step.prefill),
        ";".join(str(kv) for kv in step.decode_kv),
    ]


def parse_row(row: Sequence[str]) -> RecordedStep:
    end, real, raw, prefill, decode = row
    return RecordedStep(
        end_s=float(end),
        real_s=float(real),
        raw_predicted_s=float(raw),
        prefill=tuple(
            (int(q), int(kv)) for q, kv in (pair.split(":") for pair in prefill.split(";") if pair)
        ),
        decode_kv=tuple(int(kv) for kv in decode.split(";") if kv),
    )


def write_header(out: IO[str]) -> None:
    csv.writer(out).writerow(HEADER)


def append(out: IO[str], step: RecordedStep) -> None:
    csv.writer(out).writerow(format_row(step))


def read_steps(path: str | Path) -> Iterator[RecordedStep]:
    """The steps of a log, in order; a malformed row (a torn last line) is skipped."""
    with open(path, newline="") as handle:
        for row in csv.reader(handle):
            if not row or row[0] == HEADER[0]:
                continue
            try:
                yield parse_row(row)
            except ValueError:
                continue
