"""Money in the data layer: exact decimals, checked once, for prices, costs and budgets.

A price is per million tokens with at most six decimals; a cost is computed exactly from it
(:func:`cost_of`) and kept to nine (the usage records' ``cost``), so summing costs never
drifts the way summing floats would. Budgets are counted in whole nano-units
(:func:`to_nanos`) wherever they must be exact across processes (Redis integers).
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any

from gateway.db.errors import InvalidInput

PRICE_PLACES = Decimal("0.000001")
MONEY_PLACES = Decimal("0.000000001")
MAX_PRICE = Decimal("999999.999999")
"""Largest price per million tokens (``NUMERIC(12, 6)``)."""
MAX_AMOUNT = Decimal("999999999.999999")
"""Largest budget (``NUMERIC(18, 9)`` holds 999,999,999.999999999)."""
NANOS = 10**9
PER_MTOK = Decimal(1_000_000)


def parse_decimal(value: Any, param: str) -> Decimal:
    """``value`` (a Decimal, an int, a decimal string, or a float read as its shortest repr)
    as a finite Decimal; :class:`InvalidInput` naming ``param`` otherwise."""
    if isinstance(value, bool):
        raise InvalidInput(f"{param} must be a number, got {value!r}", param=param)
    try:
        if isinstance(value, float):
            number = Decimal(repr(value))
        elif isinstance(value, Decimal | int):
            number = Decimal(value)
        elif isinstance(value, str):
            number = Decimal(value.strip())
        else:
            raise InvalidOperation
    except (InvalidOperation, ValueError):
        raise InvalidInput(
            f"{param} must be a decimal number, got {value!r}", param=param
        ) from None
    if not number.is_finite():
        raise InvalidInput(f"{param} must be a finite number, got {value!r}", param=param)
    return number


def _places(number: Decimal) -> int:
    exponent = number.as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0


def check_price(value: Any, param: str) -> Decimal:
    """A price per million tokens: 0 to :data:`MAX_PRICE`, at most six decimals."""
    number = parse_decimal(value, param)
    if number < 0 or number > MAX_PRICE or _places(number.normalize()) > 6:
        raise InvalidInput(
            f"{param} must be from 0 to {MAX_PRICE} with at most 6 decimals, got {value!r}",
            param=param,
        )
    return number.quantize(PRICE_PLACES)


def check_amount(value: Any, param: str) -> Decimal:
    """A budget: more than 0, at most :data:`MAX_AMOUNT`, at most six decimals."""
    number = parse_decimal(value, param)
    if number <= 0 or number > MAX_AMOUNT or _places(number.normalize()) > 6:
        raise InvalidInput(
            f"{param} must be more than 0 and at most {MAX_AMOUNT} with at most 6 decimals, "
            f"got {value!r}",
            param=param,
        )
    return number.quantize(MONEY_PLACES)


def cost_of(
    prompt_tokens: int,
    completion_tokens: int,
    prompt_per_mtok: Decimal,
    completion_per_mtok: Decimal,
) -> Decimal:
    """What the tokens cost at these prices, exact, to nine decimals (half-even)."""
    total = prompt_tokens * prompt_per_mtok + completion_tokens * completion_per_mtok
    return (total / PER_MTOK).quantize(MONEY_PLACES, rounding=ROUND_HALF_EVEN)


def to_nanos(amount: Decimal) -> int:
    """``amount`` in whole nano-units, rounded up: a reservation never undercounts."""
    return int((amount * NANOS).to_integral_value(rounding="ROUND_CEILING"))


def from_nanos(nanos: int) -> Decimal:
    return (Decimal(nanos) / NANOS).quantize(MONEY_PLACES)


def plain(amount: Decimal | None) -> str | None:
    """A decimal as fixed-point text (no exponent), for the audit log and the CSV."""
    return None if amount is None else format(amount, "f")
