from datetime import date

import pytest

from billcycle import add_months, billing_dates, month_end, next_billing_date


def test_add_months_same_day():
    assert add_months(date(2024, 1, 15), 1) == date(2024, 2, 15)


def test_add_months_across_year_end():
    assert add_months(date(2023, 11, 15), 3) == date(2024, 2, 15)
    assert add_months(date(2024, 1, 10), -2) == date(2023, 11, 10)


def test_add_months_clamps_to_february():
    assert add_months(date(2023, 1, 31), 1) == date(2023, 2, 28)


def test_month_end():
    assert month_end(date(2024, 2, 10)) == date(2024, 2, 29)
    assert month_end(date(2023, 12, 1)) == date(2023, 12, 31)


def test_billing_dates_mid_month():
    assert billing_dates(date(2024, 5, 2), 3) == [date(2024, 5, 2), date(2024, 6, 2), date(2024, 7, 2)]


def test_billing_dates_rejects_negative_count():
    with pytest.raises(ValueError):
        billing_dates(date(2024, 5, 2), -1)


def test_next_billing_date():
    assert next_billing_date(date(2024, 1, 20), date(2024, 3, 21)) == date(2024, 4, 20)
    assert next_billing_date(date(2024, 1, 20), date(2024, 3, 20)) == date(2024, 3, 20)
