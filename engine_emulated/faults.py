"""Fault injection for the emulated engine: the ways a real engine breaks, on demand.

For tests and drills only (``bench/drill_engine.py``, ``tests/gateway/test_engine_faults.py``):
an engine built with ``fault_injection=True`` (``tiergate engine-sim --fault-injection``) serves
``GET``/``POST /fault-injection``; without it the route does not exist. The modes:

=========  =======================================================================================
mode       what the engine does
=========  =======================================================================================
none       serves normally
hang       the engine core stops stepping (a hung GPU or engine core): nothing streams, new
           requests are accepted and queue, ``/health`` and ``/metrics`` still answer. Cleared,
           it resumes where it stopped
freeze     like a process under ``SIGSTOP``: connections are accepted and nothing is answered,
           ``/health`` included; cleared, everything continues
stall      each stream stops after ``after_tokens`` output chunks (0: headers, then nothing),
           a non-streamed request is never answered; the engine core runs on. Cleared, the
           held streams continue
garbage    each stream sends ``garbage`` (below) after ``after_tokens`` chunks and ends; a
           non-streamed answer is a 200 whose body is not JSON
crash      the engine core died: open streams end at once without ``[DONE]``, new requests get
           500, ``/health`` 503 (vLLM's answers when its engine core is gone). Cleared, the
           engine serves again, empty
=========  =======================================================================================

``garbage`` kinds: ``text`` (``data: `` with text that is not JSON), ``binary`` (bytes that are
no SSE at all), ``empty`` (a ``data:`` line with nothing), ``oversized`` (one event of 8 MiB with
no end), ``truncated`` (the stream closes without ``[DONE]``).
"""

from __future__ import annotations

import asyncio
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

OVERSIZED_BYTES = 8 * 1024 * 1024


class FaultMode(StrEnum):
    NONE = "none"
    HANG = "hang"
    FREEZE = "freeze"
    STALL = "stall"
    GARBAGE = "garbage"
    CRASH = "crash"


class GarbageKind(StrEnum):
    TEXT = "text"
    BINARY = "binary"
    EMPTY = "empty"
    OVERSIZED = "oversized"
    TRUNCATED = "truncated"


class Fault(BaseModel):
    """The body of ``POST /fault-injection`` and what ``GET`` answers."""

    model_config = ConfigDict(extra="forbid")

    mode: FaultMode = FaultMode.NONE
    after_tokens: int = Field(
        default=0, ge=0, description="stall / garbage: output chunks sent normally first"
    )
    garbage: GarbageKind = GarbageKind.TEXT


def garbage_bytes(kind: GarbageKind) -> bytes:
    """What a garbling engine sends in place of its next chunk ("truncated": nothing)."""
    if kind is GarbageKind.TEXT:
        return b"data: this is not JSON at all\n\n"
    if kind is GarbageKind.BINARY:
        return bytes((i * 167 + 13) % 256 for i in range(509)) + b"\n\n"
    if kind is GarbageKind.EMPTY:
        return b"data:\n\n"
    if kind is GarbageKind.OVERSIZED:
        return b"data: {" + b"x" * OVERSIZED_BYTES
    return b""


class FaultInjector:
    """The engine's current fault, and a way for handlers to wait until it is cleared."""

    def __init__(self) -> None:
        self.fault = Fault()
        self._changed = asyncio.Event()

    @property
    def mode(self) -> FaultMode:
        return self.fault.mode

    def set(self, fault: Fault) -> None:
        self.fault = fault
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_while(self, mode: FaultMode) -> None:
        """Return once the engine is no longer in ``mode``."""
        while self.fault.mode is mode:
            await self._changed.wait()

    def stalls_at(self, sent: int) -> bool:
        """Whether a stream that sent ``sent`` chunks stops here (``stall``)."""
        return self.fault.mode is FaultMode.STALL and sent >= self.fault.after_tokens

    def garbles_at(self, sent: int) -> bool:
        return self.fault.mode is FaultMode.GARBAGE and sent >= self.fault.after_tokens
