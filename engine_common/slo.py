"""Per-request SLO metadata as it reaches an engine's scheduler: :mod:`engine_common.protocol`'s
reader, plus the engine-side bookkeeping of values it had to ignore.

The protocol's rule is a lenient reader: a malformed or out-of-range ``tiergate_*`` value takes
its default instead of failing the request (vLLM's scheduler cannot answer 400). So that a gateway
bug does not go unseen, every ignored key is counted (:func:`ignored_counts`) and logged as a
warning on its 1st, 10th, 100th, ... occurrence, naming the key and the value. Both vLLM plugins
(through :mod:`engine_common.scheduler`) and the emulated engine call :func:`parse_meta`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from engine_common.protocol import (
    ARRIVAL_UNIX_S,
    DEADLINE_MS,
    KIND,
    LENGTH,
    PRIORITY,
    STAGE,
    SUB_DEADLINE_MS,
    TENANT,
    TIER,
    TPOT_MS,
    TTFT_MS,
    WEIGHT,
    WORKFLOW_ID,
    XARG_KEYS,
    BestEffortDefaults,
    RequestMeta,
    parse,
)

__all__ = [
    "ARRIVAL_UNIX_S",
    "DEADLINE_MS",
    "KIND",
    "LENGTH",
    "STAGE",
    "SUB_DEADLINE_MS",
    "TENANT",
    "TIER",
    "TPOT_MS",
    "TTFT_MS",
    "WEIGHT",
    "WORKFLOW_ID",
    "XARG_KEYS",
    "RequestMeta",
    "ignored_counts",
    "parse_meta",
]

logger = logging.getLogger(__name__)
_ignored: Counter[str] = Counter()


def parse_meta(
    extra_args: Mapping[str, Any] | None,
    priority: int | None,
    *,
    defaults: BestEffortDefaults,
    zero_load_ttft_s: float,
    now_unix_s: float | None = None,
) -> RequestMeta:
    """The request's SLO, weight, tier, tenant and arrival from its vLLM metadata.

    ``zero_load_ttft_s`` is the prompt's TTFT on an idle engine (from the profile), for the
    default TTFT. The gateway's arrival time is clamped to ``now_unix_s`` (default: the clock
    vLLM stamps arrivals with, ``time.time()``).
    """
    meta = parse(
        extra_args,
        priority,
        defaults=defaults,
        zero_load_ttft_s=zero_load_ttft_s,
        now_unix_s=time.time() if now_unix_s is None else now_unix_s,
    )
    for key in meta.ignored:
        _count(key, extra_args, priority)
    return meta


def ignored_counts() -> dict[str, int]:
    """How many values of each key this process ignored (malformed or out of range)."""
    return dict(_ignored)


def _count(key: str, extra_args: Mapping[str, Any] | None, priority: int | None) -> None:
    _ignored[key] += 1
    n = _ignored[key]
    if str(n).rstrip("0") == "1":  # the 1st, 10th, 100th, ...: seen, without flooding the log
        value = priority if key == PRIORITY else (extra_args or {}).get(key)
        logger.warning(
            "ignored %s=%s (malformed or out of range; its default applies), %d so far",
            key,
            repr(value)[:80],
            n,
        )
