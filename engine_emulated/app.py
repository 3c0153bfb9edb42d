"""The emulated engine's HTTP face: vLLM's OpenAI-compatible API over a wall-clock EngineCore.

Endpoints (vLLM's): ``POST /v1/chat/completions``, ``POST /v1/completions`` (SSE streaming with
``data: [DONE]``, ``stream_options.include_usage``), ``GET /v1/models``, ``GET /health``,
``GET /version``, ``GET /metrics``. Errors are OpenAI-shaped: 400 for a bad body or a request
the engine cannot hold, 404 for an unknown model. A client that disconnects — streaming or
not — has its request aborted in the engine, freeing its KV blocks at once. Built with
``fault_injection``, it also serves ``GET``/``POST /fault-injection``
(:mod:`engine_emulated.faults`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from engine_common.protocol import BestEffortDefaults
from engine_emulated.faults import Fault, FaultInjector, FaultMode, garbage_bytes
from engine_emulated.filler import filler_text
from engine_emulated.loop import EngineRejected, TokenStream, WallClockEngine
from engine_emulated.mapping import (
    DEFAULTS,
    OutputLengthSampler,
    OutputPlan,
    RequestMappingError,
    build_request,
    plan_output,
    read_meta,
)
from engine_emulated.metrics import EngineMetrics
from engine_emulated.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    _GenerationRequest,
    describe_validation_error,
)
from gateway.heap import freeze_startup_objects
from gateway.jsonbody import nesting_error
from priority.estimator_refit import DEFAULT_EVERY as REFIT_EVERY
from priority.policies import make_policy
from priority.profiles import Profile
from priority.request import Request as CoreRequest
from priority.sim.engine import EngineCore

DEFAULT_MAX_MODEL_LEN = 32768
"""Context length when none is given (Qwen2-7B's native window); capped by the KV capacity."""
VERSION = "tiergate-engine-sim 0.1.0"
EMULATION_NOTE = (
    "Emulated engine: no model runs. Token timing follows the latency profile and the "
    "scheduling policy; the text is deterministic filler."
)

_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@dataclass(eq=False)
class EngineSim:
    """Everything one emulated engine holds (``app.state.engine_sim``)."""

    profile: Profile
    policy: str
    model_name: str
    max_model_len: int
    engine: WallClockEngine
    metrics: EngineMetrics
    sampler: OutputLengthSampler
    defaults: BestEffortDefaults = DEFAULTS
    """What requests without their own objectives get (the vLLM plugins' defaults)."""
    faults: FaultInjector | None = None
    """Fault injection (tests and drills only: :mod:`engine_emulated.faults`); None: off."""

    @property
    def core(self) -> EngineCore:
        return self.engine.core

    def inject(self, fault: Fault) -> None:
        """Switch to ``fault`` (``mode="none"`` clears it)."""
        if self.faults is None:
            raise RuntimeError("this engine was built without fault injection")
        self.faults.set(fault)
        if fault.mode in (FaultMode.HANG, FaultMode.FREEZE):
            self.engine.pause()
        else:
            self.engine.resume()
        if fault.mode is FaultMode.CRASH:
            self.engine.crash()


def build_engine_sim(
    profile: Profile,
    policy: str,
    *,
    model_name: str,
    seed: int = 0,
    noise_sigma: float = 0.0,
    policy_params: dict[str, Any] | None = None,
    time_scale: float = 1.0,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    defaults: BestEffortDefaults = DEFAULTS,
    fault_injection: bool = False,
) -> EngineSim:
    """The engine behind an app: core, policy, wall-clock loop, metrics and length sampler
    (and, with ``fault_injection``, the ``/fault-injection`` control: tests and drills only)."""
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
    noise_seed, length_seed = np.random.SeedSequence(seed).spawn(2)
    core = EngineCore(
        profile,
        make_policy(policy, profile.estimator(), **(policy_params or {})),
        noise_sigma=noise_sigma,
        rng=np.random.default_rng(noise_seed),
        name=f"engine-sim:{profile.name}:{policy}",
        refit_every=REFIT_EVERY,  # as the vLLM plugin does by default
    )
    # any request within the context then fits the KV pool alone (EngineCore.fits)
    model_len = min(max_model_len, core.pool.capacity_tokens)
    metrics = EngineMetrics(model_name, core, policy=policy, max_model_len=model_len)
    return EngineSim(
        profile=profile,
        policy=policy,
        model_name=model_name,
        max_model_len=model_len,
        engine=WallClockEngine(core, metrics, time_scale=time_scale),
        metrics=metrics,
        sampler=OutputLengthSampler(length_seed),
        defaults=defaults,
        faults=FaultInjector() if fault_injection else None,
    )


def create_engine_app(profile: Profile, policy: str, **options: Any) -> FastAPI:
    """An OpenAI-compatible app serving ``model_name`` from an emulated engine.

    ``options`` are :func:`build_engine_sim`'s keyword arguments (``model_name`` is required),
    passed through so the engine's parameters are listed, typed and defaulted in one place.
    The engine loop starts with the app's lifespan, or with the first request when the app
    runs without one (e.g. under ``httpx.ASGITransport``).
    """
    sim = build_engine_sim(profile, policy, **options)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        sim.engine.start()
        freeze_startup_objects()
        try:
            yield
        finally:
            await sim.engine.stop()

    app = FastAPI(title=f"tiergate engine-sim ({profile.name}, {policy})", lifespan=lifespan)
    app.state.engine_sim = sim

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {exc}", "InternalServerError")

    @app.get("/health")
    async def health() -> Response:
        if sim.faults is not None:
            await sim.faults.wait_while(FaultMode.FREEZE)
            if sim.faults.mode is FaultMode.CRASH:
                return Response(status_code=503)
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": VERSION}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        if sim.faults is not None:
            await sim.faults.wait_while(FaultMode.FREEZE)
        return {"object": "list", "data": [model_card(sim)]}

    @app.get("/metrics")
    async def metrics() -> Response:
        if sim.faults is not None:
            await sim.faults.wait_while(FaultMode.FREEZE)
        return Response(sim.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    if sim.faults is not None:
        faults = sim.faults

        @app.get("/fault-injection")
        async def current_fault() -> Fault:
            return faults.fault

        @app.post("/fault-injection")
        async def inject_fault(fault: Fault) -> Fault:
            sim.inject(fault)
            return faults.fault

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(sim, request, ChatCompletionRequest)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(sim, request, CompletionRequest)

    return app


def model_card(sim: EngineSim) -> dict[str, Any]:
    """vLLM's model card, plus a ``tiergate`` block saying this engine is emulated and how."""
    profile = sim.profile
    return {
        "id": sim.model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "tiergate-engine-sim",
        "root": sim.model_name,
        "parent": None,
        "max_model_len": sim.max_model_len,
        "permission": [],
        "tiergate": {
            "emulated": True,
            "note": EMULATION_NOTE,
            "profile": profile.name,
            "hardware": profile.hardware,
            "profile_model": profile.model,
            "tensor_parallel": profile.tensor_parallel,
            "policy": sim.policy,
            "time_scale": sim.engine.time_scale,
        },
    }


def error_response(
    status: int, message: str, error_type: str, param: str | None = None
) -> JSONResponse:
    body = {"error": {"message": message, "type": error_type, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


def _bad_request(message: str, param: str | None = None) -> JSONResponse:
    return error_response(400, message, "BadRequestError", param)


def core_request(
    sim: EngineSim, body: _GenerationRequest, request_id: str
) -> tuple[CoreRequest, OutputPlan]:
    """What the engine schedules for a valid body, and how its output ends (the protocol's
    fields read as the vLLM plugins read them; ``RequestMappingError`` is a 400)."""
    prompt_tokens = body.prompt_tokens()
    output = plan_output(
        prompt_tokens,
        body.requested_max_tokens(),
        body.min_tokens,
        max_model_len=sim.max_model_len,
        sampler=sim.sampler,
    )
    now_unix = time.time()
    meta = read_meta(
        body.vllm_xargs,
        body.priority,
        defaults=sim.defaults,
        zero_load_ttft_s=sim.profile.zero_load_ttft_s(prompt_tokens),
        now_unix_s=now_unix,
    )
    engine = sim.engine
    request = build_request(
        request_id,
        meta=meta,
        now_s=engine.now(),
        now_unix_s=now_unix,
        prompt_tokens=prompt_tokens,
        output=output,
        time_scale=engine.time_scale,
    )
    return request, output


async def _generate(sim: EngineSim, http: Request, schema: type[_GenerationRequest]) -> Response:
    faults = sim.faults
    if faults is not None and faults.mode is not FaultMode.NONE:
        await faults.wait_while(FaultMode.FREEZE)
        if faults.mode is FaultMode.CRASH:
            return error_response(500, "the engine core is dead", "EngineDeadError")
    raw = await http.body()
    too_deep = nesting_error(raw)  # before parsing: the parser recurses once per level
    if too_deep is not None:
        return _bad_request(too_deep)
    try:
        payload = json.loads(raw)
    except ValueError as exc:  # malformed, not UTF-8, an integer of too many digits
        return _bad_request(f"request body is not valid JSON: {exc}")
    try:
        body = schema.model_validate(payload)
    except ValidationError as exc:
        return _bad_request(*describe_validation_error(exc))
    if body.model != sim.model_name:
        return error_response(
            404, f"The model `{body.model}` does not exist.", "NotFoundError", "model"
        )
    engine = sim.engine
    chat = isinstance(body, ChatCompletionRequest)
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    try:
        request, output = core_request(sim, body, request_id)
        stream = engine.submit(request, output.finish_reason)
    except RequestMappingError as exc:
        return _bad_request(str(exc), exc.param)
    except (EngineRejected, ValueError) as exc:
        return _bad_request(str(exc))

    shape = _Shape(chat=chat, request_id=request_id, model=sim.model_name)
    if body.stream:
        return _EventStream(
            engine, stream, _sse(stream, shape, include_usage=body.include_usage, faults=faults)
        )
    if faults is not None and faults.mode is not FaultMode.NONE:
        answer = await _faulty_answer(faults)
        if answer is not None:
            engine.abort(request_id)
            return answer
    return await _complete(engine, stream, shape, http)


async def _faulty_answer(faults: FaultInjector) -> Response | None:
    """A non-streamed request under a fault: never answered while stalled, garbage when
    garbling; None: answer it normally."""
    while faults.mode in (FaultMode.STALL, FaultMode.FREEZE):
        await faults.wait_while(faults.mode)
    if faults.mode is FaultMode.GARBAGE:
        return Response(b"<html>not JSON</html>", 200, media_type="application/json")
    return None


class _EventStream(StreamingResponse):
    """An SSE response that aborts its request in the engine however the response ends
    (client gone mid-stream, or before the first byte — when the generator never even ran)."""

    def __init__(
        self, engine: WallClockEngine, stream: TokenStream, content: AsyncIterator[bytes]
    ) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._engine = engine
        self._stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self._stream.finished:
                self._engine.abort(self._stream.request.request_id)


class _Shape:
    """How one request's responses look. Stream chunks are pre-encoded around the text: a
    chunk per token per stream is the server's hottest path."""

    __slots__ = ("_first", "_next", "_tail", "chat", "created", "model", "object", "request_id")

    def __init__(self, *, chat: bool, request_id: str, model: str) -> None:
        self.chat = chat
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self.object = "chat.completion.chunk" if chat else "text_completion"
        head = _JSON(
            {"id": request_id, "object": self.object, "created": self.created, "model": model}
        )[:-1]
        if chat:
            self._first = (
                f'data: {head},"choices":[{{"index":0,"delta":{{"role":"assistant","content":'
            )
            self._next = f'data: {head},"choices":[{{"index":0,"delta":{{"content":'
            self._tail = '},"logprobs":null,"finish_reason":'
        else:
            self._first = self._next = f'data: {head},"choices":[{{"index":0,"text":'
            self._tail = ',"logprobs":null,"finish_reason":'

    def chunk(self, text: str, first: bool, finish_reason: str | None) -> bytes:
        head = self._first if first else self._next
        reason = "null" if finish_reason is None else _JSON(finish_reason)
        return f"{head}{_JSON(text)}{self._tail}{reason}}}]}}\n\n".encode()

    def usage_chunk(self, usage: dict[str, int]) -> bytes:
        return self._event({"choices": [], "usage": usage})

    def _event(self, body: dict[str, Any]) -> bytes:
        head = {
            "id": self.request_id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
        }
        return b"data: " + _JSON(head | body).encode() + b"\n\n"

    def full(self, text: str, finish_reason: str | None, usage: dict[str, int]) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
            obj = "chat.completion"
        else:
            choice["text"] = text
            obj = "text_completion"
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        return {
            "id": self.request_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }


def _usage(stream: TokenStream) -> dict[str, int]:
    prompt = stream.request.prompt_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": stream.delivered,
        "total_tokens": prompt + stream.delivered,
    }


async def _sse(
    stream: TokenStream, shape: _Shape, *, include_usage: bool, faults: FaultInjector | None
) -> AsyncIterator[bytes]:
    sent = 0
    while True:
        start, stop = await stream.next_tokens()
        if start == stop:
            break
        if faults is not None and faults.mode is not FaultMode.NONE:
            if faults.stalls_at(sent) or faults.mode is FaultMode.FREEZE:
                while faults.stalls_at(sent) or faults.mode is FaultMode.FREEZE:
                    await faults.wait_while(faults.mode)
                stop = stream.read = stream.delivered  # with what came while held
            if faults.garbles_at(sent):
                yield garbage_bytes(faults.fault.garbage)
                return
        sent += 1
        last = stream.done and not stream.aborted
        yield shape.chunk(
            filler_text(start, stop), start == 0, stream.finish_reason if last else None
        )
    if stream.aborted:
        return  # the engine shut down under this request: end the stream without [DONE]
    if include_usage:
        yield shape.usage_chunk(_usage(stream))
    yield b"data: [DONE]\n\n"


async def _complete(
    engine: WallClockEngine, stream: TokenStream, shape: _Shape, http: Request
) -> Response:
    drain = asyncio.ensure_future(_drain(stream))
    gone = asyncio.ensure_future(_disconnected(http))
    try:
        await asyncio.wait((drain, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (drain, gone):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if not stream.finished:
            engine.abort(stream.request.request_id)
    if stream.aborted:
        return error_response(503, "the request was aborted", "ServiceUnavailableError")
    text = filler_text(0, stream.delivered)
    return JSONResponse(shape.full(text, stream.finish_reason, _usage(stream)))


async def _drain(stream: TokenStream) -> None:
    while not stream.done:
        await stream.next_tokens()


async def _disconnected(http: Request) -> None:
    """Returns when the client disconnects (the body is already read, so only that is left)."""
    while True:
        message = await http.receive()
        if message["type"] == "http.disconnect":
            return
