"""vLLM's ``vllm.stat_logger_plugins`` entry point names this module: the policy's gauges.

The logger is shared with the Ascend plugin: :mod:`engine_common.stat_logger`.
"""

from engine_common.stat_logger import TiergateStatLogger

__all__ = ["TiergateStatLogger"]
