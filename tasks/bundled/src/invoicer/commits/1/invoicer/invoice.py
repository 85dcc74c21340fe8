"""Invoices: lines, subtotal, tax and total."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from invoicer.money import Number, round_money, to_decimal


@dataclass(frozen=True)
class Line:
    description: str
    unit_price: Decimal
    quantity: int = 1

    @property
    def amount(self) -> Decimal:
        """Unit price times quantity, in whole cents."""
        return round_money(self.unit_price * self.quantity)


@dataclass
class Invoice:
    tax_rate: Decimal = Decimal("0")
    lines: list[Line] = field(default_factory=list)

    def add(self, description: str, unit_price: Number, quantity: int = 1) -> None:
        if quantity < 1:
            raise ValueError(f"quantity must be >= 1, got {quantity}")
        self.lines.append(Line(description, to_decimal(unit_price), quantity))

    @property
    def subtotal(self) -> Decimal:
        return sum((line.amount for line in self.lines), Decimal("0.00"))

    @property
    def tax(self) -> Decimal:
        """Tax on the subtotal, in whole cents."""
        return round_money(self.subtotal * to_decimal(self.tax_rate))

    @property
    def total(self) -> Decimal:
        return self.subtotal + self.tax
