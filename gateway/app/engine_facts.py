"""What an engine says it is: seats, limits, policy and its corrected estimator.

The engine is the source of truth for what it is. A registered latency profile supplies the
*speed* of a kind of deployment; it cannot know that this engine was started with
``--max-num-seqs 16`` or a KV cache of 900 blocks. The gateway reads, from each scrape of the
engine's ``/metrics``:

* ``tiergate:engine_config_info`` (the plugin's stat logger, with our scheduler or vLLM's own):
  ``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``, ``block_size``,
  ``num_kv_blocks``, the scheduler and policy;
* ``vllm:cache_config_info`` (every vLLM): ``block_size`` and ``num_gpu_blocks``;
* ``tiergate:estimator_coefficient{name}`` and ``tiergate:estimator_beta``: the engine's
  estimator, refitted from its own steps — the router predicts with exactly it;

and ``max_model_len`` from ``/v1/models`` where the plugin is absent. :func:`effective_engine`
puts what the engine states over the profile's engine block and names every disagreement, which
the pool logs, exports (``tiergate_backend_config_mismatch``) and shows in the fleet view.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, fields, replace

from engine_common.exports import BETA, COEFFICIENT, CONFIG_INFO
from engine_common.exports import VLLM_CACHE_INFO as CACHE_INFO
from priority.estimator import LatencyCoefficients
from priority.estimator_refit import COEFFICIENT_NAMES
from priority.profiles import EngineConfig

LIMITS = ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_kv_blocks")
"""The fields of :class:`EngineConfig` an engine states (the profile's engine block)."""


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """One scrape's account of an engine, by the engine; None where it said nothing."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    num_kv_blocks: int | None = None
    max_model_len: int | None = None
    scheduler: str | None = None
    policy: str | None = None
    coefficients: LatencyCoefficients | None = None
    beta: float | None = None

    def limits(self) -> dict[str, int]:
        """The engine-block fields it stated."""
        stated = {name: getattr(self, name) for name in LIMITS}
        return {name: value for name, value in stated.items() if value is not None}


def parse_engine_facts(text: str) -> EngineFacts:
    """The facts in a ``/metrics`` body (engine 0's where several engines report)."""
    values: dict[str, object] = {}
    coefficients: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(CONFIG_INFO + "{"):
            labels = parse_labels(line[len(CONFIG_INFO) :])
            for name in (*LIMITS, "max_model_len"):
                values.setdefault(name, _int(labels.get(name)))
            values.setdefault("scheduler", labels.get("scheduler") or None)
            values.setdefault("policy", labels.get("policy") or None)
        elif line.startswith(CACHE_INFO + "{"):
            labels = parse_labels(line[len(CACHE_INFO) :])
            values["_cache_block_size"] = _int(labels.get("block_size"))
            values["_cache_blocks"] = _int(labels.get("num_gpu_blocks"))
        elif line.startswith(COEFFICIENT + "{"):
            labels = parse_labels(line[len(COEFFICIENT) :])
            value = _value(line)
            coefficient = labels.get("name", "")
            if coefficient in COEFFICIENT_NAMES and value is not None:
                coefficients.setdefault(coefficient, value)
        elif line.startswith(BETA + "{") or line.startswith(BETA + " "):
            values.setdefault("beta", _value(line))
    # vLLM's own cache info where the plugin did not say (stock vLLM without our package)
    if values.get("block_size") is None:
        values["block_size"] = values.get("_cache_block_size")
    if values.get("num_kv_blocks") is None:
        values["num_kv_blocks"] = values.get("_cache_blocks")
    known = {f.name for f in fields(EngineFacts)}
    facts = EngineFacts(**{k: v for k, v in values.items() if k in known})  # type: ignore[arg-type]
    if len(coefficients) == len(COEFFICIENT_NAMES):
        # a negative or non-finite coefficient: not an estimator to route on
        with contextlib.suppress(ValueError):
            facts = replace(facts, coefficients=LatencyCoefficients(**coefficients))
    if facts.beta is not None and not (facts.beta > 0 and math.isfinite(facts.beta)):
        facts = replace(facts, beta=None)
    return facts


def effective_engine(
    configured: EngineConfig, facts: EngineFacts
) -> tuple[EngineConfig, dict[str, str]]:
    """The engine block to route and admit with — the engine's values where it states them,
    the profile's elsewhere — and each disagreement by field, worded for an operator."""
    stated = facts.limits()
    mismatches = {
        name: f"{name}: profile says {getattr(configured, name)}, engine says {value}"
        for name, value in stated.items()
        if getattr(configured, name) != value
    }
    if not stated:
        return configured, {}
    try:
        return replace(configured, **stated), mismatches
    except ValueError:  # a 0 or negative limit: keep the profile's, still report it
        return configured, mismatches


def parse_labels(text: str) -> dict[str, str]:
    """The label set at the start of ``text`` (``{a="1",b="x"}``), quotes and escapes honoured."""
    labels: dict[str, str] = {}
    if not text.startswith("{"):
        return labels
    i, n = 1, len(text)
    while i < n and text[i] != "}":
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= n or text[eq + 1] != '"':
            break
        name = text[i:eq].strip().lstrip(",").strip()
        j, chars = eq + 2, []
        while j < n and text[j] != '"':
            if text[j] == "\\" and j + 1 < n:
                j += 1
                chars.append({"n": "\n"}.get(text[j], text[j]))
            else:
                chars.append(text[j])
            j += 1
        labels[name] = "".join(chars)
        i = j + 1
        if i < n and text[i] == ",":
            i += 1
    return labels


def _value(line: str) -> float | None:
    end = line.rfind("}")
    fields_ = line[end + 1 :].split() if end >= 0 else line.split()[1:]
    try:
        return float(fields_[0])
    except (IndexError, ValueError):
        return None


def _int(raw: str | None) -> int | None:
    try:
        value = float(raw) if raw not in (None, "", "None") else None
    except ValueError:
        return None
    return int(value) if value is not None and math.isfinite(value) and value >= 1 else None
