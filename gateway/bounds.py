"""Numeric bounds on every configured or requested value that reaches the gain, in one place.

A tier's weight multiplies every token's value; its SLOs place every token's deadline; a limit or
``max_tokens`` sizes a reservation and the ideal gain. A value that is finite and positive but
absurd (a weight of ``1e308``, a TTFT of ``1e-320`` ms) overflows a gain sum to ``inf`` (the TDG
ratio then reads ``nan``), underflows to a zero-second SLO that the scheduling core refuses, or
overflows an integer column. These bounds keep them out where they enter:

* the admin API's bodies (:mod:`gateway.app.admin.schemas`), the CLI's options
  (``tiergate tiers create``), and the database's CHECK constraints (:mod:`gateway.db.models`;
  migration ``0003`` wrote the same numbers and clamped older rows into them);
* the data plane: SLO headers (:mod:`gateway.app.slo`) and ``max_tokens``
  (:mod:`gateway.app.schemas`).

The numbers are generous: every value a deployment means (seeded tiers are weights 4/2/1, SLOs
25 ms to 10 minutes) sits well inside them.
"""

from __future__ import annotations

from typing import Final

from engine_common.protocol import PRIORITY_CLIP

MIN_WEIGHT: Final = 2.0**-PRIORITY_CLIP
"""1/1024. The engine maps a weight to vLLM's ``priority`` as ``-round(log2(weight))`` clipped to
±:data:`~engine_common.protocol.PRIORITY_CLIP` (10): a ratio of ``2 ** 10`` is already strict
precedence under every policy's gain, so weights outside ``[2**-10, 2**10]`` could only distort
gain sums, never order requests differently."""
MAX_WEIGHT: Final = 2.0**PRIORITY_CLIP
"""1024 (see :data:`MIN_WEIGHT`)."""

MIN_SLO_MS: Final = 1e-3
"""A microsecond: the smallest TTFT, TPOT or deadline (tier default, minimum, tenant override or
header). Far below any engine's step time, and far above the underflow of ``ms / 1e3`` to a
zero-second SLO, which the scheduling core refuses."""
MAX_SLO_MS: Final = 86_400_000.0
"""A day: beyond it an objective is a mistake, not an objective."""

MIN_LIMIT: Final = 1
"""Rate and concurrency limits (RPM, TPM, requests in flight): at least 1; NULL means none."""
MAX_LIMIT: Final = 2**31 - 1
"""Integer columns (limits, ids, token counts) are 32-bit on PostgreSQL."""

MAX_OUTPUT_TOKENS: Final = 2**31 - 1
"""``max_tokens`` / ``max_completion_tokens``: beyond any model's context, and what a usage
record's 32-bit token columns can hold. The backends' context length is the real bound, checked
on the request path (:mod:`gateway.app.context`)."""

# ---- overload shedding --------------------------------------------------------------------
MAX_SHED_SLACK: Final = 100.0
"""A tier's ``shed_slack`` (a fraction of its TTFT objective) is in ``[0, 100]``: a first token
predicted 100 times later than promised is no objective any more; a tier that means "never shed"
allows best effort instead (``docs/operations/overload.md``)."""
