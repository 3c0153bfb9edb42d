"""The tests' name for :mod:`engine_harness.replay` (the real vLLM scheduler on a virtual clock)."""

from __future__ import annotations

from engine_harness.replay import *  # noqa: F403
from engine_harness.replay import __all__  # noqa: F401
