"""The KV block pool of one engine instance (paged attention's block accounting, no contents).

Only counts matter to scheduling: a request holds ``ceil(computed_tokens / block_size)`` blocks,
and the pool refuses to hand out more blocks than it has. Keeping that check in one place makes
"KV is never over-allocated" an invariant of the simulator rather than a property of each policy.
"""

from __future__ import annotations

from priority.policies.base import cdiv
from priority.request import Request


class KvCapacityError(RuntimeError):
    """An allocation asked for more blocks than are free (a scheduler bug, never expected)."""


class KvBlockPool:
    __slots__ = ("block_size", "free", "num_blocks")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free = num_blocks

    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (vLLM's ``kv_cache_usage_perc`` / 100)."""
        return self.used / self.num_blocks

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def blocks_for(self, tokens: int) -> int:
        return cdiv(tokens, self.block_size)

    def grow(self, request: Request, computed_tokens: int) -> int:
        """Make ``request`` hold enough blocks for ``computed_tokens``; returns blocks added."""
        extra = self.blocks_for(computed_tokens) - request.num_kv_blocks
        if extra <= 0:
            return 0
        if extra > self.free:
            raise KvCapacityError(
                f"{request.request_id} needs {extra} more KV blocks, only {self.free} free"
            )
        self.free -= extra
        request.num_kv_blocks += extra
        return extra

    def release(self, request: Request) -> None:
        """Return all of ``request``'s blocks to the pool."""
        self.free += request.num_kv_blocks
        request.num_kv_blocks = 0
        if self.free > self.num_blocks:
            raise KvCapacityError("KV pool freed more blocks than it owns")
