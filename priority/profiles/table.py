"""Profile tables: one row per measured batch, the input of :mod:`priority.profiles.fit`.

CSV columns (lists are space-separated ints, empty when the batch has none):

    prefill_lq,prefill_lkv,decode_lkv,latency_s[,metadata...]

``prefill_lq[i]``/``prefill_lkv[i]`` are the new and cached tokens of prefill chunk ``i``;
``decode_lkv`` holds one cached-token count per decode request. Extra columns (``source``,
``device`` ...) are kept as row metadata so measured and derived rows can share one file.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

COLUMNS = ("prefill_lq", "prefill_lkv", "decode_lkv", "latency_s")


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One executed batch: prefill chunks ``(l_q, l_kv)``, decode ``l_kv``s, measured time."""

    prefill: tuple[tuple[int, int], ...]
    decode_kv: tuple[int, ...]
    latency_s: float
    meta: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not (self.latency_s > 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"latency_s must be finite and > 0, got {self.latency_s!r}")
        if not self.prefill and not self.decode_kv:
            raise ValueError("a batch needs at least one prefill chunk or decode request")
        for l_q, l_kv in self.prefill:
            if l_q < 1 or l_kv < 0:
                raise ValueError(f"bad prefill chunk (l_q={l_q}, l_kv={l_kv})")
        if any(l_kv < 0 for l_kv in self.decode_kv):
            raise ValueError("decode l_kv must be >= 0")

    @property
    def num_tokens(self) -> int:
        """Tokens computed in this batch (the engine's token-budget usage)."""
        return sum(l_q for l_q, _ in self.prefill) + len(self.decode_kv)


def _ints(text: str) -> list[int]:
    return [int(tok) for tok in text.split()]


def _join(values: Iterable[int]) -> str:
    return " ".join(str(v) for v in values)


def row_from_record(record: Mapping[str, str]) -> BatchRow:
    """Parse one CSV record (a ``csv.DictReader`` row) into a :class:`BatchRow`."""
    missing = [c for c in COLUMNS if c not in record]
    if missing:
        raise ValueError(f"profile table is missing columns {missing}")
    lq = _ints(record["prefill_lq"] or "")
    lkv = _ints(record["prefill_lkv"] or "")
    if len(lq) != len(lkv):
        raise ValueError(f"prefill_lq has {len(lq)} entries but prefill_lkv has {len(lkv)}")
    meta = {k: (v or "") for k, v in record.items() if k not in COLUMNS and k is not None}
    return BatchRow(
        prefill=tuple(zip(lq, lkv, strict=True)),
        decode_kv=tuple(_ints(record["decode_lkv"] or "")),
        latency_s=float(record["latency_s"]),
        meta=meta,
    )


def parse_rows(text: str) -> list[BatchRow]:
    """Rows of a profile table given as CSV text."""
    return [row_from_record(rec) for rec in csv.DictReader(io.StringIO(text))]


def read_rows(path: Path | str) -> list[BatchRow]:
    """Rows of a profile-table CSV file."""
    return parse_rows(Path(path).read_text())


def format_rows(rows: Sequence[BatchRow]) -> str:
    """CSV text for ``rows``; metadata keys become extra columns (union, in first-seen order)."""
    meta_keys: dict[str, None] = {}
    for row in rows:
        meta_keys.update(dict.fromkeys(row.meta))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*COLUMNS, *meta_keys])
    for row in rows:
        writer.writerow(
            [
                _join(l_q for l_q, _ in row.prefill),
                _join(l_kv for _, l_kv in row.prefill),
                _join(row.decode_kv),
                repr(row.latency_s),
                *(row.meta.get(k, "") for k in meta_keys),
            ]
        )
    return out.getvalue()


def write_rows(path: Path | str, rows: Sequence[BatchRow]) -> None:
    """Write ``rows`` as a profile-table CSV file."""
    Path(path).write_text(format_rows(rows))
