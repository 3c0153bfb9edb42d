"""Multi-stage requests (SLOs-Serve): a tool response sent back for a new prompt turn is a new
prefill *stage* of the same conversation, with its own TTFT.

An agent's tool loop reaches the gateway as separate requests: the model answers with tool
calls, the client runs the tools and sends the conversation again with the tool results
appended. Each such request already gets its own TTFT and TPOT from its tier; what the gateway
adds here is *which conversation it continues and which stage it is*, so that engines, the
simulator and reports can judge the conversation as SLOs-Serve does — attained only if every
stage is (:func:`priority.sim.metrics.multistage_attainment` groups by ``workflow_id``).

A request is a **tool continuation** when its last message is a tool result (``role`` ``tool``,
or the older ``function``) answering an assistant turn. Its **stage** is the number of
assistant turns before it (stage 0 is the conversation's first prompt), and its conversation
id is derived from what every turn of the conversation repeats: the tenant, the model and the
messages up to the first assistant turn, hashed (``conv-`` and 24 hex digits). Stateless, so
every gateway worker marks the same request the same way, with nothing stored. A plain
follow-up question (last message from the user) is a new request, not a stage; a request that
names an agent workflow (``x-tiergate-workflow-id``) is a compound call judged by its
workflow's deadline (:mod:`gateway.app.kinds`) and is left as it is.

The mark travels to the engine as ``tiergate_workflow_id`` / ``tiergate_stage`` beside the
request's own kind (``latency``: each stage keeps its TTFT and TPOT).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.app.slo import RequestSLO

CONVERSATION_PREFIX = "conv-"
TOOL_ROLES = ("tool", "function")


def tool_stage(messages: Sequence[Any]) -> int | None:
    """The stage of a chat request whose last message is a tool result (the number of
    assistant turns before it), else None."""
    if not messages or not isinstance(messages[-1], Mapping):
        return None
    if messages[-1].get("role") not in TOOL_ROLES:
        return None
    turns = sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant")
    return turns if turns > 0 else None


def conversation_id(messages: Sequence[Any], *, tenant: str, model: str) -> str:
    """A conversation's id: a hash of the tenant, the model and the messages before its first
    assistant turn (what every later turn repeats)."""
    opening: list[Any] = []
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "assistant":
            break
        opening.append(message)
    blob = json.dumps([tenant, model, opening], sort_keys=True, separators=(",", ":"))
    return CONVERSATION_PREFIX + hashlib.sha256(blob.encode()).hexdigest()[:24]


def mark_stage(slo: RequestSLO, body: Mapping[str, Any], *, tenant: str, model: str) -> RequestSLO:
    """``slo`` with the conversation and stage of a tool continuation (module docstring);
    unchanged for anything else, and for a workflow call."""
    if slo.workflow_id is not None or slo.kind != "latency":
        return slo
    messages = body.get("messages")
    if not isinstance(messages, list):
        return slo  # a completions request: no turns to continue
    stage = tool_stage(messages)
    if stage is None:
        return slo
    return dataclasses.replace(
        slo, workflow_id=conversation_id(messages, tenant=tenant, model=model), stage=stage
    )
