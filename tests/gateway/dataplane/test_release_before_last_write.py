"""A stream gives back its dispatch slot as soon as its upstream has ended, before its last
write: a client slow to take the last bytes holds no slot (nor the router's count) the engine
is done with, while the request itself ends — accounted — only once that write is over.

Through :class:`~gateway.app.proxy.RelayStream` with an ASGI ``send`` that holds the last body
until the test lets it go, one dispatch slot (``max_in_flight=1``) and a request waiting for it.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.app.accounting import Outcome
from gateway.app.backends import Backend, BackendSpec, ModelGroup
from gateway.app.proxy import Job, RelayStream
from gateway.dataplane.accounting import release_engine
from gateway.dataplane.answers import UpstreamFailed
from gateway.limits.backlog import QueueItem
from gateway.limits.queue import AdmissionQueue
from gateway.settings import Settings
from priority.profiles import load_profile
from priority.request import SLO, Request
from priority.routing import RouteDecision, make_router
from priority.routing.base import InstanceView

MODEL = "m"
TAIL = b"data: [DONE]\n\n"


class _Upstream:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class _Pool:
    def __init__(self) -> None:
        self.failures: list[str] = []

    def queue_changed(self, backend: Backend) -> None:
        pass

    def record_failure(self, backend: Backend) -> None:
        self.failures.append(backend.name)


def _item(name: str) -> QueueItem:
    return QueueItem(name, "t", 1.0, ttl_s=60.0, aging_s=1.0)


async def _streaming_job(queue: AdmissionQueue) -> tuple[Job, list[Any], list[Any]]:
    """A job past its first token on backend ``a``, holding the one dispatch slot."""
    profile = load_profile("a100-qwen2-7b")
    view = InstanceView(0, "a", profile, profile.estimator())
    backend = Backend(BackendSpec("a", "http://a:8000", MODEL, profile), profile, view)
    router = make_router("round-robin", [view])
    heard: list[Any] = []
    on_finish = router.on_finish

    def spy_finish(request: Request, decision: Any, now: float, **kw: Any) -> None:
        heard.append("on_finish")
        on_finish(request, decision, now, **kw)

    router.on_finish = spy_finish  # type: ignore[method-assign]
    planner: list[str] = []
    state = SimpleNamespace(
        pool=_Pool(),
        queue=queue,
        settings=Settings(),
        slo_admission=SimpleNamespace(release=planner.append),
    )
    identity = SimpleNamespace(tier_name="t", policy=SimpleNamespace(weight=1.0))
    job = Job(state, identity, "chat", 0.0)  # type: ignore[arg-type]
    job.stream = True
    job.core = Request("r", 0.0, 100, SLO(ttft_s=1.0, tpot_s=0.05))
    job.group = ModelGroup(MODEL, [backend], router)
    job.decision_live = RouteDecision(0)
    await queue.wait_for_turn(_item("streamed"))
    job.slot = True
    router.on_dispatch(job.core, job.decision_live, time.monotonic())
    job.backend, job.first_token, backend.own_decoding = backend, True, 1
    return job, heard, planner


@pytest.mark.parametrize("fails", [False, True], ids=["ended", "failed"])
def test_the_slot_goes_back_before_the_last_write(fails: bool) -> None:
    async def scenario() -> None:
        queue = AdmissionQueue(max_in_flight=1, max_queued=4)
        job, heard, planner = await _streaming_job(queue)
        ended: list[tuple[Any, ...]] = []

        async def relay(write: Any) -> bytes:
            if fails:
                raise UpstreamFailed("the upstream stream ended early")
            job.done = True
            return TAIL

        async def finish(*end: Any) -> None:  # accounting's end, as far as this test goes
            release_engine(job, time.monotonic())
            ended.append(end)

        job.relay = relay  # type: ignore[method-assign]
        job.finish = finish  # type: ignore[method-assign]
        last_write, client_reads = asyncio.Event(), asyncio.Event()

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and not message["more_body"]:
                last_write.set()
                await client_reads.wait()  # the client takes nothing of the last bytes yet

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()  # the client never leaves
            raise AssertionError

        upstream = _Upstream()
        stream = RelayStream(job, upstream)  # type: ignore[arg-type]
        relayed = asyncio.create_task(stream({"type": "http"}, receive, send))
        async with asyncio.timeout(30):  # bounds only a failing test (a slot never given back)
            await queue.wait_for_turn(_item("waiting"))  # the other request gets the slot
            await last_write.wait()
        assert not relayed.done() and ended == []  # the last write still waits on the client
        assert heard == ["on_finish"] and planner == [job.request_id]
        assert job.backend is not None and job.backend.own_decoding == 0
        assert upstream.closed == 1 and not job.slot
        client_reads.set()
        await relayed
        expected = (Outcome.FAILED, 502) if fails else (Outcome.OK, 200)
        assert [tuple(end[:2]) for end in ended] == [expected]
        assert heard == ["on_finish"] and upstream.closed == 1  # nothing given back twice
        assert job.state.pool.failures == (["a"] if fails else [])
        queue.release()  # the waiting request's slot: the queue balances
        with pytest.raises(RuntimeError):
            queue.release()

    asyncio.run(scenario())
