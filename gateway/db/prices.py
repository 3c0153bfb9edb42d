"""The prices in force, read from the database now and then, for charging requests.

A usage record's cost is computed when the record is written (:class:`gateway.db.usage.
UsageWriter`, in its own thread) and a budget's reservation at admission (on the event loop):
neither may wait on the database, so both read this in-memory copy. The writer thread refreshes
it every ``ttl_s`` (and the admin API marks it stale after a price change, so the next write
reads the new price); the event loop only ever reads the copy. A failed refresh keeps the
last prices: a database outage must not make requests free.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.errors import describe
from gateway.db.models import ModelPrice
from gateway.db.money import cost_of

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 5.0
"""How stale the copy may get before the writer re-reads it: how long a price change made on
another replica takes to apply here."""

Price = tuple[Decimal, Decimal]
"""(prompt, completion) per million tokens."""


class PriceBook:
    """Prices by model name; :meth:`cost` reads the copy, :meth:`refresh` re-reads it."""

    def __init__(
        self,
        session_factory: sessionmaker[Session] | None,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._factory = session_factory
        self._ttl_s = ttl_s
        self._clock = clock
        self._prices: dict[str, Price] = {}
        self._loaded_at: float | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._loaded_at is not None

    def set(self, prices: dict[str, Price]) -> None:
        """Replace the copy (tests; a gateway without a database)."""
        self._prices = dict(prices)
        self._loaded_at = self._clock()

    def invalidate(self) -> None:
        """Mark the copy stale: the next :meth:`refresh_if_stale` re-reads it."""
        self._loaded_at = None if self._loaded_at is None else -float("inf")

    def price(self, model: str | None) -> Price | None:
        return self._prices.get(model) if model is not None else None

    def cost(self, model: str | None, prompt_tokens: int, completion_tokens: int) -> Decimal | None:
        """What the tokens cost at ``model``'s price now; None if it has no price."""
        price = self.price(model)
        if price is None:
            return None
        return cost_of(prompt_tokens, completion_tokens, *price)

    def refresh(self) -> bool:
        """Re-read every price (blocking: never on the event loop); False if the database
        did not answer (the last copy stays)."""
        if self._factory is None:
            return False
        with self._lock:
            try:
                with self._factory() as session:
                    rows = session.execute(
                        select(
                            ModelPrice.model,
                            ModelPrice.prompt_per_mtok,
                            ModelPrice.completion_per_mtok,
                        )
                    ).all()
            except SQLAlchemyError as exc:
                log.warning(
                    "could not read model prices (%s): keeping the last ones", describe(exc)
                )
                return False
            self._prices = {m: (Decimal(p), Decimal(c)) for m, p, c in rows}
            self._loaded_at = self._clock()
            return True

    @property
    def stale(self) -> bool:
        loaded = self._loaded_at
        return loaded is None or self._clock() - loaded >= self._ttl_s

    def refresh_if_stale(self) -> None:
        loaded = self._loaded_at
        if loaded is None or self._clock() - loaded >= self._ttl_s:
            self.refresh()
