"""How deeply a JSON body nests, measured before any parser sees it.

Python's ``json`` (and so FastAPI, pydantic's JSON mode and the emulated engine) recurses once per
``[`` or ``{``. A body far under the size limit made of a few thousand of them raises
``RecursionError``: a plain-text 500 and a dropped connection. A body just under the interpreter's
recursion limit parses, and then overflows the stack of whatever walks it next (validation, the
re-serialisation for the engine, the audit log). So every endpoint that parses a body measures
its depth first — one linear pass outside strings, at C speed — and answers a body nested deeper
than :data:`MAX_JSON_DEPTH` with 400 ``invalid_json``, like any other body it cannot take:

* ``/v1`` parses with :func:`gateway.errors.parse_json_body`;
* ``/admin/v1`` checks with :func:`gateway.errors.check_json_depth` before FastAPI parses
  (:class:`gateway.app.admin.deps.AdminRoute`);
* the emulated engine checks with :func:`nesting_error`, answered in vLLM's envelope.

Only the measurement lives here (no web framework, no database): the emulated engine imports it.
"""

from __future__ import annotations

import json
import re
from typing import Final

import numpy as np

MAX_JSON_DEPTH: Final = 128
"""Arrays and objects inside each other. OpenAI's deepest documented structure (a structured
output's JSON schema: 10 levels of nesting, each an object in a ``properties`` object) needs a
few dozen; the interpreter's recursion limit (1000) is far above."""

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
"""A JSON string, escapes included (the unrolled form: linear, no backtracking)."""
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = np.zeros(256, dtype=np.int8)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


def json_depth_exceeds(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the arrays and objects of ``raw`` nest deeper than ``limit``.

    Exact for valid JSON; for a body that is not, a conservative reading that never lets the
    parser recurse past ``limit`` (an unclosed string counts its brackets). A body with at most
    ``limit`` opening brackets anywhere — nearly every request — costs two ``bytes.count``.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    brackets = _STRING.sub(b"", _as_utf8(raw)).translate(None, _NOT_BRACKETS)
    steps = _STEP[np.frombuffer(brackets, dtype=np.uint8)]
    return bool(np.cumsum(steps, dtype=np.int32).max(initial=0) > limit)


def _as_utf8(raw: bytes) -> bytes:
    """``json.loads`` also reads UTF-16 and UTF-32 bodies: scan those re-encoded as UTF-8 (where
    a quote or a backslash is always its own byte)."""
    encoding = json.detect_encoding(raw)
    if encoding in ("utf-8", "utf-8-sig"):
        return raw
    try:
        return raw.decode(encoding).encode()
    except UnicodeError:
        return raw  # the parser refuses it anyway; the raw scan is conservative


def too_deep_message(limit: int = MAX_JSON_DEPTH) -> str:
    return f"the request body nests arrays and objects deeper than {limit} levels"


def nesting_error(raw: bytes, limit: int = MAX_JSON_DEPTH) -> str | None:
    """Why ``raw`` may not be parsed (too deep), or None: for a caller with its own envelope."""
    return too_deep_message(limit) if json_depth_exceeds(raw, limit) else None
