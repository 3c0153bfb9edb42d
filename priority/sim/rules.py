"""The engine software's own rules, which the simulated engine follows and every policy plans in.

A real engine is more than its scheduling policy: vLLM decides by itself when a waiting request
may be admitted and where a preempted request goes back in its queue. A simulator that does not
share those rules disagrees with the real engine exactly when the KV cache binds (measured:
SlideBatching 0.913 simulated vs 0.828 in vLLM 0.33 at 12,288 blocks). Named rule sets:

* ``vllm`` (default) — vLLM 0.23 and 0.33 as shipped: a waiting request is admitted only if its
  whole current sequence fits (``scheduler_reserve_full_isl``: a preempted request resumes only
  when its prompt *and* the output it already produced fit again); a preempted request is put
  back at the front of the waiting queue.
* ``per-chunk`` — an idealised engine: admission checks only the first chunk's blocks and the
  waiting queue stays in arrival order (the simulator's rule before it was checked against vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass

from priority.policies.base import PER_CHUNK_ADMISSION, VLLM_ADMISSION, AdmissionRule


@dataclass(frozen=True, slots=True)
class EngineRules:
    name: str
    admission: AdmissionRule
    preempted_to_front: bool
    """True: a preempted request goes back to the head of the waiting queue (vLLM's
    ``prepend_request``); False: into arrival order."""


ENGINE_RULES: dict[str, EngineRules] = {
    "vllm": EngineRules("vllm", VLLM_ADMISSION, preempted_to_front=True),
    "per-chunk": EngineRules("per-chunk", PER_CHUNK_ADMISSION, preempted_to_front=False),
}
DEFAULT_ENGINE_RULES = ENGINE_RULES["vllm"]


def engine_rules(name: str) -> EngineRules:
    try:
        return ENGINE_RULES[name]
    except KeyError:
        raise KeyError(f"unknown engine rules {name!r}; known: {', '.join(ENGINE_RULES)}") from None
