"""How well the shared estimator knows a real vLLM engine: step-time MAPE and routed TTFT.

One real `vllm serve` (vLLM's CPU build, the tiny model of .ci/real_engine.sh, TiergateScheduler
with SlideBatching, its steps logged with ``TIERGATE_STEP_LOG``) behind the gateway, which is
fed a Poisson stream of streamed chats with mixed prompt (64–1,536 tokens) and output (8–160
tokens) lengths. Then, side by side on the same recorded steps (the last 30% held out, see
``priority.profiles.from_steps``): the starting profile as it is, corrected by beta only, the
engine's online refit replayed (each step predicted before it is learned from), and one offline
fit — and, from the gateway, the router's predicted over measured dispatch-to-first-token time
per request, in the first and the second half of the run (the router takes the engine's refitted
estimator from its scrapes).

    python bench/real_engine_estimator.py [--duration 90] [--rate 4] [--prior h100-llama3.1-8b]

Needs the environment of .ci/real_engine.sh. Prints one table; ``--json`` writes the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from real_engine_common import poisson_arrivals, replay, seed

from gateway.app import BackendSpec, create_app
from gateway.app.server import GatewayThread
from gateway.settings import Settings
from priority.profiles import load_profile
from priority.profiles.from_steps import evaluate
from priority.profiles.steps import read_steps
from tests.real_engine.vllm_server import MODEL, VllmServer, missing

SECRET = "bench-estimator-secret"


class RatioRecorder:
    """Stands in for the gateway's TTFT-prediction histogram: keeps each ratio with its time."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []

    def labels(self, *_: str) -> RatioRecorder:
        return self

    def observe(self, value: float) -> None:
        self.samples.append((time.monotonic(), value))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=90.0, help="seconds of load")
    parser.add_argument("--rate", type=float, default=4.0, help="requests per second")
    parser.add_argument("--prior", default="h100-llama3.1-8b", help="the engine's start profile")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the numbers here")
    args = parser.parse_args(argv)
    reason = missing()
    if reason is not None:
        print(reason, file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="estimator-bench-"))
    steps_path = work / "steps.csv"
    server = VllmServer("engine", "slide", core=0, log_dir=work)
    env = server.environment()
    env.update(TIERGATE_STEP_LOG=str(steps_path), TIERGATE_PROFILE=args.prior)
    server.environment = lambda: env  # type: ignore[method-assign]
    server.start()
    try:
        server.wait_ready()
        url = f"sqlite:///{work / 'tiergate.db'}"
        keys = seed(url, SECRET, [("bench", "standard")])
        arrivals = poisson_arrivals(
            args.duration,
            args.rate,
            [("bench", 1.0)],
            prompt_words=(6, 150),
            max_tokens=(8, 160),
            seed=args.seed,
        )
        settings = Settings(
            database_url=url, secret=SecretStr(SECRET), data_dir=work, redis_url=None
        )
        app = create_app(settings, backends=[BackendSpec("engine", server.url, MODEL, args.prior)])
        with GatewayThread(app) as gateway:
            recorder = RatioRecorder()
            gateway.state.metrics.ttft_prediction = recorder  # type: ignore[assignment]
            started = time.monotonic()
            served = asyncio.run(replay([gateway.base_url], [keys], arrivals))
    finally:
        server.stop()
    steps = list(read_steps(steps_path))
    errors = evaluate(steps, load_profile(args.prior).coefficients)
    half = started + args.duration / 2
    first = [r for t, r in recorder.samples if t < half]
    second = [r for t, r in recorder.samples if t >= half]
    result: dict[str, Any] = {
        "requests": served,
        "steps": errors.steps,
        "heldout_steps": errors.heldout,
        "mape_profile": errors.profile,
        "mape_beta_only": errors.beta,
        "mape_online_refit": errors.online,
        "mape_offline_fit": errors.offline,
        "mape_noise_floor": errors.floor,
        "ttft_measured_over_predicted_p50_first_half": statistics.median(first) if first else None,
        "ttft_measured_over_predicted_p50_second_half": statistics.median(second)
        if second
        else None,
        "ttft_samples": [len(first), len(second)],
    }
    print(
        f"{served} requests, {errors.steps} steps ({errors.heldout} held out), prior {args.prior}"
    )
    print("step-time MAPE on held-out steps:")
    for name in ("profile", "beta_only", "online_refit", "offline_fit", "noise_floor"):
        print(f"  {name:<14} {result['mape_' + name]:7.1%}")
    for part in ("first", "second"):
        value = result[f"ttft_measured_over_predicted_p50_{part}_half"]
        text = "n/a" if value is None else f"{value:.3f}"
        print(f"routed TTFT measured/predicted, p50, {part} half: {text}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
