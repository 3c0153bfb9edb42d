"""The load scrapes' loop: a backend whose ``/metrics`` answers late holds up only itself.

A busy vLLM engine's API server answers ``/metrics`` behind the tokens it streams; the real-
engine suite saw such scrapes take over 0.5 s. The loop starts a scrape of each backend whose
last one has ended, every interval, so the other backends' numbers stay fresh and a slow one
never has two scrapes in flight.
"""

from __future__ import annotations

import asyncio

from gateway.app.backend_scrapes import scrape_timeout_s
from gateway.app.backends import BackendPool, BackendSpec
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
