"""``tiergate engine-sim``: serve one emulated engine (mounted by :mod:`tiergate_cli`)."""

from __future__ import annotations

from typing import Annotated

import typer
import uvicorn

from engine_emulated.app import DEFAULT_MAX_MODEL_LEN, create_engine_app
from priority.policies import POLICY_NAMES
from priority.profiles import available_profiles, load_profile


def engine_sim_command(
    profile: Annotated[
        str, typer.Option(help=f"Latency profile: {', '.join(available_profiles())} or a path.")
    ],
    policy: Annotated[str, typer.Option(help=f"Engine policy: {', '.join(POLICY_NAMES)}.")],
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    model: Annotated[
        str | None, typer.Option(help="Served model name (default: the profile's model).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of step-time noise and output lengths.")] = 0,
    noise: Annotated[
        float, typer.Option(help="Step-time noise sigma (mean-1 lognormal factor); 0 = exact.")
    ] = 0.0,
    time_scale: Annotated[
        float, typer.Option(help="Run this many times faster than the profile (1 = real time).")
    ] = 1.0,
    max_model_len: Annotated[
        int, typer.Option(help="Context length in tokens (capped by the KV capacity).")
    ] = DEFAULT_MAX_MODEL_LEN,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    fault_injection: Annotated[
        bool,
        typer.Option(
            help="Serve POST /fault-injection to make this engine hang, freeze, stall, send "
            "garbage or crash on demand (tests and drills only)."
        ),
    ] = False,
) -> None:
    """Serve an emulated vLLM engine: OpenAI API, vLLM metrics, timing from a latency profile."""
    try:
        resolved = load_profile(profile)
    except (KeyError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--profile") from None
    if policy not in POLICY_NAMES:
        raise typer.BadParameter(
            f"unknown policy {policy!r}; known: {', '.join(POLICY_NAMES)}", param_hint="--policy"
        )
    if not (noise >= 0):
        raise typer.BadParameter("must be >= 0", param_hint="--noise")
    if not (time_scale > 0):
        raise typer.BadParameter("must be > 0", param_hint="--time-scale")
    app = create_engine_app(
        resolved,
        policy,
        model_name=model or resolved.model,
        seed=seed,
        noise_sigma=noise,
        time_scale=time_scale,
        max_model_len=max_model_len,
        fault_injection=fault_injection,
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
