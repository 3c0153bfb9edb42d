"""The stat-logger plugin, shared with the CUDA side (see :mod:`engine_common.stat_logger`)."""

from engine_common.stat_logger import TiergateStatLogger

__all__ = ["TiergateStatLogger"]
