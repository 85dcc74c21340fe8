"""Billing schedules for monthly subscriptions."""

from __future__ import annotations

from datetime import date

from billcycle.dates import add_months


def billing_dates(start: date, count: int) -> list[date]:
    """The first ``count`` billing dates of a subscription that started on ``start``."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    return [add_months(start, n) for n in range(count)]


def next_billing_date(start: date, today: date) -> date:
    """The first billing date on or after ``today``."""
    n = max(0, (today.year - start.year) * 12 + today.month - start.month - 1)
    while (due := add_months(start, n)) < today:
        n += 1
    return due
