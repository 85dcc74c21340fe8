"""Invoice arithmetic with exact decimal amounts."""

from invoicer.invoice import Invoice, Line
from invoicer.money import format_money, round_money, to_decimal

__all__ = ["Invoice", "Line", "format_money", "round_money", "to_decimal"]
