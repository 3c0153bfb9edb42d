"""Filler text: one deterministic word per emitted token.

The emulated engine produces no language. Token ``i`` of every response is word ``i`` of a fixed
cycle, so a response's text is a pure function of its length — easy to check, and obviously
not model output (the model card says so too).
"""

from __future__ import annotations

WORDS: tuple[str, ...] = (
    " emulated",
    " tokens",
    " from",
    " a",
    " simulated",
    " engine",
    " no",
    " model",
    " ran",
    ".",
)


def filler_text(start: int, stop: int) -> str:
    """The text of output tokens ``start .. stop-1`` (0-based)."""
    n = len(WORDS)
    if stop - start == 1:
        return WORDS[start % n]
    return "".join(WORDS[i % n] for i in range(start, stop))
