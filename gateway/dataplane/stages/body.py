"""Parse and check the body (400): nesting bounded before parsing, then OpenAI's types."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import ValidationError

from gateway.app.schemas import ChatBody, CompletionBody
from gateway.errors import invalid_body, parse_json_body

if TYPE_CHECKING:
    from starlette.requests import Request

    from gateway.app.proxy import Job


async def parse(job: Job, http: Request) -> None:
    """The body read, validated and its sizes taken: the prompt's tokens and the expected output
    (``max_tokens``, else ``default_max_tokens``) that the limits and shedding price."""
    payload = parse_json_body(await http.body())  # nesting bounded: never a RecursionError
    schema = ChatBody if job.kind == "chat" else CompletionBody
    try:  # a body that is not an object fails here too (``invalid_type``)
        body = schema.model_validate(payload)
    except ValidationError as exc:
        raise invalid_body(exc) from None
    job.parsed = body
    job.body = payload
    job.model = body.model
    job.stream = body.stream
    job.include_usage = body.include_usage
    job.prompt_tokens, job.prompt_lengths = body.prompt_sizes()
    expected = body.expected_output()
    job.expected_output = expected or job.state.settings.default_max_tokens
