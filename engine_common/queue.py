"""vLLM's waiting queue, in the order our policy decides (imports vLLM).

vLLM's admission loop pops waiting requests from the head of ``scheduler.waiting`` until the
step's budget runs out; the adapter re-sorts this queue before every step so the requests the
policy admits come first, in the policy's order. Between steps it behaves like vLLM's FCFS queue
(``prepend_requests`` keeps vLLM's ``extendleft`` semantics), so vLLM's own bookkeeping (skipped
requests put back, preempted requests prepended) works unchanged. Under vLLM's priority
scheduling (``ordered``) it keeps vLLM's priority order between steps instead, as vLLM's heap
does (``Request.__lt__``: priority, arrival time, request id): what vLLM, its stats and its
users see of the waiting queue is what they configured; only the step's plan reorders it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from vllm.v1.core.sched.request_queue import RequestQueue


class PolicyOrderedQueue(RequestQueue):
    def __init__(self, requests: Iterable[Any] = (), *, ordered: bool = False) -> None:
        self.ordered = ordered
        self._items: list[Any] = sorted(requests) if ordered else list(requests)
        self._before: dict[int, int] = {}

    def reorder(
        self, key: Callable[[Any], Any], movable: Callable[[str], bool] | None = None
    ) -> None:
        """Stable sort by ``key`` (the adapter's plan rank), for this step only; with
        ``movable`` (by request id), the other requests keep their places."""
        self._before = {id(r): i for i, r in enumerate(self._items)}
        slots = [i for i, r in enumerate(self._items) if movable is None or movable(r.request_id)]
        moved = sorted((self._items[i] for i in slots), key=key)
        for i, request in zip(slots, moved, strict=True):
            self._items[i] = request

    def settle(self) -> None:
        """Back to vLLM's own order after the step: the plan's order was for that step, and a
        planned request vLLM did not admit must not overtake others for good. Under priority
        scheduling that is priority order; under FCFS the order before :meth:`reorder`, with
        requests vLLM put in during the step (preempted ones in front, new ones at the back)
        where vLLM put them."""
        before, self._before = self._before, {}
        if self.ordered:
            self._items.sort()
            return
        slots = [i for i, r in enumerate(self._items) if id(r) in before]
        kept = sorted((self._items[i] for i in slots), key=lambda r: before[id(r)])
        for i, request in zip(slots, kept, strict=True):
            self._items[i] = request

    def add_request(self, request: Any) -> None:
        if self.ordered:
            bisect.insort(self._items, request)
        else:
            self._items.append(request)

    def pop_request(self) -> Any:
        if not self._items:
            raise IndexError("pop from an empty queue")
        return self._items.pop(0)

    def peek_request(self) -> Any:
        if not self._items:
            raise IndexError("peek from an empty queue")
        return self._items[0]

    def prepend_request(self, request: Any) -> None:
        if self.ordered:
            bisect.insort(self._items, request)
        else:
            self._items.insert(0, request)

    def prepend_requests(self, requests: Iterable[Any]) -> None:
        for request in requests:  # like deque.extendleft: the last one ends up first
            self.prepend_request(request)

    def remove_request(self, request: Any) -> None:
        self._items.remove(request)

    def remove_requests(self, requests: Iterable[Any]) -> None:
        gone = set(requests)
        self._items = [r for r in self._items if r not in gone]

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._items))

    def __getitem__(self, index: int) -> Any:
        """Positional access, as vLLM's FCFS queue (a deque) offers."""
        return self._items[index]

    def __contains__(self, request: object) -> bool:
        return request in self._items
