"""How deeply a JSON body nests, and which strings it may not carry, checked before it is used.

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

The strings of a body are checked here too, on the same raw bytes, before anything uses them
(:func:`lone_surrogate_at`, :func:`nul_at`): JSON may escape a lone UTF-16 surrogate
(``"\\ud800"``), and ``json.loads`` also reads one encoded in the bytes, but no UTF-8 encoder
(a database driver, a log line, the engine's request) takes it; PostgreSQL refuses a NUL in
text. Both only do work when the raw body can hold one (a backslash or an ``0xED`` byte, then a
pattern), so a normal body costs a ``bytes`` scan or two.

Only the measurements live here (no web framework, no database): the emulated engine imports
them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final

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


# -- strings a body may not carry -------------------------------------------------------------

Location = tuple[str | int, ...]
"""Where in a JSON value: object keys and array indices from the root (``()``: the value). A
key at fault is given printable (:func:`_printable`): it goes into the error answered."""

UNPARSED: Final[Any] = object()
"""The ``value`` of a caller that has not parsed the body: the checks parse it if they must."""

_UTF8: Final = ("utf-8", "utf-8-sig")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A ``\\u`` escape of a surrogate (``\\ud800``-``\\udfff``), paired or not."""
_SURROGATE_BYTES = re.compile(b"\xed[\xa0-\xbf]")
"""A surrogate encoded in UTF-8: invalid UTF-8, which ``json.loads`` still reads (it decodes
bytes with ``surrogatepass``)."""


def lone_surrogate_at(raw: bytes, value: Any = UNPARSED) -> Location | None:
    """Where ``raw`` (parsed: ``value``) holds a string UTF-8 cannot encode, or None.

    Such a string has a lone surrogate: an escape like ``"\\ud800"`` without its pair (a pair,
    ``"\\ud83d\\ude00"``, is one character: an emoji) or the surrogate's own bytes. JSON's
    grammar allows the escape; every encoder downstream refuses the string, so a body carrying
    one is refused before anything uses it. Exact; a body without a surrogate escape or
    ``0xED`` byte (nearly all) is settled by the raw scan alone.
    """
    if not _may_hold_surrogate(raw):
        return None
    value = _parsed(raw) if value is UNPARSED else value
    try:  # C speed; a key or string with a lone surrogate makes the encoding fail
        json.dumps(value, ensure_ascii=False).encode()
        return None
    except (UnicodeEncodeError, RecursionError):
        return _find(value, _unencodable)


def nul_at(raw: bytes, value: Any = UNPARSED) -> Location | None:
    """Where ``raw`` (parsed: ``value``) holds a string with a NUL character, or None.

    JSON writes NUL only as the escape ``\\u0000`` (a raw control character is not JSON), so a
    body without that escape (nearly all) is settled by the raw scan alone.
    """
    if _is_utf8(raw) and (b"\\" not in raw or b"\\u0000" not in raw):
        return None
    return _find(_parsed(raw) if value is UNPARSED else value, _has_nul)


def _may_hold_surrogate(raw: bytes) -> bool:
    """Whether ``raw`` may hold a surrogate: conservative, never a false "no"."""
    if not _is_utf8(raw):
        return True  # UTF-16 or -32: the byte patterns do not apply; check the parsed value
    if b"\\" in raw and _SURROGATE_ESCAPE.search(raw) is not None:
        return True
    return b"\xed" in raw and _SURROGATE_BYTES.search(raw) is not None


def _is_utf8(raw: bytes) -> bool:
    return json.detect_encoding(raw) in _UTF8


def _parsed(raw: bytes) -> Any:
    """``raw``'s JSON value; None (no strings) for a body that is not JSON: the parser that
    runs next refuses it in its own words."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError included
        return None


def _unencodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def _has_nul(text: str) -> bool:
    return "\x00" in text


def _find(value: Any, bad: Callable[[str], bool]) -> Location | None:
    """A key or string of ``value`` that is ``bad``, or None: the first one depth first (an
    object's keys before its values), so the same body always names the same field.

    Iterative: the value may nest as deeply as the parser allowed.
    """
    stack: list[tuple[Location, Any]] = [((), value)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, str):
            if bad(node):
                return where
        elif isinstance(node, dict):
            for key in node:
                if bad(key):
                    return (*where, _printable(key))
            stack.extend(((*where, key), item) for key, item in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend(((*where, i), node[i]) for i in reversed(range(len(node))))
    return None


def _printable(key: str) -> str:
    """``key`` with its lone surrogates and NULs as escapes: an error naming the key must itself
    be encodable (and readable)."""
    return key.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\u0000")
