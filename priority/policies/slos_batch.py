"""SLOs-Serve's batch formation (Alg. 2) on the shared estimator: ``time2bs``, the decode
deadlines decodes are placed by, and the capacity the admission planner budgets with.

One performance model: the batch time of a set of decodes and a prefill chunk is the shared
estimator's (:mod:`priority.estimator`); ``time2bs(t)`` — the largest batch that fits ``t`` — is
its inverse, not a second fit (SLOs-Serve's ``k1 · #tokens + b`` roofline).

**Decode deadlines.** A streaming request's next token is due one TPOT after the previous
pace-setting one, counted from its *first* token: ``anchor + n · TPOT`` for its ``n + 1``-th
token (Alg. 2's ``schDDL``, reset to 0 when the request starts decoding). Counting from the
first token rather than from ``arrival + TTFT`` is what the simulator's metric judges (the
mean TPOT after the first token): a request whose first token came early must keep that pace.
A decode is placed in this step only when the next step could end after its deadline
(``due ≤ now + 2 · batch``); the others wait for leftover budget, which is what leaves
prefill budget to the new prompts (the step lasts the tightest TPOT, not a decode per request).
"""

from __future__ import annotations

from collections.abc import Sequence

from priority.estimator import BatchLatencyEstimator


def time2bs(
    estimator: BatchLatencyEstimator,
    batch_s: float,
    decode_kv: Sequence[int] = (),
    *,
    prefill_kv: int = 0,
    token_budget: int | None = None,
) -> int:
    """Tokens of the largest batch that runs within ``batch_s``: the decodes with ``decode_kv``
    cached tokens plus the longest prefill chunk (over ``prefill_kv`` cached tokens) that still
    fits, capped by the engine's ``token_budget``. 0 if even the decodes do not fit."""
    used = estimator.batch_time(decode_kv=decode_kv)
    if used > batch_s * (1 + 1e-12):
        return 0
    limit = token_budget - len(decode_kv) if token_budget is not None else 1 << 30
    chunk = estimator.max_chunk(prefill_kv, batch_s - used, max(limit, 0))
    return len(decode_kv) + chunk


def prefill_capacity(estimator: BatchLatencyEstimator, batch_s: float | None) -> float:
    """Share of the engine's time left for tokens when every batch lasts ``batch_s`` (1 minus
    the batch's fixed cost ``t_c``); the planner's budget rate."""
    if batch_s is None or batch_s <= 0:
        return 1.0
    return max(0.0, 1.0 - estimator.t_c / batch_s)


def decode_load(estimator: BatchLatencyEstimator, kv_tokens: float, period_s: float) -> float:
    """Engine-seconds per second one decode takes when it gets a token every ``period_s``."""
    return estimator.decode_time(kv_tokens) / max(period_s, 1e-9)
