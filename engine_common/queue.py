"""vLLM's waiting queue, in the order our policy decides (imports vLLM).

vLLM's admission loop pops waiting requests from the head of ``scheduler.waiting`` until the
step's budget runs out; the adapter re-sorts this queue before every step so the requests the
policy admits come first, in the policy's order. Between steps it behaves like vLLM's FCFS queue
(``prepend_requests`` keeps vLLM's ``extendleft`` semantics), so vLLM's own bookkeeping (skipped
requests put back, preempted requests prepended) works unchanged. Under vLLM's priority
scheduling (``ordered``) it keeps vLLM's priority order between steps instead, as vLLM's heap
does (``Request.__lt__``: priority, arrival time, request id): what vLLM, its stats and its
users see of the waiting queue is what they configured; only the step's plan reorders it.

:attr:`PolicyOrderedQueue.version` counts every change of the queue's contents or order, so the
adapter can tell, in one comparison, that the queue is exactly as it last read it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from vllm.v1.core.sched.request_queue import RequestQueue


class PolicyOrderedQueue(RequestQueue):
    def __init__(self, requests: Iterable[Any] = (), *, ordered: bool = False) -> None:
        self.ordered = ordered
        self._items: list[Any] = sorted(requests) if ordered else list(requests)
        self._before: list[Any] | None = None
        """The order before this step's :meth:`reorder` (None: the step did not reorder)."""
        self.version = 0
        """Bumped by every change of the contents or the order (the adapter's snapshot key)."""

    def reorder(self, front: Sequence[Any], movable: Callable[[str], bool]) -> None:
        """Put ``front`` (requests in this queue, all ``movable`` by request id) first among the
        movable requests, in that order, for this step only: the other movable requests follow
        in their order, the requests that are not movable keep their places.

        A step that admits nothing leaves the queue alone (vLLM's admission loop stops at the
        first request the plan caps at 0, whatever its order), so the common decode-only step
        costs nothing here.
        """
        if not front:
            return
        self.version += 1
        items = self._items
        self._before = items.copy()
        first = {id(r) for r in front}
        slots = [i for i, r in enumerate(items) if movable(r.request_id)]
        moved = [*front, *(items[i] for i in slots if id(items[i]) not in first)]
        for i, request in zip(slots, moved, strict=True):
            items[i] = request

    def settle(self) -> None:
        """Back to vLLM's own order after the step: the plan's order was for that step, and a
        planned request vLLM did not admit must not overtake others for good. The requests
        still here from before :meth:`reorder` take back their order; the ones vLLM put in
        during the step stay where vLLM put them (FCFS: preempted ones in front, new ones at
        the back) or, under priority scheduling, go to their place in priority order."""
        before, self._before = self._before, None
        if before is None:
            return
        self.version += 1
        index = {id(r): i for i, r in enumerate(before)}
        items = self._items
        if self.ordered:
            kept = [r for r in items if id(r) in index]
            kept.sort(key=lambda r: index[id(r)])
            self._items = kept
            for request in items:
                if id(request) not in index:
                    bisect.insort(self._items, request)
            return
        slots = [i for i, r in enumerate(items) if id(r) in index]
        kept = sorted((items[i] for i in slots), key=lambda r: index[id(r)])
        for i, request in zip(slots, kept, strict=True):
            items[i] = request

    def add_request(self, request: Any) -> None:
        self.version += 1
        if self.ordered:
            bisect.insort(self._items, request)
        else:
            self._items.append(request)

    def pop_request(self) -> Any:
        if not self._items:
            raise IndexError("pop from an empty queue")
        self.version += 1
        return self._items.pop(0)

    def peek_request(self) -> Any:
        if not self._items:
            raise IndexError("peek from an empty queue")
        return self._items[0]

    def prepend_request(self, request: Any) -> None:
        self.version += 1
        if self.ordered:
            bisect.insort(self._items, request)
        else:
            self._items.insert(0, request)

    def prepend_requests(self, requests: Iterable[Any]) -> None:
        for request in requests:  # like deque.extendleft: the last one ends up first
            self.prepend_request(request)

    def remove_request(self, request: Any) -> None:
        self.version += 1
        self._items.remove(request)

    def remove_requests(self, requests: Iterable[Any]) -> None:
        self.version += 1
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
