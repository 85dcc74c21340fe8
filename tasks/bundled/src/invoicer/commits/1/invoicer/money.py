"""Money helpers. Amounts are ``Decimal`` values in the invoice currency."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from typing import Union

Number = Union[Decimal, int, float, str]

CENT = Decimal("0.01")


def to_decimal(value: Number) -> Decimal:
    """``value`` as a ``Decimal``; floats go through their shortest repr, so ``0.1`` becomes ``Decimal("0.1")``."""
    return value if isinstance(value, Decimal) else Decimal(str(value))


def round_money(amount: Number) -> Decimal:
    """``amount`` rounded to whole cents, halves away from zero (the rule on all our invoices)."""
    return to_decimal(amount).quantize(CENT, rounding=ROUND_HALF_UP)


def format_money(amount: Number, currency: str = "EUR") -> str:
    """``1234.5`` -> ``"1,234.50 EUR"``."""
    return f"{round_money(amount):,.2f} {currency}"
