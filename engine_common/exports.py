"""What an engine tells the gateway about itself: the names of the metrics it exports.

The other direction of :mod:`engine_common.protocol` (what the gateway tells an engine), data
only. Writers: the vLLM plugins' stat logger (:mod:`engine_common.stat_logger`) and the emulated
engine's metrics. Reader: the gateway's scrape (``gateway/app/engine_facts.py``).
"""

from __future__ import annotations

CONFIG_INFO = "tiergate:engine_config_info"
"""Value 1; the engine's own configuration as the labels :data:`CONFIG_LABELS` (and ``engine``).
The gateway takes seats and limits from it over a registered profile's."""
CONFIG_LABELS: tuple[str, ...] = (
    "scheduler",
    "policy",
    "profile",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "block_size",
    "num_kv_blocks",
)
COEFFICIENT = "tiergate:estimator_coefficient"
"""Label ``name`` (a :class:`~priority.estimator.LatencyCoefficients` field): the engine's
current coefficient, seconds per unit, before beta. With :data:`BETA`, the estimator the engine
schedules with, which the gateway's router adopts."""
BETA = "tiergate:estimator_beta"
"""The engine's momentum correction of its estimator."""
REFITS = "tiergate:estimator_refits"
"""Refits of the coefficients from the engine's real steps so far."""
RECEIVED = "tiergate:requests_received"
"""Labels ``tier``, ``kind``, ``objective`` (``slo`` or ``best-effort``): requests received so
far by what their metadata said."""
VLLM_CACHE_INFO = "vllm:cache_config_info"
"""vLLM's own (every vLLM): labels ``block_size`` and ``num_gpu_blocks``."""
