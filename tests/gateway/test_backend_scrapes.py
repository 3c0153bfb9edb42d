"""The load scrapes' loop: a backend whose ``/metrics`` answers late holds up only itself.

A busy vLLM engine's API server answers ``/metrics`` behind the tokens it streams; the real-
engine suite saw such scrapes take over 0.5 s. The loop starts a scrape of each backend whose
last one has ended, every interval, so the other backends' numbers stay fresh and a slow one
never has two scrapes in flight.
"""

from __future__ import annotations

import asyncio
import json

from gateway.app.backend_scrapes import scrape_timeout_s
from gateway.app.backends import Backend, BackendPool, BackendSpec
from gateway.app.metrics import GatewayMetrics
from gateway.app.upstream import Upstream
from gateway.settings import Settings

INTERVAL_S = 0.01
GAUGES = "vllm:num_requests_running 3\nvllm:num_requests_waiting 0\n"


class _Scraped(Upstream):
    """``/metrics`` of ``slow`` answers only when the test lets it; ``fast`` at once."""

    def __init__(self) -> None:
        super().__init__(read_timeout_s=5, connect_timeout_s=1)
        self.calls: dict[str, int] = {"fast": 0, "slow": 0}
        self.in_flight: dict[str, int] = {"fast": 0, "slow": 0}
        self.most_in_flight: dict[str, int] = {"fast": 0, "slow": 0}
        self.release = asyncio.Event()

    async def get_text(self, url: str, timeout_s: float) -> str:
        name = "slow" if "//slow" in url else "fast"
        self.calls[name] += 1
        self.in_flight[name] += 1
        self.most_in_flight[name] = max(self.most_in_flight[name], self.in_flight[name])
        try:
            if name == "slow":
                await self.release.wait()
            return GAUGES
        finally:
            self.in_flight[name] -= 1


async def _scrape_while_one_hangs() -> tuple[_Scraped, BackendPool]:
    upstream = _Scraped()
    pool = BackendPool(Settings(scrape_interval_s=INTERVAL_S), upstream, GatewayMetrics())
    pool.configure(
        [
            BackendSpec("fast", "http://fast:8000", "m", "a100-qwen2-7b"),
            BackendSpec("slow", "http://slow:8000", "m", "a100-qwen2-7b"),
        ]
    )
    loop = asyncio.create_task(pool.scrapes.loop())
    try:
        async with asyncio.timeout(30):  # bounds only a failing test (a loop that waits)
            while upstream.calls["fast"] < 10:
                await asyncio.sleep(INTERVAL_S)
            upstream.release.set()
            slow = next(b for b in pool.backends if b.name == "slow")
            while slow.running is None:
                await asyncio.sleep(INTERVAL_S)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    return upstream, pool


def test_a_slow_metrics_answer_holds_up_only_its_own_backend() -> None:
    upstream, pool = asyncio.run(_scrape_while_one_hangs())
    assert upstream.calls["fast"] >= 10  # scraped on while the slow one's answer waited
    assert upstream.most_in_flight == {"fast": 1, "slow": 1}  # never two at once
    assert {b.name: b.running for b in pool.backends} == {"fast": 3, "slow": 3}
    assert all(b.scrape_task is None or b.scrape_task.done() for b in pool.backends)


def test_a_scrape_may_take_longer_than_its_interval() -> None:
    assert scrape_timeout_s(0.5) == 2.0
    assert scrape_timeout_s(0.1) == 1.0


class _Engine(Upstream):
    """An engine's ``/metrics`` (``metrics``) and ``/v1/models`` (a card of 4096 tokens)."""

    def __init__(self, metrics: str) -> None:
        super().__init__(read_timeout_s=5, connect_timeout_s=1)
        self.metrics = metrics
        self.cards = 0

    async def get_text(self, url: str, timeout_s: float) -> str:
        if url.endswith("/v1/models"):
            self.cards += 1
            card = {"id": "m", "max_model_len": 4096, "tiergate": {"emulated": True}}
            return json.dumps({"object": "list", "data": [card]})
        return self.metrics


def _scraped(metrics: str) -> tuple[_Engine, Backend]:
    async def scrape() -> tuple[_Engine, Backend]:
        engine = _Engine(metrics)
        pool = BackendPool(Settings(), engine, GatewayMetrics())
        pool.configure([BackendSpec("b", "http://b:8000", "m", "a100-qwen2-7b")])
        backend = pool.backends[0]
        assert backend.card is None and backend.max_model_len is None
        for _ in range(3):
            assert await pool.scrapes.probe(backend)
        return engine, backend

    return asyncio.run(scrape())


def test_the_first_scrape_reads_the_model_card_once() -> None:
    engine, backend = _scraped(GAUGES)
    assert engine.cards == 1  # fresh for CARD_REFRESH_S: the next scrapes do not ask
    assert backend.card is not None and backend.card.emulated
    assert backend.max_model_len == 4096  # no config info: the card's length


def test_the_engines_config_info_says_the_length_over_the_card() -> None:
    info = 'tiergate:engine_config_info{engine="0",max_model_len="2048"} 1.0\n'
    engine, backend = _scraped(GAUGES + info)
    assert engine.cards == 1 and backend.max_model_len == 2048
