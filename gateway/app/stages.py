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
assistant turns before it. A request that offers ``tools`` and has no assistant turn yet is
**stage 0** of a conversation that may continue so. The conversation id is derived from what
every turn of the conversation repeats: the tenant, the model and the
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
from typing import TYPE_CHECKING, Any

from priority.request import RequestMeta

if TYPE_CHECKING:
    from gateway.app.metrics import GatewayMetrics

CONVERSATION_PREFIX = "conv-"
TOOL_ROLES = ("tool", "function")


def tool_stage(messages: Sequence[Any], *, offers_tools: bool = False) -> int | None:
    """The stage of a chat request whose last message is a tool result (the number of
    assistant turns before it); 0 for one that offers tools and has no assistant turn yet;
    else None."""
    if not messages or not isinstance(messages[-1], Mapping):
        return None
    turns = sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant")
    if messages[-1].get("role") in TOOL_ROLES:
        return turns if turns > 0 else None
    return 0 if offers_tools and turns == 0 else None


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


def mark_stage(
    meta: RequestMeta, body: Mapping[str, Any], *, tenant: str, model: str
) -> RequestMeta:
    """``meta`` with the conversation and stage of a tool continuation (module docstring);
    unchanged for anything else, and for a workflow call."""
    if meta.workflow_id is not None or meta.kind != "latency":
        return meta
    messages = body.get("messages")
    if not isinstance(messages, list):
        return meta  # a completions request: no turns to continue
    stage = tool_stage(messages, offers_tools=bool(body.get("tools")))
    if stage is None:
        return meta
    return dataclasses.replace(
        meta, workflow_id=conversation_id(messages, tenant=tenant, model=model), stage=stage
    )


class StageAttainment:
    """Multi-stage attainment in the gateway: a conversation is attained only if every stage
    is (SLOs-Serve's rule). Counted per worker (``tiergate_multistage_*``): each conversation
    once at the first stage seen, once more at its first missed stage; attainment =
    1 - missed / conversations. The conversations remembered are bounded (oldest forgotten:
    a stage of a forgotten one counts it again)."""

    def __init__(self, max_conversations: int = 100_000) -> None:
        self.max_conversations = max_conversations
        self._seen: dict[str, bool] = {}
        """Conversation id -> every stage so far met its SLO (insertion order: oldest first)."""

    def stage_ended(self, conversation: str, *, met: bool) -> tuple[bool, bool]:
        """A served stage ended; returns (first stage seen of it, its first missed stage)."""
        known = self._seen.get(conversation)
        if known is None:
            if len(self._seen) >= self.max_conversations:
                self._seen.pop(next(iter(self._seen)))
            self._seen[conversation] = met
            return True, not met
        if known and not met:
            self._seen[conversation] = False
            return False, True
        return False, False


def record_stage(
    tracker: StageAttainment, metrics: GatewayMetrics, meta: RequestMeta, tier: str, *, met: bool
) -> None:
    """Count a served request that is a stage of a conversation (:func:`mark_stage`)."""
    if meta.workflow_id is None or not meta.workflow_id.startswith(CONVERSATION_PREFIX):
        return
    first, missed = tracker.stage_ended(meta.workflow_id, met=met)
    metrics.multistage_stages.labels(tier, "true" if met else "false").inc()
    if first:
        metrics.multistage_conversations.labels(tier).inc()
    if missed:
        metrics.multistage_missed.labels(tier).inc()
