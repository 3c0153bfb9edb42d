"""From an OpenAI request to the scheduling core's :class:`~priority.request.Request`.

The emulated engine has no model and no tokenizer, so everything a real engine learns from the
weights is replaced by a documented, deterministic stand-in:

* **Prompt tokens** — :mod:`gateway.tokens` (about four characters per token, chat template
  overhead per message), the same count the gateway estimates with.
* **Output tokens** — ``max_tokens`` (or ``max_completion_tokens``) when given: the engine then
  produces exactly that many, as vLLM does with ``ignore_eos``. Otherwise the length is drawn
  (seeded, with replacement) from the output lengths of the bundled Azure conversation trace
  (``priority/sim/data/azure_conv_20min.csv``, CC-BY-4.0), raised to ``min_tokens`` and capped by
  the context left after the prompt — the request then ends with ``finish_reason="stop"``.
* **SLO, weight, tier, tenant, arrival, kind, workflow, stage, length distribution** — from
  ``priority`` and ``vllm_xargs`` (the gateway's ``tiergate_*`` keys), read exactly as the vLLM
  plugins read them: through :func:`engine_common.slo.parse_meta`, with the same best-effort
  defaults (the TTFT default relative to the profile's zero-load TTFT of the prompt) and the
  same rule for malformed values — ignored and logged, never a 400 (see
  :mod:`engine_common.protocol`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np
import numpy.typing as npt

from engine_common.protocol import BestEffortDefaults, weight_from_priority
from engine_common.slo import parse_meta
from priority.request import Request, RequestMeta

__all__ = [
    "OutputLengthSampler",
    "OutputPlan",
    "RequestMappingError",
    "build_request",
    "plan_output",
    "read_meta",
    "trace_output_lengths",
    "weight_from_priority",
]

OUTPUT_LENGTH_TRACE = "azure_conv_20min.csv"
DEFAULTS = BestEffortDefaults()
"""The plugins' defaults when no ``TIERGATE_DEFAULT_*`` variable is set."""


class RequestMappingError(ValueError):
    """The request cannot run on this engine (maps to HTTP 400, like vLLM)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


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


def read_meta(
    xargs: Mapping[str, object] | None,
    priority: int,
    *,
    zero_load_ttft_s: float,
    now_unix_s: float,
    defaults: BestEffortDefaults = DEFAULTS,
) -> RequestMeta:
    """The request's metadata, read by the vLLM plugins' own reader (``parse_meta``); a
    gateway arrival later than ``now_unix_s`` counts as ``now_unix_s``."""
    return parse_meta(
        xargs, priority, defaults=defaults, zero_load_ttft_s=zero_load_ttft_s, now_unix_s=now_unix_s
    )


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
    meta: RequestMeta,
    now_s: float,
    now_unix_s: float,
    prompt_tokens: int,
    output: OutputPlan,
    time_scale: float = 1.0,
) -> Request:
    """The core's request, with :meth:`Request.from_meta` as the plugins build theirs.

    The plugin keeps the gateway's arrival as a Unix time; the emulated engine runs on its own
    clock (``now_s``, when the Unix clock reads ``now_unix_s``, the time ``meta`` was read at),
    so the delay since that arrival moves the arrival back (none without one). The engine, like
    a real one, only knows ``max_tokens``; the drawn length is the simulator's oracle field (read
    only by the oracle baselines ``sjf``/``rr-sjf``).
    """
    delay_s = 0.0 if meta.arrival_s is None else now_unix_s - meta.arrival_s
    return Request.from_meta(
        meta,
        request_id,
        arrival_s=now_s - delay_s * time_scale,
        prompt_tokens=prompt_tokens,
        max_output_tokens=output.max_tokens,
        true_output_tokens=output.tokens,
    )
