"""The workers' shared table of queued prefills (gateway/app/shared_queue.py)."""

from __future__ import annotations

import math
import multiprocessing
import time
from collections.abc import Iterator

import pytest

from gateway.app import shared_queue
from gateway.app.backends import BackendPool, BackendSpec
from gateway.app.metrics import GatewayMetrics
from gateway.app.shared_queue import (
    COUNT,
    KEY,
    STALE_S,
    VERSION,
    PrefillTable,
    Publisher,
    backend_key,
)
from gateway.app.upstream import Upstream
from gateway.settings import Settings
from priority.request import SLO, Request
from priority.routing import ExternalPrefills
from priority.routing.base import InstanceView

KEY_A = backend_key("a", "http://a:8000", "a100-qwen2-7b")
KEY_B = backend_key("b", "http://b:8000", "a100-qwen2-7b")


@pytest.fixture
def table() -> Iterator[PrefillTable]:
    created = PrefillTable.create(3)
    try:
        yield created
    finally:
        created.close()


def summary(count: int, *, deadline: float = math.inf, updated: float = 1.0) -> ExternalPrefills:
    return ExternalPrefills(count, 100 * count, 0.01 * count, count, 0.05, deadline, updated)


def test_keys_are_nonzero_exact_floats_and_differ_by_backend() -> None:
    assert KEY_A != KEY_B and KEY_A > 0 and KEY_A == float(int(KEY_A)) < 2**53
    assert backend_key("a", "http://a:8000", "other-profile") != KEY_A


def test_a_worker_reads_the_others_rows_summed_by_backend_never_its_own(
    table: PrefillTable,
) -> None:
    now = time.monotonic()
    w0, w1, w2 = (Publisher(table, w, pid=100 + w) for w in range(3))
    w0.publish(KEY_A, summary(2, deadline=now + 5, updated=now - 1), now)
    w1.publish(KEY_A, summary(3, deadline=now + 2, updated=now - 2), now)
    w1.publish(KEY_B, summary(1), now)
    w2.beat(now)
    seen = w2.others(now)
    assert seen[KEY_A] == ExternalPrefills(5, 500, pytest.approx(0.05), 5, 0.05, now + 2, now - 1)
    assert seen[KEY_B].count == 1
    assert w0.others(now)[KEY_A] == summary(3, deadline=now + 2, updated=now - 2)
    # an emptied queue disappears from the others' view
    w1.publish(KEY_A, None, now)
    w1.publish(KEY_B, summary(0), now)
    assert w0.others(now) == {}
    assert w2.others(now)[KEY_A].count == 2


def test_a_row_being_written_is_never_read(table: PrefillTable) -> None:
    now = time.monotonic()
    w0 = Publisher(table, 0, pid=1)
    w0.publish(KEY_A, summary(4), now)
    table.rows[0, 0, VERSION] += 1.0  # a writer is between its two version stores
    table.rows[0, 0, COUNT] = 99.0  # ... and has written part of the row
    assert table.others(1, now) == {}
    table.rows[0, 0, VERSION] += 1.0  # the write completes
    assert table.others(1, now)[KEY_A].count == 99


def _write_forever(name: str, stop: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    """Another process: rows whose every field holds the same number, rewritten without end."""
    table = PrefillTable.attach(name, 2)
    n = 1.0
    while not stop.is_set():
        for slot in range(4):
            k = 10.0 * n + slot  # a key of its own: rows of one key would be summed
            table.write(0, slot, k, ExternalPrefills(int(k), int(k), k, int(k), k, k, k))
        table.beat(0, 1, time.monotonic())
        n += 1.0
    table.close()


@pytest.mark.slow
def test_rows_read_while_another_process_writes_them_are_whole() -> None:
    table = PrefillTable.create(2)
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    writer = ctx.Process(target=_write_forever, args=(table.name, stop))
    writer.start()
    try:
        deadline = time.monotonic() + 60  # a bound against a hang only
        while table.header[0, 1] == 0.0 and time.monotonic() < deadline:
            time.sleep(0.01)
        whole = 0
        for _ in range(20_000):
            for key, seen in table.others(1, time.monotonic()).items():
                # every field of a row holds its key: a torn row would mix two writes
                assert (seen.count, seen.prompt_tokens, seen.chunks) == (key,) * 3
                assert seen.raw_work == seen.min_tpot_s == seen.earliest_deadline_s == key
                whole += 1
        assert whole > 0
    finally:
        stop.set()
        writer.join(30)
        table.close()


def test_rows_of_a_stale_or_exited_worker_are_ignored(table: PrefillTable) -> None:
    now = time.monotonic()
    w0 = Publisher(table, 0, pid=1)
    w0.publish(KEY_A, summary(2), now)
    assert table.others(1, now)[KEY_A].count == 2
    assert table.others(1, now + STALE_S + 0.1) == {}  # no heartbeat for STALE_S: frozen
    w0.beat(now + STALE_S + 0.1)
    assert table.others(1, now + STALE_S + 0.1)[KEY_A].count == 2
    table.clear_worker(0)  # the supervisor: the worker exited
    assert table.others(1, now) == {}
    assert table.rows[0, 0, KEY] == 0.0


def _pool(publisher: Publisher | None) -> BackendPool:
    pool = BackendPool(
        Settings(), Upstream(read_timeout_s=5.0, connect_timeout_s=1.0), GatewayMetrics()
    )
    pool.shared = publisher
    pool.configure([BackendSpec("a", "http://a:8000", "m", "a100-qwen2-7b")])
    return pool


def test_pools_of_two_workers_see_each_others_prefills_counted_once(table: PrefillTable) -> None:
    mine, theirs = _pool(Publisher(table, 0, pid=1)), _pool(Publisher(table, 1, pid=2))
    backend, other = mine.backends[0], theirs.backends[0]
    view: InstanceView = other.view
    now = time.monotonic()
    for i in range(3):
        view.prefill_queue[f"r{i}"] = Request(f"r{i}", now, 2000, SLO(ttft_s=1.0, tpot_s=0.05))
    view.queue_updated_s = now
    theirs.queue_changed(other)
    mine.see_others(mine.backends)
    seen = backend.view.external_prefills
    assert seen is not None and (seen.count, seen.prompt_tokens) == (3, 6000)
    assert mine.groups["m"].router.drain_s(backend.view, now) > 0.0
    # the engine runs their 3 prefills, 2 of their decodes and 1 of ours: only 2 are external
    backend.own_decoding = 1
    mine.reconcile(backend, {"vllm:num_requests_running": 5.0, "vllm:num_requests_waiting": 1.0})
    assert backend.external == 2 and backend.view.num_decoding == 1 + 2
    # a reload starts from empty queues: the worker's rows are emptied with it
    theirs.configure([BackendSpec("a", "http://a:8000", "m", "a100-qwen2-7b")])
    mine.see_others(mine.backends)
    assert backend.view.external_prefills is None


def test_a_single_process_pool_shares_nothing() -> None:
    assert shared_queue.joined() is None
    pool = _pool(None)
    backend = pool.backends[0]
    pool.queue_changed(backend)
    pool.see_others(pool.backends)
    assert backend.view.external_prefills is None
