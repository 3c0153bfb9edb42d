"""The stat-logger plugin, shared with the CUDA side (see :mod:`engine_cuda.metrics`)."""

from engine_cuda.metrics import TiergateStatLogger

__all__ = ["TiergateStatLogger"]
