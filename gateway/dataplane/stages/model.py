"""What the model's backends can serve: the model group (404), the context length (400
``context_length_exceeded``, :mod:`gateway.app.context`) and the output-length prediction."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.app.context import check_context, context_window
from gateway.app.kinds import single_sequence
from gateway.errors import ApiError

if TYPE_CHECKING:
    from starlette.requests import Request

    from gateway.app.proxy import Job


def group(job: Job, http: Request) -> None:
    """The backends that serve the requested model, or 404 ``model_not_found``."""
    assert job.model is not None
    found = job.state.pool.group(job.model)
    if found is None:
        raise ApiError(
            404,
            f"The model `{job.model}` does not exist.",
            code="model_not_found",
            param="model",
        )
    job.group = found


def context(job: Job, http: Request) -> None:
    """400 ``context_length_exceeded`` for a request that certainly exceeds the backends'
    context, before any limit or SLO is considered; ``job.fits`` False when only the gateway's
    estimate says it does (shedding then leaves the verdict to the engine's tokenizer)."""
    assert job.group is not None and job.parsed is not None
    window = context_window(job.group)  # what the pool's scrapes learned: nothing to wait for
    if window is None:
        return  # unknown: the engine decides, as it always did (``job.fits`` stays True)
    body = job.parsed
    job.fits = check_context(
        window,
        job.prompt_lengths,  # counted once, by the body stage
        body.expected_output(),
        exact_prompt=body.exact_prompt,
        prompt_param=body.prompt_param,
        output_param=body.output_param(),
    )


def length(job: Job, http: Request) -> None:
    """Start predicting the output length beside admission, never before it; the features are
    kept for the request's length sample (``TIERGATE_LENGTHS_LEARN``)."""
    state, body = job.state, job.parsed
    assert body is not None
    features = state.kinds.length_features(
        body, tenant=job.identity.tenant_name, prompt_tokens=job.prompt_tokens
    )
    job.length = state.kinds.predict_length(features)
    if state.length_samples is not None and single_sequence(body):
        job.length_features = features
