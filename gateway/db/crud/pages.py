"""Pagination shared by the ``list_*`` functions: a window of an ordered query, and its total.

Every list orders by a total order (a unique column or an id tie-break), so consecutive pages
neither repeat nor skip a row while nothing changes. ``limit=None`` keeps the historical
behaviour (every row): the CLI and the backend pool read whole lists.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import Select, func
from sqlalchemy.orm import Session

from gateway.db.errors import InvalidInput

SelectT = TypeVar("SelectT", bound=Select[Any])


def check_page(limit: int | None, offset: int) -> None:
    """Refuse a window no page can be: a limit below 1, a negative offset (400 naming it)."""
    for name, value, low in (("limit", limit, 1), ("offset", offset, 0)):
        if value is None and name == "limit":
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise InvalidInput(f"{name} must be an integer >= {low}, got {value!r}", param=name)


def page(query: SelectT, limit: int | None, offset: int) -> SelectT:
    """``query`` cut to ``[offset, offset + limit)`` (everything from ``offset`` when None)."""
    check_page(limit, offset)
    if offset:
        query = query.offset(offset)
    if limit is not None:
        query = query.limit(limit)
    return query


def count_rows(session: Session, query: Select[Any]) -> int:
    """How many rows the filtered ``query`` (no eager loads) selects: one ``COUNT(*)``."""
    counted = query.with_only_columns(func.count(), maintain_column_froms=True).order_by(None)
    return int(session.scalar(counted) or 0)
