"""Decode-step predictions a router makes of an instance from what it tracks.

A router knows an instance's count of decoding requests and its last reported free KV blocks;
the KV in use stands for the decodes' summed ``l_kv`` (a decode step's cost grows with it), so
heterogeneous instances are compared by the decode step each would run, in its own estimator's
units (momentum correction included).
"""

from __future__ import annotations

from priority.routing.base import InstanceView


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
