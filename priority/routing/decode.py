"""Decode-step predictions a router makes of an instance from what it tracks.

A router knows an instance's count of decoding requests and its last reported free KV blocks;
the KV in use stands for the decodes' summed ``l_kv`` (a decode step's cost grows with it), so
heterogeneous instances are compared by the decode step each would run, in its own estimator's
units (momentum correction included).
"""

from __future__ import annotations

from collections.abc import Sequence

from priority.request import Request
from priority.routing.base import InstanceView
from priority.routing.simple import healthy_decode


def decode_kv_tokens(instance: InstanceView) -> float:
    """Tokens in the instance's KV cache by its last report (0 if it never reported)."""
    free = instance.num_free_kv_blocks
    if free is None:
        return 0.0
    engine = instance.profile.engine
    return float(max(0, engine.num_kv_blocks - free) * engine.block_size)


def running_decodes_s(instance: InstanceView) -> float:
    """The share of one step that the instance's running decodes take (0 with none)."""
    est = instance.estimator
    n_d = min(instance.num_decoding, instance.profile.engine.max_num_seqs)
    if not n_d:
        return 0.0
    return est.decode_time(decode_kv_tokens(instance)) + (n_d - 1) * est.decode_time(0)


def decode_step_s(instance: InstanceView, extra_kv_tokens: float) -> float:
    """One decode step on ``instance`` with one more decode of ``extra_kv_tokens`` cached."""
    est = instance.estimator
    return est.t_c + running_decodes_s(instance) + est.decode_time(extra_kv_tokens)


def pick_decode_by_capacity(
    instances: Sequence[InstanceView], request: Request, exclude: frozenset[int] = frozenset()
) -> int | None:
    """The decode instance for a PD-disaggregated request by decode capacity; None when there are
    no DECODE roles.

    Instances are ranked by: a free sequence slot and room for the request's KV (prompt plus
    expected output) first; then a predicted decode step, with the request added, within its
    TPOT SLO (the step is shared, so this also keeps the running decodes on time); then the
    shortest such step — the instance that decodes the request fastest, heterogeneous hardware
    compared in each one's own estimator; full instances by their share of sequence slots
    taken. Ties go to the lower index. Instances in ``exclude`` are passed over, as if
    unhealthy.
    """
    healthy = healthy_decode(instances, exclude)
    if healthy is None:
        return None
    output = request.expected_output_tokens
    need = request.prompt_tokens + output
    tpot = request.slo.tpot_s

    def rank(instance: InstanceView) -> tuple[bool, bool, float, int]:
        engine = instance.profile.engine
        free = instance.num_free_kv_blocks
        full = instance.num_decoding >= engine.max_num_seqs or (
            free is not None and free * engine.block_size < need
        )
        if full:
            return (True, True, instance.num_decoding / engine.max_num_seqs, instance.index)
        step = decode_step_s(instance, request.prompt_tokens + output / 2)
        return (False, tpot is not None and step > tpot, step, instance.index)

    return min(healthy, key=rank).index
