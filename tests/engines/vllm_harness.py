"""The tests' name for :mod:`engine_common.replay` (the real vLLM scheduler on a virtual clock)."""

from __future__ import annotations

from engine_common.replay import *  # noqa: F403
from engine_common.replay import __all__  # noqa: F401
