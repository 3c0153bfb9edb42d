"""The OpenAPI document is true: what it documents is what the gateway answers and accepts.

`bench/fuzz_gateway.py` (``tests/gateway/test_fuzz.py``) checks every response it provokes
against the app's own OpenAPI; the defects it found, one group of tests each:

* S1 — a streamed answer (``"stream": true``) is ``text/event-stream``: both 200 answers are
  documented, with their shapes (a JSON completion; events of chunks, an error, ``[DONE]``);
* S2 — an engine's error answer (vLLM: ``"type": "BadRequestError", "code": 400``) reaches the
  client in the gateway's dialect, unary or as an event in a stream, still accounted as the
  engine's refusal; and values OpenAI's types allow but vLLM refuses are refused up front;
* S3 — the `/v1` bodies, the SLO and workflow headers and the workflow error codes are
  documented (the proxy still parses the raw body);
* S4 — the `/v1` operations declare their bearer scheme;
* S5 — the admin bodies document the data layer's rules (names, lengths, URLs, kinds), so a body
  valid by the schema is refused only for what no schema can say;
* S6 — an admin integer is JSON's, as on `/v1`: ``146414.0`` is 146414.

The documented schemas are checked with ``jsonschema_rs`` (what schemathesis validates with)
against real answers: the emulated engine's, and a scripted engine's that answers as vLLM does
when it refuses a request or breaks a stream.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.testclient import TestClient
from openai.types.chat import ChatCompletionMessageParam
from pydantic import SecretStr
from seeded_app import app_settings, seed_database
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from engine_emulated import EngineSpec, EngineThread
from gateway.app import BackendSpec, create_app
from gateway.app.app import V1_SCHEMAS, V1_SECURITY
from gateway.app.kinds import WORKFLOW_DEADLINE_HEADER, WORKFLOW_ID_HEADER, WORKFLOW_ID_PATTERN
from gateway.app.schemas import ROLES, ChatBody, CompletionBody
from gateway.app.server import GatewayThread
from gateway.app.slo import DEADLINE_HEADER, TPOT_HEADER, TTFT_HEADER
from gateway.bounds import MAX_SLO_MS, MIN_SLO_MS
from gateway.dataplane.answers import engine_error
from gateway.db import crud
from gateway.db.crud._common import NAME_PATTERN
from gateway.db.models import BACKEND_KINDS, TENANT_STATUSES, Base, UsageRecord
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import Settings

MODEL = "qwen2-7b"  # the emulated engine's
SCRIPTED = "scripted"  # the scripted engine's: what it answers is the request's ``user``
PROFILE = "a100-qwen2-7b"
SECRET = "contract-test-secret"
ADMIN_KEY = "contract-admin-key"
GENERATION = {
    "/v1/chat/completions": ("ChatBody", "ChatCompletion", "ChatCompletionChunk"),
    "/v1/completions": ("CompletionBody", "Completion", "Completion"),
}
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    return create_app(Settings()).openapi()


def validator(openapi: dict[str, Any], schema: dict[str, Any]) -> Any:
    """A JSON Schema 2020-12 validator of ``schema``, its ``#/components/...`` refs resolved."""
    return jsonschema_rs.Draft202012Validator({**schema, "components": openapi["components"]})


def component(openapi: dict[str, Any], name: str) -> Any:
    return validator(openapi, {"$ref": f"#/components/schemas/{name}"})


def events(content: bytes) -> list[str]:
    """The ``data`` of each server-sent event."""
    out = []
    for event in content.split(b"\n\n"):
        if event.strip():
            assert event.startswith(b"data: "), event
            out.append(event[6:].decode())
    return out


# ---- a gateway in front of the emulated engine and a scripted one ----------------------------


def _vllm_error(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """vLLM's error body (``ErrorResponse``): an integer ``code`` and its own ``type``."""
    return {
        "error": {"message": message, "type": "BadRequestError", "param": param, "code": status}
    }


def _chunk(text: str) -> dict[str, Any]:
    delta = {"role": "assistant", "content": text}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": SCRIPTED,
        "choices": [choice],
    }


def _sse(*payloads: dict[str, Any]) -> list[bytes]:
    # json.dumps' default separators, as vLLM writes its events (``{"error": {...``)
    return [b"data: " + json.dumps(p).encode() + b"\n\n" for p in payloads] + [b"data: [DONE]\n\n"]


SCRIPTS: dict[str, tuple[int, Any]] = {
    # the request's ``user``: the status and body (or SSE events) the scripted engine answers
    "refuse": (400, _vllm_error(400, "top_k must be -1 or at least 1, got 0.", "top_k")),
    "refuse-coded": (
        400,
        {
            "error": {
                "message": "too long",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    ),
    "refuse-422": (422, {"detail": [{"loc": ["body", "x"], "msg": "bad"}]}),
    "refuse-plain": (418, "I'm a teapot"),
    "refuse-in-stream": (200, _sse(_vllm_error(400, "The decoder prompt cannot be empty"))),
    "break-4xx": (200, _sse(_chunk("hi"), _vllm_error(400, "bad logits processor"))),
    "break-5xx": (
        200,
        _sse(
            _chunk("hi"),
            {
                "error": {
                    "message": "Internal server error",
                    "type": "InternalServerError",
                    "code": 500,
                }
            },
        ),
    ),
}


def scripted_engine(requests: list[dict[str, Any]]) -> FastAPI:
    """Answers each generation request as :data:`SCRIPTS` says for its ``user``; records it."""
    app = FastAPI()

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse("")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": SCRIPTED, "max_model_len": 4096}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        requests.append(body)
        status, answer = SCRIPTS[body["user"]]
        if isinstance(answer, list):
            return StreamingResponse(iter(answer), media_type="text/event-stream")
        if isinstance(answer, str):
            return PlainTextResponse(answer, status_code=status)
        return JSONResponse(answer, status_code=status)

    return app


@dataclass
class Env:
    gateway: GatewayThread
    factory: sessionmaker[Session]
    key: str
    engine_requests: list[dict[str, Any]]

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        self.finished_before = self._finished()
        return httpx.post(
            f"{self.gateway.url}{path}",
            json=body,
            headers={"authorization": f"Bearer {self.key}"},
            timeout=30,
        )

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.gateway.base_url, api_key=self.key, max_retries=0)

    finished_before: float = 0.0

    def _finished(self) -> float:
        return float(self.gateway.state.usage_writer.submitted)

    def last_usage(self) -> tuple[str, str | None]:
        """The status and reject reason of the latest usage record: the last request's, once
        it is finished (a streamed answer reaches the client just before the request ends)."""
        deadline = time.monotonic() + 10  # bounds a failing test only
        while self._finished() <= self.finished_before and time.monotonic() < deadline:
            time.sleep(0.005)
        assert self.gateway.state.usage_writer.flush(timeout=10)
        with self.factory() as session:
            row = session.execute(
                select(UsageRecord.status, UsageRecord.reject_reason)
                .order_by(UsageRecord.id.desc())
                .limit(1)
            ).one()
        return row.status, row.reject_reason


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root: Path = tmp_path_factory.mktemp("contract")
    url = f"sqlite:///{root / 'tiergate.db'}"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    with factory.begin() as session:
        seed_defaults(session)
        crud.create_tenant(session, actor="test", name="acme", tier="standard")
        key = crud.create_key(session, actor="test", tenant="acme", secret=SECRET).plaintext
    settings = Settings(database_url=url, secret=SecretStr(SECRET), data_dir=root, redis_url=None)
    requests: list[dict[str, Any]] = []
    with (
        EngineThread([EngineSpec(PROFILE, "vllm-v1-priority", MODEL)]) as engines,
        GatewayThread(scripted_engine(requests)) as scripted,
    ):
        backends = [
            BackendSpec("emulated", engines[0].url, MODEL, PROFILE),
            BackendSpec("scripted", scripted.url, SCRIPTED, PROFILE),
        ]
        with GatewayThread(create_app(settings, backends=backends)) as gateway:
            yield Env(gateway, factory, key, requests)
    engine.dispose()


# ---- S1: both 200 answers, documented and true ----------------------------------------------


@pytest.mark.parametrize("path", list(GENERATION))
def test_generation_documents_a_json_answer_and_an_event_stream(
    openapi: dict[str, Any], path: str
) -> None:
    _, answer, chunk = GENERATION[path]
    content = openapi["paths"][path]["post"]["responses"]["200"]["content"]
    assert set(content) == {"application/json", "text/event-stream"}
    assert content["application/json"]["schema"] == {"$ref": f"#/components/schemas/{answer}"}
    event = content["text/event-stream"]["schema"]  # OpenAPI 3.1: one event (3.2's itemSchema)
    assert event["required"] == ["data"]
    payload = event["properties"]["data"]["else"]["contentSchema"]["anyOf"]
    assert {"$ref": f"#/components/schemas/{chunk}"} in payload
    assert {"$ref": "#/components/schemas/ErrorOut"} in payload


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 3}),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 3}),
    ],
)
def test_answers_have_the_documented_shapes(
    env: Env, openapi: dict[str, Any], path: str, body: dict[str, Any]
) -> None:
    _, answer, chunk = GENERATION[path]
    whole = env.post(path, body)
    assert whole.headers["content-type"].startswith("application/json")
    component(openapi, answer).validate(whole.json())

    streamed = env.post(path, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    *data, done = events(streamed.content)
    assert done == "[DONE]" and len(data) >= 3  # the tokens, then the usage chunk
    chunks = component(openapi, chunk)
    for payload in data:
        chunks.validate(json.loads(payload))
    assert json.loads(data[-1])["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("path", list(GENERATION))
def test_the_documented_examples_are_valid_and_served(
    env: Env, openapi: dict[str, Any], path: str
) -> None:
    """The request examples (what Swagger UI offers, what schemathesis sends first) are valid
    bodies, one answered whole and one streamed."""
    media = openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    body_schema = validator(openapi, media["schema"])
    kinds = set()
    for example in media["examples"].values():
        body = example["value"]
        body_schema.validate(body)
        response = env.post(path, {**body, "max_tokens": 2})
        assert response.status_code == 200, response.text
        kinds.add(response.headers["content-type"].split(";")[0])
    assert kinds == {"application/json", "text/event-stream"}


# ---- S2: an engine's errors in the gateway's dialect ----------------------------------------


def test_an_engines_refusal_is_worded_in_the_gateways_dialect(
    env: Env, openapi: dict[str, Any]
) -> None:
    """vLLM's ``"type": "BadRequestError", "code": 400`` reaches the client as OpenAI's (and
    the documented :class:`~gateway.errors.ErrorOut`): message, status and ``param`` kept;
    still the engine's refusal in the usage (``rejected``, ``upstream_rejected``)."""
    response = env.post(
        "/v1/chat/completions", {"model": SCRIPTED, "messages": CHAT, "user": "refuse"}
    )
    assert response.status_code == 400
    component(openapi, "ErrorOut").validate(response.json())
    assert response.json()["error"] == {
        "message": "top_k must be -1 or at least 1, got 0.",
        "type": "invalid_request_error",
        "param": "top_k",
        "code": "invalid_request",
    }
    assert env.last_usage() == ("rejected", "upstream_rejected")
    with pytest.raises(openai.BadRequestError) as info:  # what the SDK makes of it
        env.client().chat.completions.create(model=SCRIPTED, messages=CHAT, user="refuse")
    assert (info.value.code, info.value.param) == ("invalid_request", "top_k")


@pytest.mark.parametrize(
    ("script", "status", "code", "message"),
    [
        ("refuse-coded", 400, "context_length_exceeded", "too long"),  # a string code is kept
        ("refuse-422", 422, "invalid_request", '[{"loc": ["body", "x"], "msg": "bad"}]'),
        ("refuse-plain", 418, "invalid_request", "I'm a teapot"),
    ],
)
def test_other_refusals_keep_their_status_and_words(
    env: Env, openapi: dict[str, Any], script: str, status: int, code: str, message: str
) -> None:
    response = env.post(
        "/v1/chat/completions", {"model": SCRIPTED, "messages": CHAT, "user": script}
    )
    assert response.status_code == status
    component(openapi, "ErrorOut").validate(response.json())
    error = response.json()["error"]
    assert (error["type"], error["code"], error["message"]) == (
        "invalid_request_error",
        code,
        message,
    )
    documented = openapi["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert str(status) in documented or "4XX" in documented
    assert env.last_usage() == ("rejected", "upstream_rejected")


def test_a_stream_refused_in_its_first_event_is_the_engines_4xx(env: Env) -> None:
    """vLLM reports some refusals as the first event of a 200 stream: the client gets the 4xx
    (no stream had started), and the backend is not blamed (no failover, no breaker count)."""
    metrics = env.gateway.state.metrics.registry
    failures = ("tiergate_upstream_failures_total", {"backend": "scripted"})
    failed_before = metrics.get_sample_value(*failures) or 0.0
    before = len(env.engine_requests)
    body = {"model": SCRIPTED, "messages": CHAT, "user": "refuse-in-stream", "stream": True}
    response = env.post("/v1/chat/completions", body)
    assert response.status_code == 400 and response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert (error["code"], error["message"]) == (
        "invalid_request",
        "The decoder prompt cannot be empty",
    )
    assert len(env.engine_requests) == before + 1  # asked once
    assert (metrics.get_sample_value(*failures) or 0.0) == failed_before  # not blamed
    assert env.last_usage() == ("rejected", "upstream_rejected")


@pytest.mark.parametrize(
    ("script", "kind", "code"),
    [
        ("break-4xx", "invalid_request_error", "invalid_request"),
        ("break-5xx", "server_error", "engine_error"),
    ],
)
def test_an_error_event_mid_stream_is_worded_in_the_gateways_dialect(
    env: Env, openapi: dict[str, Any], script: str, kind: str, code: str
) -> None:
    body = {"model": SCRIPTED, "messages": CHAT, "user": script, "stream": True}
    response = env.post("/v1/chat/completions", body)
    assert response.status_code == 200
    first, error, done = events(response.content)
    chunks = component(openapi, "ChatCompletionChunk")
    chunks.validate(json.loads(first))
    component(openapi, "ErrorOut").validate(json.loads(error))
    assert not chunks.is_valid(json.loads(error))
    assert (json.loads(error)["error"]["type"], json.loads(error)["error"]["code"]) == (kind, code)
    assert done == "[DONE]"
    assert env.last_usage() == ("error", None)  # a stream the engine broke: failed, as before


@pytest.mark.parametrize(
    ("status", "content", "expected"),
    [
        (400, b'{"error": {"message": "m", "type": "BadRequestError", "param": "n", "code": 400}}',
         (400, "m", "n", "invalid_request")),
        (404, b'{"object": "error", "message": "no model", "type": "NotFoundError", "code": 404}',
         (404, "no model", None, "invalid_request")),  # vLLM's older, flat error
        (None, b'{"error": {"message": "m", "code": 503}}', (503, "m", None, "engine_error")),
        (None, b'{"error": {"message": "m", "type": "invalid_request_error", "code": "x"}}',
         (400, "m", None, "x")),
        (None, b'{"error": "gone"}', (500, "the engine answered HTTP 500 without a message",
                                      None, "engine_error")),
        (400, b'{"error": {"message": "\\ud800", "code": 400}}', (400, "\\ud800", None,
                                                                   "invalid_request")),
        (400, b"[" * 100_000, (400, "[" * 2000, None, "invalid_request")),
    ],
)  # fmt: skip
def test_engine_error_wording(
    status: int | None, content: bytes, expected: tuple[int, str, str | None, str]
) -> None:
    error = engine_error(status, content)
    assert (error.status, error.message, error.param, error.code) == expected
    error.response()  # a lone surrogate would make this raise (UTF-8 cannot carry it)


# ---- S2: what vLLM refuses, refused before it reaches an engine ------------------------------


@dataclass
class App:
    client: TestClient
    key: str  # a tenant's, for /v1

    def v1(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        headers = {"authorization": f"Bearer {self.key}"}
        response = self.client.post(path, json=body, headers=headers)
        return response.status_code, response.json().get("error", {})

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"authorization": f"Bearer {ADMIN_KEY}"}
        return self.client.request(method, f"/admin/v1{path}", json=body, headers=headers)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """The whole app with no backends: a `/v1` body that passes every check ends in a 404."""
    root: Path = tmp_path_factory.mktemp("contract-admin")
    url = f"sqlite:///{root / 'tiergate.db'}"
    engine, key = seed_database(url, SECRET)
    settings = app_settings(url, root, SECRET, ADMIN_KEY)
    with TestClient(create_app(settings, backends=[])) as client:
        yield App(client, key)
    engine.dispose()


V1_CASES: list[tuple[str, dict[str, Any], str | None, str | None]] = [
    # path, body, the param and code of its 400 (None: it passes, and meets no backend)
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]},
     "messages.0.role", "invalid_value"),
    ("/v1/chat/completions", {"messages": [{"role": 5, "content": "x"}]},
     "messages.0.role", "invalid_type"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"text": "x"}]}]},
     "messages.0.content", "missing_required_parameter"),
    ("/v1/chat/completions", {"messages": CHAT, "top_p": 0.0}, "top_p", "invalid_value"),
    ("/v1/chat/completions", {"messages": CHAT, "seed": 2**64}, "seed", "invalid_value"),
    ("/v1/completions", {"prompt": ""}, "prompt", "invalid_value"),
    ("/v1/completions", {"prompt": ["", ""]}, "prompt", "invalid_value"),
    ("/v1/completions", {"prompt": ["a", ""]}, "prompt", "invalid_value"),
    ("/v1/completions", {"prompt": []}, "prompt", "invalid_value"),
    ("/v1/completions", {"prompt": [[]]}, "prompt", "invalid_value"),
    ("/v1/completions", {"prompt": [[1], []]}, "prompt", "invalid_value"),
    *[
        ("/v1/chat/completions", {"messages": [{"role": role, "content": "x"}]}, None, None)
        for role in ROLES
    ],
    ("/v1/chat/completions", {"messages": CHAT, "top_p": 1e-9, "seed": -(2**63)}, None, None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": "u"}}]}]},
     None, None),
    ("/v1/completions", {"prompt": ["a", "b"]}, None, None),
    ("/v1/completions", {"prompt": [1, 2]}, None, None),
    ("/v1/completions", {"prompt": [[1], [2, 3]]}, None, None),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 8.0}, None, None),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "param", "code"), V1_CASES)
def test_what_vllm_refuses_is_refused_up_front_as_documented(
    app: App,
    openapi: dict[str, Any],
    path: str,
    body: dict[str, Any],
    param: str | None,
    code: str | None,
) -> None:
    """400 naming the field, before any limit or backend is spent; and the documented body
    schema says the same (a body it allows is never refused by the checks, and vice versa)."""
    body = {"model": SCRIPTED, **body}
    status, error = app.v1(path, body)
    if code is None:
        assert (status, error["code"]) == (404, "model_not_found")  # passed every check
    else:
        assert (status, error["param"], error["code"]) == (400, param, code)
    schema = openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    assert validator(openapi, schema["schema"]).is_valid(body) is (code is None)


# ---- S3: the /v1 bodies and SLO headers, documented -----------------------------------------


@pytest.mark.parametrize("path", list(GENERATION))
def test_v1_bodies_and_slo_headers_are_documented(openapi: dict[str, Any], path: str) -> None:
    operation = openapi["paths"][path]["post"]
    body = GENERATION[path][0]
    assert operation["requestBody"]["required"] is True
    documented = operation["requestBody"]["content"]["application/json"]["schema"]
    assert documented == {"$ref": f"#/components/schemas/{body}"}
    headers = {p["name"]: p for p in operation["parameters"] if p["in"] == "header"}
    workflow = {WORKFLOW_ID_HEADER, WORKFLOW_DEADLINE_HEADER}
    assert set(headers) == {TTFT_HEADER, TPOT_HEADER, DEADLINE_HEADER} | workflow
    milliseconds = {"type": "number", "minimum": MIN_SLO_MS, "maximum": MAX_SLO_MS}
    for name, header in headers.items():
        assert header["required"] is False and header["description"]
        if name != WORKFLOW_ID_HEADER:
            assert header["schema"] == milliseconds, name
    workflow_id = headers[WORKFLOW_ID_HEADER]["schema"]
    assert workflow_id["type"] == "string"
    pattern = re.compile(workflow_id["pattern"])  # the id kinds.py accepts, anchored
    for value in ("wf-1", "a.b:c_d", "x" * 128, "has space", "x" * 129, "{tag}", ""):
        assert bool(pattern.search(value)) is bool(WORKFLOW_ID_PATTERN.fullmatch(value)), value
    # the codes of the workflow path are in the documented responses
    responses = operation["responses"]
    assert "unknown_workflow" in responses["400"]["description"]
    assert "workflow_expired" in responses["409"]["description"]


def test_the_documented_bodies_are_the_checked_models(openapi: dict[str, Any]) -> None:
    """The schemas are the pydantic models the proxy validates with (unknown fields allowed:
    they pass on to the engine), and every model of :data:`V1_SCHEMAS` is there."""
    schemas = openapi["components"]["schemas"]
    assert {model.__name__ for model, _ in V1_SCHEMAS} <= set(schemas)
    for model in (ChatBody, CompletionBody):
        documented = schemas[model.__name__]
        assert documented["additionalProperties"] is True
        assert set(documented["properties"]) == set(model.model_fields)
    limits = schemas["ChatBody"]["properties"]["max_tokens"]["anyOf"][0]
    assert (limits["minimum"], limits["maximum"]) == (1, 2**31 - 1)  # not pydantic's "ge"/"le"


def test_the_proxy_still_reads_the_raw_body(app: App) -> None:
    """Documenting the body did not make FastAPI parse it: the gateway's own checks answer."""
    headers = {"authorization": f"Bearer {app.key}", "content-type": "application/json"}
    for content, code in ((b'{"model": "x",', "invalid_json"), (b"[1]", "invalid_type")):
        response = app.client.post("/v1/chat/completions", content=content, headers=headers)
        assert (response.status_code, response.json()["error"]["code"]) == (400, code)
    response = app.client.post("/v1/chat/completions", content=b"[1]")
    assert response.status_code == 401  # the key first, then the body


# ---- S4: the bearer scheme ------------------------------------------------------------------


def test_every_v1_operation_declares_the_bearer_scheme(openapi: dict[str, Any]) -> None:
    scheme = openapi["components"]["securitySchemes"][V1_SECURITY]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for path, operations in openapi["paths"].items():
        for operation in operations.values():
            if path.startswith("/v1/"):
                assert operation["security"] == [{V1_SECURITY: []}], path
                assert "401" in operation["responses"], path
            elif path.startswith("/admin/v1/"):
                assert operation["security"] == [{"admin key": []}], path


# ---- S5, S6: the admin bodies document the data layer's rules -------------------------------


def _properties(openapi: dict[str, Any], model: str) -> dict[str, Any]:
    """A model's properties, each as its non-null member (``X | None`` is an ``anyOf``)."""
    out = {}
    for name, prop in openapi["components"]["schemas"][model]["properties"].items():
        members = [m for m in prop.get("anyOf", [prop]) if m.get("type") != "null"]
        member = members[0] if len(members) == 1 else prop
        out[name] = {k: v for k, v in member.items() if k not in ("title", "default")}
    return out


def test_admin_inputs_document_the_data_layers_rules(openapi: dict[str, Any]) -> None:
    name = {"type": "string", "minLength": 1, "maxLength": 64, "pattern": NAME_PATTERN.pattern}
    for model in ("TierCreate", "TierUpdate", "TenantCreate", "TenantUpdate", "BackendCreate",
                  "BackendUpdate", "ProfileImport"):  # fmt: skip
        assert _properties(openapi, model)["name"] == name, model
    assert _properties(openapi, "TierCreate")["description"]["maxLength"] == 1000
    assert _properties(openapi, "KeyCreate")["name"]["maxLength"] == 128
    backend = _properties(openapi, "BackendCreate")
    assert backend["kind"]["enum"] == list(BACKEND_KINDS)
    assert backend["base_url"]["maxLength"] == 512 and "pattern" in backend["base_url"]
    assert (backend["model"]["minLength"], backend["model"]["maxLength"]) == (1, 256)
    assert _properties(openapi, "TenantCreate")["status"]["enum"] == list(TENANT_STATUSES)
    limit = _properties(openapi, "TierCreate")["rpm_limit"]
    assert (limit["type"], limit["minimum"], limit["maximum"]) == ("integer", 1, 2**31 - 1)


BACKEND = {"base_url": "http://10.0.0.1:8000", "model": MODEL, "profile": PROFILE}
ADMIN_CASES: list[tuple[str, str, dict[str, Any], int, str | None, str | None]] = [
    # path, schema, body, status, and the 400's param and code
    ("/tiers", "TierCreate", {"name": "bad name"}, 400, "name", "invalid_value"),
    ("/tiers", "TierCreate", {"name": "-x"}, 400, "name", "invalid_value"),
    ("/tiers", "TierCreate", {"name": "x" * 65}, 400, "name", "invalid_value"),
    ("/tiers", "TierCreate", {"name": 5}, 400, "name", "invalid_type"),
    ("/tiers", "TierCreate", {"description": "x" * 1001}, 400, "description", "invalid_value"),
    ("/tiers", "TierCreate", {"rpm_limit": 2.5}, 400, "rpm_limit", "invalid_type"),
    ("/tiers", "TierCreate", {"rpm_limit": 0.0}, 400, "rpm_limit", "invalid_value"),
    ("/tiers", "TierCreate", {"name": "s6", "rpm_limit": 146414.0}, 201, None, None),
    ("/tiers", "TierCreate", {"name": "a.b_c-9", "description": "x" * 1000}, 201, None, None),
    ("/backends", "BackendCreate", {"name": "b1", "kind": "triton"}, 400, "kind", "invalid_value"),
    ("/backends", "BackendCreate", {"name": "b1", "kind": 5}, 400, "kind", "invalid_type"),
    ("/backends", "BackendCreate", {"name": "b1", "base_url": "ftp://h"}, 400, "base_url",
     "invalid_value"),
    ("/backends", "BackendCreate", {"name": "b1", "base_url": "http://[x"}, 400, "base_url",
     "invalid_value"),  # urlsplit raises on it: was a 500
    ("/backends", "BackendCreate", {"name": "b1", "model": "  "}, 400, "model", "invalid_value"),
    ("/backends", "BackendCreate", {"name": "b1", "base_url": "http://[::1]:8000/"}, 201, None,
     None),
    ("/tenants", "TenantCreate", {"name": "t1", "tier": "standard", "status": "gone"}, 400,
     "status", "invalid_value"),
    ("/tenants", "TenantCreate", {"name": "t1", "tier": "standard", "status": "suspended",
                                  "max_concurrency": 4.0}, 201, None, None),
    ("/keys", "KeyCreate", {"tenant": "acme", "name": "k" * 129}, 400, "name", "invalid_value"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "model", "body", "status", "param", "code"), ADMIN_CASES)
def test_admin_bodies_are_refused_as_documented(
    app: App,
    openapi: dict[str, Any],
    path: str,
    model: str,
    body: dict[str, Any],
    status: int,
    param: str | None,
    code: str | None,
) -> None:
    """A value the data layer would refuse is refused by the documented schema too (400
    ``invalid_value`` naming the field, a wrong type ``invalid_type``); integers are JSON's."""
    if path == "/tiers":
        body = {"name": "t", "weight": 1.0, "ttft_ms": 500.0, "tpot_ms": 50.0, **body}
    elif path == "/backends":
        body = {**BACKEND, **body}
    response = app.admin("POST", path, body)
    assert response.status_code == status, response.text
    if code is not None:
        error = response.json()["error"]
        assert (error["param"], error["code"]) == (param, code)
    documented = validator(openapi, {"$ref": f"#/components/schemas/{model}"})
    assert documented.is_valid(body) is (status == 201)


def test_admin_rules_are_worded_for_people(app: App) -> None:
    body = {"name": "bad name", "weight": 1.0, "ttft_ms": 500.0, "tpot_ms": 50.0}
    error = app.admin("POST", "/tiers", body).json()["error"]
    assert error["message"] == (
        "name: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit, "
        "not digits only (a number is an id)"
    )
    error = app.admin("PATCH", "/backends/nope", {"kind": "triton"}).json()["error"]
    assert error["message"] == "kind: Input should be 'vllm', 'vllm-ascend' or 'emulated'"


def test_admin_integers_are_json_integers(app: App) -> None:
    """S6: ``146414.0`` is the integer JSON Schema says it is, stored and answered as 146414;
    a fraction is still the wrong type, as on `/v1`."""
    body = {"name": "whole", "weight": 1.0, "ttft_ms": 500.0, "tpot_ms": 50.0, "rpm_limit": 9.0}
    tier = app.admin("POST", "/tiers", body).json()
    assert tier["rpm_limit"] == 9 and isinstance(tier["rpm_limit"], int)
    patched = app.admin("PATCH", "/tiers/whole", {"tpm_limit": 146414.0}).json()
    assert patched["tpm_limit"] == 146414 and isinstance(patched["tpm_limit"], int)
    tenant = app.admin("POST", "/tenants", {"name": "by-id", "tier": float(tier["id"])})
    assert tenant.status_code == 201 and tenant.json()["tier"] == "whole"  # an id, as 5.0
    fraction = app.admin("POST", "/tenants", {"name": "half", "tier": tier["id"] + 0.5})
    error = fraction.json()["error"]
    assert (fraction.status_code, error["param"], error["code"]) == (400, "tier", "invalid_type")
