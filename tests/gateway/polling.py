"""Waiting, in a test, for a state another thread owns (a gateway, an engine, a writer) that
offers no event to wait on.

The deadline only bounds a failing test: a pass never depends on how soon the state comes
true, so no test here is timed.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(
    condition: Callable[[], object], what: str = "the condition", timeout_s: float = 60.0
) -> None:
    """Poll ``condition`` until it holds; AssertionError naming ``what`` past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.01)
