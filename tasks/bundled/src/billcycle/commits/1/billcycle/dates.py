"""Calendar arithmetic for billing periods."""

from __future__ import annotations

import calendar
from datetime import date


def month_end(d: date) -> date:
    """The last day of ``d``'s month."""
    return d.replace(day=calendar.monthrange(d.year, d.month)[1])


def add_months(d: date, months: int) -> date:
    """The same day of the month ``months`` later (earlier if negative), or the last day of a shorter month.

    >>> add_months(date(2023, 1, 31), 1)
    datetime.date(2023, 2, 28)
    """
    year, month0 = divmod(d.year * 12 + d.month - 1 + months, 12)
    last = calendar.monthrange(year, month0 + 1)[1]
    return date(year, month0 + 1, min(d.day, last))
