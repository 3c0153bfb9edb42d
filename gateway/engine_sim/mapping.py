"""From an OpenAI request to the scheduling core's :class:`~priority.request.Request`.

The emulated engine has no model and no tokenizer, so everything a real engine learns from the
weights is replaced by a documented, deterministic stand-in:

* **Prompt tokens** — about four characters per token (OpenAI's rule of thumb for English):
  ``ceil(chars / 4)``, at least 1. A prompt given as token ids counts its ids. Chat messages are
  counted one by one plus :data:`CHAT_TOKENS_PER_MESSAGE` for the chat template's role markers
  and :data:`CHAT_REPLY_PRIMER_TOKENS` for the assistant header the template appends.
* **Output tokens** — ``max_tokens`` (or ``max_completion_tokens``) when given: the engine then
  produces exactly that many, as vLLM does with ``ignore_eos``. Otherwise the length is drawn
  (seeded, with replacement) from the output lengths of the bundled Azure conversation trace
  (``priority/sim/data/azure_conv_20min.csv``, CC-BY-4.0), raised to ``min_tokens`` and capped by
  the context left after the prompt — the request then ends with ``finish_reason="stop"``.
* **SLO and weight** — from ``vllm_xargs`` (the gateway's ``tiergate_*`` keys, see
  :func:`slo_from_xargs`); a request without them is best effort with
  :data:`DEFAULT_TTFT_S` / :data:`DEFAULT_TPOT_S`, never an error.
* **Weight from vLLM's ``priority``** (lower = served first) when no ``tiergate_weight`` is
  given: ``weight = 2 ** -priority`` with ``priority`` clipped to ±30, so 0 (vLLM's default) is
  weight 1 and every step of priority halves or doubles the weight — the order is vLLM's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np
import numpy.typing as npt

from priority.request import SLO, Request

CHARS_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_REPLY_PRIMER_TOKENS = 3

DEFAULT_TTFT_S = 10.0
"""Best-effort TTFT objective of a request that carries no ``tiergate_*`` SLO."""
DEFAULT_TPOT_S = 1.0
"""Best-effort TPOT objective of a request that carries no ``tiergate_*`` SLO."""
PRIORITY_CLIP = 30
"""vLLM priorities beyond ±30 map to the weight of ±30 (keeps the weight a normal float)."""

OUTPUT_LENGTH_TRACE = "azure_conv_20min.csv"

XARG_WEIGHT = "tiergate_weight"
XARG_TTFT_MS = "tiergate_ttft_ms"
XARG_TPOT_MS = "tiergate_tpot_ms"
XARG_DEADLINE_MS = "tiergate_deadline_ms"
XARG_ARRIVAL_UNIX_S = "tiergate_arrival_unix_s"
XARG_TIER = "tiergate_tier"
XARG_TENANT = "tiergate_tenant"


class RequestMappingError(ValueError):
    """The request cannot run on this engine (maps to HTTP 400, like vLLM)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def count_text_tokens(text: str) -> int:
    """Prompt tokens of ``text`` under the ~4-characters-per-token stand-in (at least 1)."""
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def count_chat_tokens(contents: Sequence[str]) -> int:
    """Prompt tokens of a chat: each message's text plus the template's per-message overhead."""
    total = CHAT_REPLY_PRIMER_TOKENS
    for text in contents:
        total += CHAT_TOKENS_PER_MESSAGE + (-(-len(text) // CHARS_PER_TOKEN))
    return total


@lru_cache(maxsize=1)
def trace_output_lengths() -> npt.NDArray[np.int64]:
    """Output lengths of the bundled Azure conversation trace (the natural-length distribution)."""
    resource = resources.files("priority.sim.data").joinpath(OUTPUT_LENGTH_TRACE)
    with resources.as_file(resource) as path:
        lengths = np.loadtxt(path, delimiter=",", skiprows=1, usecols=2, dtype=np.int64)
    return np.atleast_1d(lengths)


class OutputLengthSampler:
    """Seeded draws of natural output lengths (used when a request gives no ``max_tokens``)."""

    def __init__(
        self,
        seed: int | np.random.SeedSequence = 0,
        lengths: npt.NDArray[np.int64] | None = None,
    ) -> None:
        self._lengths = trace_output_lengths() if lengths is None else lengths
        if self._lengths.size == 0 or int(self._lengths.min()) < 1:
            raise ValueError("output lengths must be a non-empty array of ints >= 1")
        self._rng = np.random.default_rng(seed)

    def draw(self) -> int:
        return int(self._lengths[self._rng.integers(0, self._lengths.size)])


@dataclass(frozen=True, slots=True)
class Scheduling:
    """What the scheduler needs beyond lengths: objectives, weight, tier, tenant, arrival."""

    slo: SLO
    weight: float
    tier: str
    tenant: str
    arrival_delay_s: float
    """Seconds between the gateway's arrival and now (0 without ``tiergate_arrival_unix_s``)."""


def _number(xargs: Mapping[str, object], key: str) -> float | None:
    value = xargs.get(key)
    if value is None:
        return None
    try:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise TypeError
        number = float(value)  # vLLM passes xargs through untyped: "250" is 250
    except (TypeError, ValueError):
        raise RequestMappingError(
            f"vllm_xargs.{key} must be a number, got {value!r}", key
        ) from None
    if not math.isfinite(number):
        raise RequestMappingError(f"vllm_xargs.{key} must be finite, got {value!r}", key)
    return number


def _positive(xargs: Mapping[str, object], key: str) -> float | None:
    number = _number(xargs, key)
    if number is not None and number <= 0:
        raise RequestMappingError(f"vllm_xargs.{key} must be > 0, got {number!r}", key)
    return number


def weight_from_priority(priority: int) -> float:
    """vLLM's ``priority`` (lower first) as a tier weight (larger first): ``2 ** -priority``."""
    return 2.0 ** -max(-PRIORITY_CLIP, min(PRIORITY_CLIP, priority))


def slo_from_xargs(
    xargs: Mapping[str, object] | None, priority: int, *, now_unix_s: float | None = None
) -> Scheduling:
    """Read the gateway's ``tiergate_*`` keys; anything absent falls back to best effort.

    * ``tiergate_ttft_ms`` / ``tiergate_tpot_ms`` — a streaming SLO (either one alone takes the
      default for the other);
    * ``tiergate_deadline_ms`` — an end-to-end deadline (alone: a deadline-only request);
    * ``tiergate_weight`` — the tier weight (else derived from ``priority``);
    * ``tiergate_arrival_unix_s`` — when the gateway received the request, so deadlines count
      from there; a timestamp in the future (clock skew) counts as now;
    * ``tiergate_tier`` / ``tiergate_tenant`` — labels for tenant-fair policies.

    Other keys are ignored, as vLLM ignores ``vllm_xargs`` it has no plugin for.
    """
    xargs = xargs or {}
    ttft_ms = _positive(xargs, XARG_TTFT_MS)
    tpot_ms = _positive(xargs, XARG_TPOT_MS)
    deadline_ms = _positive(xargs, XARG_DEADLINE_MS)
    weight = _positive(xargs, XARG_WEIGHT)
    arrival_unix = _number(xargs, XARG_ARRIVAL_UNIX_S)

    ttft_s = tpot_s = None
    if ttft_ms is not None or tpot_ms is not None:
        ttft_s = ttft_ms / 1e3 if ttft_ms is not None else DEFAULT_TTFT_S
        tpot_s = tpot_ms / 1e3 if tpot_ms is not None else DEFAULT_TPOT_S
    deadline_s = deadline_ms / 1e3 if deadline_ms is not None else None
    if ttft_s is None and deadline_s is None:
        ttft_s, tpot_s = DEFAULT_TTFT_S, DEFAULT_TPOT_S
    slo = SLO(ttft_s=ttft_s, tpot_s=tpot_s, deadline_s=deadline_s)

    delay = 0.0
    if arrival_unix is not None:
        now = time.time() if now_unix_s is None else now_unix_s
        delay = max(0.0, now - arrival_unix)
    return Scheduling(
        slo=slo,
        weight=weight if weight is not None else weight_from_priority(priority),
        tier=_label(xargs, XARG_TIER),
        tenant=_label(xargs, XARG_TENANT),
        arrival_delay_s=delay,
    )


def _label(xargs: Mapping[str, object], key: str) -> str:
    value = xargs.get(key)
    if value is None or value == "":
        return "default"
    return str(value)


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """How many tokens the request asks for at most and how many it will actually produce."""

    max_tokens: int
    tokens: int

    @property
    def finish_reason(self) -> str:
        return "length" if self.tokens >= self.max_tokens else "stop"


def plan_output(
    prompt_tokens: int,
    max_tokens: int | None,
    min_tokens: int,
    *,
    max_model_len: int,
    sampler: OutputLengthSampler,
) -> OutputPlan:
    """Check the context limit (vLLM's 400) and decide the output length."""
    room = max_model_len - prompt_tokens
    if room < 1 or (max_tokens is not None and max_tokens > room):
        asked = prompt_tokens + (max_tokens or 1)
        raise RequestMappingError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {asked} tokens ({prompt_tokens} in the messages, {max_tokens or 1} in "
            "the completion). Please reduce the length of the messages or completion.",
            "max_tokens" if room >= 1 else "messages",
        )
    if max_tokens is not None:
        if min_tokens > max_tokens:
            raise RequestMappingError(
                f"min_tokens ({min_tokens}) must be <= max_tokens ({max_tokens})", "min_tokens"
            )
        return OutputPlan(max_tokens=max_tokens, tokens=max_tokens)
    tokens = min(max(sampler.draw(), min_tokens), room)
    return OutputPlan(max_tokens=room, tokens=tokens)


def build_request(
    request_id: str,
    *,
    now_s: float,
    prompt_tokens: int,
    output: OutputPlan,
    scheduling: Scheduling,
    time_scale: float = 1.0,
) -> Request:
    """The core's request. ``now_s`` is the engine clock; the gateway's delay moves arrival back.

    The engine, like a real one, only knows ``max_tokens``; the drawn length is the simulator's
    oracle field (read only by the oracle baselines ``sjf``/``rr-sjf``).
    """
    return Request(
        request_id=request_id,
        arrival_s=now_s - scheduling.arrival_delay_s * time_scale,
        prompt_tokens=prompt_tokens,
        slo=scheduling.slo,
        weight=scheduling.weight,
        tier=scheduling.tier,
        tenant=scheduling.tenant,
        max_output_tokens=output.max_tokens,
        true_output_tokens=output.tokens,
    )
