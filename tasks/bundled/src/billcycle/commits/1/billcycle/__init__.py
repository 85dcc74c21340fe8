"""Billing dates for monthly subscriptions."""

from billcycle.dates import add_months, month_end
from billcycle.schedule import billing_dates, next_billing_date

__all__ = ["add_months", "billing_dates", "month_end", "next_billing_date"]
