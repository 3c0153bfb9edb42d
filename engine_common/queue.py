"""vLLM's waiting queue, in the order our policy decides (imports vLLM).

vLLM's admission loop pops waiting requests from the head of ``scheduler.waiting`` until the
step's budget runs out; the adapter re-sorts this queue before every step so the requests the
policy admits come first, in the policy's order. Between steps it behaves like vLLM's FCFS queue
(``prepend_requests`` keeps vLLM's ``extendleft`` semantics), so vLLM's own bookkeeping (skipped
requests put back, preempted requests prepended) works unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from vllm.v1.core.sched.request_queue import RequestQueue


class PolicyOrderedQueue(RequestQueue):
    def __init__(self, requests: Iterable[Any] = ()) -> None:
        self._items: list[Any] = list(requests)

    def reorder(self, key: Callable[[Any], Any]) -> None:
        """Stable sort by ``key`` (the adapter's plan rank)."""
        self._items.sort(key=key)

    def add_request(self, request: Any) -> None:
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
        self._items.insert(0, request)

    def prepend_requests(self, requests: Iterable[Any]) -> None:
        for request in requests:  # like deque.extendleft: the last one ends up first
            self._items.insert(0, request)

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
