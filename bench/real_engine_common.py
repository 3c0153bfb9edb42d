"""What the real-engine benches share: a seeded gateway database and a Poisson chat load.

The engines are real `vllm serve` processes (``tests/real_engine/vllm_server.py``, the environment
of ``.ci/real_engine.sh``); the gateway runs in-process in front of them.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from gateway.db import crud  # noqa: E402
from gateway.db.models import Base  # noqa: E402
from gateway.db.seed import seed_defaults  # noqa: E402
from gateway.db.session import make_engine, make_session_factory  # noqa: E402
from tests.real_engine.vllm_server import MODEL  # noqa: E402

WORD = "value = compute(alpha, beta) + offset\n"
"""About 10 tokens of the tiny model's tokenizer: prompts are this, repeated."""


def seed(url: str, secret: str, tenants: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Create the schema at ``url`` with the default tiers and ``(tenant, tier)`` pairs; each
    tenant's new API key by name."""
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    keys = {}
    with make_session_factory(engine).begin() as session:
        seed_defaults(session)
        for name, tier in tenants:
            crud.create_tenant(session, actor="bench", name=name, tier=tier)
            keys[name] = crud.create_key(
                session, actor="bench", tenant=name, secret=secret
            ).plaintext
    engine.dispose()
    return keys


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float
    tenant: str
    prompt_words: int
    max_tokens: int


def poisson_arrivals(
    duration_s: float,
    rate: float,
    tenants: Sequence[tuple[str, float]],
    *,
    prompt_words: tuple[int, int],
    max_tokens: tuple[int, int],
    seed: int = 0,
) -> list[Arrival]:
    """One stream of arrivals (``tenants``: name and share of the rate), replayable against
    several gateways at once."""
    rng = random.Random(seed)
    names = [name for name, _ in tenants]
    weights = [share for _, share in tenants]
    arrivals, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return arrivals
        arrivals.append(
            Arrival(
                t,
                rng.choices(names, weights)[0],
                rng.randint(*prompt_words),
                rng.randint(*max_tokens),
            )
        )


async def replay(
    base_urls: Sequence[str], keys: Sequence[dict[str, str]], arrivals: Sequence[Arrival]
) -> int:
    """Send every arrival to every gateway at its time (streamed, ``ignore_eos``); how many
    requests ended (any status)."""
    finished = 0

    async def one(client: httpx.AsyncClient, base: str, key: str, arrival: Arrival) -> None:
        nonlocal finished
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": WORD * arrival.prompt_words}],
            "max_tokens": arrival.max_tokens,
            "stream": True,
            "ignore_eos": True,
        }
        headers = {"authorization": f"Bearer {key}"}
        try:
            url = f"{base}/chat/completions"
            async with client.stream("POST", url, json=body, headers=headers) as response:
                async for _ in response.aiter_lines():
                    pass
        except httpx.HTTPError:
            pass
        finished += 1

    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:
        start = time.monotonic()
        tasks = []
        for arrival in arrivals:
            delay = start + arrival.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            for base, by_tenant in zip(base_urls, keys, strict=True):
                key = by_tenant[arrival.tenant]
                tasks.append(asyncio.create_task(one(client, base, key, arrival)))
        await asyncio.gather(*tasks)
    return finished
