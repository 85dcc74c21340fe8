from decimal import Decimal

from invoicer import Invoice, Line, format_money, round_money


def test_round_money_keeps_exact_cents():
    assert round_money("19.99") == Decimal("19.99")
    assert round_money(3) == Decimal("3.00")


def test_format_money_groups_thousands():
    assert format_money(Decimal("1234.5")) == "1,234.50 EUR"
    assert format_money("0.5", "USD") == "0.50 USD"


def test_line_amount():
    assert Line("pen", Decimal("1.25"), 4).amount == Decimal("5.00")


def test_invoice_totals():
    inv = Invoice(tax_rate=Decimal("0.20"))
    inv.add("notebook", "19.99", 2)
    inv.add("pen", Decimal("1.50"))
    assert inv.subtotal == Decimal("41.48")
    assert inv.tax == Decimal("8.30")
    assert inv.total == Decimal("49.78")


def test_empty_invoice_is_zero():
    assert Invoice(tax_rate=Decimal("0.2")).total == Decimal("0")
