"""One error dialect: the same mistake gets the same status, ``type`` and ``code`` on the data
plane (``/v1``) and on the admin API (``/admin/v1``), in OpenAI's envelope.

One app (``create_app`` with no backends: every request here fails before routing), a tenant's
key for ``POST /v1/chat/completions`` and the admin key for ``POST /admin/v1/tiers``. Each
mistake is made once per endpoint, with each endpoint's own fields where the bodies must differ.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from seeded_app import app_settings, seed_database

from gateway.app import create_app
from gateway.errors import ApiError, ErrorOut, describe_validation_error, invalid_body
from gateway.jsonbody import MAX_JSON_DEPTH

SECRET = "dialect-test-secret"
ADMIN_KEY = "dialect-admin-key"
CHAT = {"model": "qwen2-7b", "messages": [{"role": "user", "content": "hi"}]}
TIER = {"name": "gold", "weight": 3.0, "ttft_ms": 800.0, "tpot_ms": 40.0}

Body = dict[str, Any] | list[Any] | bytes  # bytes are sent as they are


def _nested(depth: int) -> bytes:
    """Arrays ``depth`` deep (inside a body's object: one level more)."""
    return b"[" * depth + b"]" * depth


# mistake: the /v1 body, the admin body, the status and code both answer, and each one's param
MISTAKES: dict[str, tuple[Body, Body, int, str, str | None, str | None]] = {
    "wrong type": (
        {**CHAT, "max_tokens": "many"},
        {**TIER, "rpm_limit": "many"},
        *(400, "invalid_type", "max_tokens", "rpm_limit"),
    ),
    "missing field": (
        {"model": "qwen2-7b"},
        {"name": "gold", "weight": 3.0, "ttft_ms": 800.0},
        *(400, "missing_required_parameter", "messages", "tpot_ms"),
    ),
    "out of range": (
        {**CHAT, "max_tokens": 0},
        {**TIER, "rpm_limit": 2**40},
        *(400, "invalid_value", "max_tokens", "rpm_limit"),
    ),
    "out of range, by the data layer's rule on admin": (
        {**CHAT, "max_tokens": -1},
        {**TIER, "min_ttft_ms": 900.0},  # a minimum above the tier's default TTFT (800)
        *(400, "invalid_value", "max_tokens", "min_ttft_ms"),
    ),
    "out of OpenAI's range, or the gain's bounds": (
        {**CHAT, "temperature": 3},
        {**TIER, "weight": 1e308},
        *(400, "invalid_value", "temperature", "weight"),
    ),
    "not a finite number": (  # Python's json writes and reads Infinity; JSON has no such value
        {**CHAT, "temperature": float("inf")},
        {**TIER, "weight": float("inf")},
        *(400, "invalid_value", "temperature", "weight"),
    ),
    "a string for a boolean": (
        {**CHAT, "stream": "yes"},
        {**TIER, "best_effort_allowed": "yes"},
        *(400, "invalid_type", "stream", "best_effort_allowed"),
    ),
    "not an object": ([1, 2], [1, 2], 400, "invalid_type", None, None),
    "not JSON": (b'{"model": "qwen2-7b",', b'{"name": "gold",', 400, "invalid_json", None, None),
    "not UTF-8": (b'{"model": "\xff"}', b'{"name": "\xff"}', 400, "invalid_json", None, None),
    "empty body": (b"", b"", 400, "invalid_json", None, None),
    # a parser recurses once per level: thousands of them are a RecursionError, and a few
    # hundred parse, then overflow whatever walks them next; both are refused before parsing
    "nested far too deeply": (
        b'{"model": "qwen2-7b", "messages": ' + _nested(5000) + b"}",
        b'{"name": "gold", "description": ' + _nested(5000) + b"}",
        *(400, "invalid_json", None, None),
    ),
    "nested past the bound": (
        b'{"model": "qwen2-7b", "messages": ' + _nested(MAX_JSON_DEPTH) + b"}",
        b'{"name": "gold", "description": ' + _nested(MAX_JSON_DEPTH) + b"}",
        *(400, "invalid_json", None, None),
    ),
    "a number of more digits than Python converts": (
        b'{"model": "qwen2-7b", "max_tokens": ' + b"1" * 5000 + b"}",
        b'{"name": "gold", "rpm_limit": ' + b"1" * 5000 + b"}",
        *(400, "invalid_json", None, None),
    ),
}


def _post(client: TestClient, path: str, key: str, body: Body) -> dict[str, Any]:
    """Send ``body`` as JSON (bytes as they are); the response's status and its error."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    response = client.post(path, content=content, headers=headers)
    payload = response.json()
    assert set(payload) == {"error"}, payload
    assert ErrorOut.model_validate(payload).error.message
    return {"status": response.status_code, **payload["error"]}


@dataclass
class Planes:
    client: TestClient
    key: str  # a tenant's API key, for /v1

    def v1(self, body: Body) -> dict[str, Any]:
        return _post(self.client, "/v1/chat/completions", self.key, body)

    def admin(self, body: Body) -> dict[str, Any]:
        return _post(self.client, "/admin/v1/tiers", ADMIN_KEY, body)


@pytest.fixture(scope="module")
def planes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Planes]:
    root: Path = tmp_path_factory.mktemp("dialect")
    url = f"sqlite:///{root / 'tiergate.db'}"
    engine, key = seed_database(url, SECRET)
    settings = app_settings(url, root, SECRET, ADMIN_KEY)
    with TestClient(create_app(settings, backends=[])) as client:
        yield Planes(client, key)
    engine.dispose()


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_the_same_mistake_is_answered_alike_on_both_planes(planes: Planes, mistake: str) -> None:
    v1_body, admin_body, status, code, v1_param, admin_param = MISTAKES[mistake]
    v1, admin = planes.v1(v1_body), planes.admin(admin_body)
    for error in (v1, admin):
        got = (error["status"], error["type"], error["code"])
        assert got == (status, "invalid_request_error", code), error
    assert (v1["param"], admin["param"]) == (v1_param, admin_param)


def test_unknown_fields_are_refused_by_the_admin_api_and_passed_on_by_v1(planes: Planes) -> None:
    admin = planes.admin({**TIER, "colour": "gold"})
    assert (admin["status"], admin["code"], admin["param"]) == (400, "unknown_parameter", "colour")
    # /v1 forwards fields it does not know to the engine (new OpenAI/vLLM parameters work
    # without a gateway release): this body passes the checks and fails on the model instead.
    v1 = planes.v1({**CHAT, "colour": 1})
    assert (v1["status"], v1["code"]) == (404, "model_not_found")


def test_query_parameters_are_worded_like_body_fields(planes: Planes) -> None:
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    response = planes.client.get("/admin/v1/audit", params={"limit": 0}, headers=headers)
    error = response.json()["error"]
    assert (response.status_code, error["code"], error["param"]) == (400, "invalid_value", "limit")
    assert error["message"].startswith("limit: ")


class _Part(BaseModel):
    role: str


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    size: int | None = None
    ref: str | int | None = None
    tier: str | Annotated[int, Field(ge=1)] | None = None
    parts: list[_Part] | None = None


@pytest.mark.parametrize(
    ("body", "message", "param", "code"),
    [
        ({"name": 1}, "name: Input should be a valid string", "name", "invalid_type"),
        ({}, "name: Field required", "name", "missing_required_parameter"),
        ({"name": "a", "x": 1}, "x: Extra inputs are not permitted", "x", "unknown_parameter"),
        # a union's members ("str", "int") are not part of the field's name
        ({"name": "a", "ref": [1]}, "ref: Input should be a valid string", "ref", "invalid_type"),
        # the member whose type matched says what is wrong
        (
            {"name": "a", "tier": 0},
            "tier: Input should be greater than or equal to 1",
            *("tier", "invalid_value"),
        ),
        (
            {"name": "a", "size": "1", "x": 2},
            "size: Input should be a valid integer (and 1 more error)",
            *("size", "invalid_type"),
        ),
        (
            {"name": "a", "parts": [{}]},
            "parts.0.role: Field required",
            *("parts.0.role", "missing_required_parameter"),
        ),
        ("text", "the request body must be a JSON object", None, "invalid_type"),
    ],
)
def test_the_formatter_names_the_field_without_union_members(
    body: Any, message: str, param: str | None, code: str
) -> None:
    with pytest.raises(ValidationError) as info:
        _Strict.model_validate(body)
    error = invalid_body(info.value)
    assert (error.message, error.param, error.code, error.status) == (message, param, code, 400)
    assert describe_validation_error(info.value) == (message, param)


def test_the_envelope_matches_its_documented_model() -> None:
    error = ApiError(429, "slow down", code="rate_limit_rpm", headers={"retry-after": "1"})
    assert ErrorOut.model_validate(error.body()).model_dump() == error.body()
    assert error.body()["error"]["type"] == "rate_limit_exceeded"
    assert error.sse_event() == b"data: " + json.dumps(error.body()).encode() + b"\n\n"


@pytest.mark.parametrize("coding", ["gzip", "deflate, gzip", "br"])
def test_a_compressed_body_is_415_alike_everywhere(planes: Planes, coding: str) -> None:
    """A body sent with a ``Content-Encoding`` is refused in the dialect, on the data plane,
    the admin API and the dashboard's forms, naming the header: never a misleading
    "utf-8 codec" 400."""
    import gzip

    for path, key, body in (
        ("/v1/chat/completions", planes.key, CHAT),
        ("/admin/v1/tiers", ADMIN_KEY, TIER),
        ("/ui/login", None, {"credential": "x"}),
    ):
        headers = {"content-type": "application/json", "content-encoding": coding}
        if key is not None:
            headers["authorization"] = f"Bearer {key}"
        response = planes.client.post(
            path, content=gzip.compress(json.dumps(body).encode()), headers=headers
        )
        assert response.status_code == 415, (path, response.text)
        error = response.json()["error"]
        assert (error["type"], error["code"]) == (
            "invalid_request_error",
            "unsupported_content_encoding",
        ), error
        assert error["param"] == "content-encoding" and "uncompressed" in error["message"]
        assert response.headers["accept-encoding"] == "identity"
    plain = planes.client.post(
        "/admin/v1/tiers",
        json={**TIER, "name": "plain"},
        headers={"authorization": f"Bearer {ADMIN_KEY}", "content-encoding": "identity"},
    )
    assert plain.status_code == 201, plain.text
    planes.client.delete("/admin/v1/tiers/plain", headers={"authorization": f"Bearer {ADMIN_KEY}"})
