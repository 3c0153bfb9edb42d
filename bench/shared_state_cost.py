"""What sharing workflows and small limits between workers costs a call (no Redis).

    python bench/shared_state_cost.py [--calls 20000] [--repeats 5]

Side by side, in one run, on one event loop: a workflow call joining its workflow in the
per-process store (what one worker uses) and in the workers' shared-memory table (what
``tiergate serve --workers N`` uses), each through ``run_until_complete`` (the loop's own cost
is printed beside them); and one reservation and release against a limit below the number of
workers in the shared limit table. Best of ``--repeats`` rounds of ``--calls`` calls, in µs.
"""

from __future__ import annotations

import argparse
import asyncio
import timeit
from collections.abc import Callable

from gateway.app.shared_state import SharedState
from gateway.app.workflows import MemoryWorkflowStore, SharedWorkflowStore, WorkflowStore
from gateway.limits import Limits
from gateway.limits.shared import SharedLimitTable


def _best_us(call: Callable[[], object], calls: int, repeats: int) -> float:
    return min(timeit.repeat(call, number=calls, repeat=repeats)) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    state = SharedState.create(2)
    loop = asyncio.new_event_loop()
    try:
        stores: dict[str, WorkflowStore] = {
            "memory (one worker)": MemoryWorkflowStore(),
            "shared memory (N workers)": SharedWorkflowStore(state.workflows),
        }
        for store in stores.values():
            loop.run_until_complete(store.join("1:w", 1e12))
        loop_us = _best_us(
            lambda: loop.run_until_complete(asyncio.sleep(0)), args.calls, args.repeats
        )
        joins = {
            name: _best_us(
                lambda s=store: loop.run_until_complete(s.join("1:w", None)),
                args.calls,
                args.repeats,
            )
            for name, store in stores.items()
        }
        table = SharedLimitTable(state.limits, 2, slot=0)

        def reserve_release() -> None:
            entry = table.reserve("t", Limits(rpm=None, max_concurrency=1), 10)
            table.release("t", entry, 10)

        limit_us = _best_us(reserve_release, args.calls, args.repeats)
    finally:
        loop.close()
        state.close()
    print(f"event loop round trip alone: {loop_us:.1f} µs")
    for name, us in joins.items():
        print(f"workflow join, {name}: {us:.1f} µs")
    memory, shared = joins.values()
    print(f"shared / memory: {shared / memory:.2f}x (+{shared - memory:.1f} µs a workflow call)")
    print(f"small limit, reserve + release (two critical sections): {limit_us:.1f} µs")


if __name__ == "__main__":
    main()
