"""Fit the PROSERVE Eqs. 4-7 coefficients to a profile table by non-negative least squares.

Every term of the batch model is linear in the coefficients, so one row of the design matrix is
the batch's feature sums (``sum l_q^2``, ``sum l_q*l_kv``, ``sum l_q`` [, ``sum l_kv``] over
prefill chunks; ``sum l_kv`` and the count over decodes; 1 for ``t_c``). Each row is divided by
its measured latency, so the solver minimises squared *relative* error: we report MAPE, and
absolute least squares would let a few long prefills drown every decode step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import nnls

from priority.estimator import BatchLatencyEstimator, LatencyCoefficients
from priority.profiles import EngineConfig, Profile
from priority.profiles.table import BatchRow

_BASE_TERMS = ("a_p", "b_p", "c_p", "a_d", "b_d", "t_c")


def _terms(prefill_kv_term: bool) -> tuple[str, ...]:
    return (*_BASE_TERMS, "d_p") if prefill_kv_term else _BASE_TERMS


def design_matrix(
    rows: Sequence[BatchRow], *, prefill_kv_term: bool = False
) -> npt.NDArray[np.float64]:
    """Feature sums of each row, one column per coefficient in :func:`_terms` order."""
    x = np.zeros((len(rows), len(_terms(prefill_kv_term))))
    for i, row in enumerate(rows):
        lq = np.array([p[0] for p in row.prefill], dtype=np.float64)
        lkv = np.array([p[1] for p in row.prefill], dtype=np.float64)
        dkv = np.array(row.decode_kv, dtype=np.float64)
        x[i, :6] = (
            (lq * lq).sum(),
            (lq * lkv).sum(),
            lq.sum(),
            dkv.sum(),
            len(dkv),
            1.0,
        )
        if prefill_kv_term:
            x[i, 6] = lkv.sum()
    return x


def fit_coefficients(
    rows: Sequence[BatchRow], *, prefill_kv_term: bool = False
) -> LatencyCoefficients:
    """Non-negative coefficients minimising the squared relative error over ``rows``."""
    if not rows:
        raise ValueError("cannot fit a profile to zero rows")
    x = design_matrix(rows, prefill_kv_term=prefill_kv_term)
    y = np.array([r.latency_s for r in rows], dtype=np.float64)
    a = x / y[:, None]
    # Columns span ~10 orders of magnitude (l_q^2 vs 1): normalise them so NNLS is well
    # conditioned, then undo the scaling. All-zero columns (e.g. no prefill rows) stay 0.
    scale = np.abs(a).max(axis=0)
    used = scale > 0
    sol = np.zeros(a.shape[1])
    if used.any():
        coef, _ = nnls(a[:, used] / scale[used], np.ones(len(rows)), maxiter=50 * a.shape[1])
        sol[used] = coef / scale[used]
    return LatencyCoefficients(**dict(zip(_terms(prefill_kv_term), map(float, sol), strict=True)))


def predict(coeffs: LatencyCoefficients, rows: Sequence[BatchRow]) -> npt.NDArray[np.float64]:
    """Predicted latency (seconds, beta = 1) of each row."""
    est = BatchLatencyEstimator(coeffs)
    return np.array([est.raw_batch_time(r.prefill, r.decode_kv) for r in rows])


def mape(coeffs: LatencyCoefficients, rows: Sequence[BatchRow]) -> float:
    """Mean absolute percentage error of ``coeffs`` on ``rows``, as a fraction (0.05 = 5%)."""
    if not rows:
        raise ValueError("MAPE of zero rows is undefined")
    y = np.array([r.latency_s for r in rows])
    return float(np.mean(np.abs(predict(coeffs, rows) - y) / y))


def batch_kind(row: BatchRow) -> str:
    """``prefill_only``, ``decode_only`` or ``mixed``: where a profile's error usually differs."""
    if row.prefill and row.decode_kv:
        return "mixed"
    return "prefill_only" if row.prefill else "decode_only"


def mape_by_kind(coeffs: LatencyCoefficients, rows: Sequence[BatchRow]) -> dict[str, float]:
    """:func:`mape` of each :func:`batch_kind` present in ``rows``."""
    kinds: dict[str, list[BatchRow]] = {}
    for row in rows:
        kinds.setdefault(batch_kind(row), []).append(row)
    return {kind: mape(coeffs, group) for kind, group in sorted(kinds.items())}


def split_rows(
    rows: Sequence[BatchRow], holdout_fraction: float, seed: int
) -> tuple[list[BatchRow], list[BatchRow]]:
    """Seeded random (train, held-out) split; at least one row stays in train."""
    if not 0.0 <= holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}")
    order = np.random.default_rng(seed).permutation(len(rows))
    n_held = min(len(rows) - 1, round(holdout_fraction * len(rows)))
    held = sorted(order[:n_held].tolist())
    held_set = set(held)
    train = [rows[i] for i in range(len(rows)) if i not in held_set]
    return train, [rows[i] for i in held]


def cross_validated_mape(
    rows: Sequence[BatchRow], *, folds: int = 5, seed: int = 0, prefill_kv_term: bool = False
) -> float:
    """Mean held-out MAPE over ``folds`` seeded folds: every row is held out exactly once.

    Small measured tables (tens of rows) make one random 80/20 split noisy; k-fold uses each
    row for validation once.
    """
    if not 2 <= folds <= len(rows):
        raise ValueError(f"need 2 <= folds <= {len(rows)} rows, got {folds}")
    order = np.random.default_rng(seed).permutation(len(rows))
    errors = np.zeros(len(rows))
    for fold in np.array_split(order, folds):
        held = set(fold.tolist())
        coeffs = fit_coefficients(
            [rows[i] for i in range(len(rows)) if i not in held], prefill_kv_term=prefill_kv_term
        )
        y = np.array([rows[i].latency_s for i in fold])
        errors[fold] = np.abs(predict(coeffs, [rows[i] for i in fold]) - y) / y
    return float(errors.mean())


def fit_profile(
    rows: Sequence[BatchRow],
    *,
    name: str,
    hardware: str,
    model: str,
    tensor_parallel: int = 1,
    engine: EngineConfig | None = None,
    provenance: dict[str, Any] | None = None,
    prefill_kv_term: bool = False,
    holdout_fraction: float = 0.2,
    seed: int = 0,
) -> Profile:
    """Fit on a train split, record held-out MAPE in ``Profile.fit``, then refit on all rows."""
    train, held = split_rows(rows, holdout_fraction, seed)
    heldout_mape = (
        mape(fit_coefficients(train, prefill_kv_term=prefill_kv_term), held) if held else None
    )
    coeffs = fit_coefficients(rows, prefill_kv_term=prefill_kv_term)
    fit_info: dict[str, Any] = {
        "method": "scipy.optimize.nnls on rows scaled by 1/latency (relative error)",
        "rows": len(rows),
        "train_rows": len(train),
        "heldout_rows": len(held),
        "heldout_mape": heldout_mape,
        "all_rows_mape": mape(coeffs, rows),
        "holdout_fraction": holdout_fraction,
        "seed": seed,
        "prefill_kv_term": prefill_kv_term,
    }
    return Profile(
        name=name,
        hardware=hardware,
        model=model,
        tensor_parallel=tensor_parallel,
        coefficients=coeffs,
        engine=engine or EngineConfig(),
        provenance=dict(provenance or {}),
        fit=fit_info,
    )
