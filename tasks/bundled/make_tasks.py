"""Rebuild the bundled tasks: small real repos with git history, a bug, its fix and its tests.

Run: python tasks/bundled/make_tasks.py   (rewrites every <name>.bundle and tasks.jsonl beside this file)

Each task is a tiny stdlib-only Python repo written for this project. Its last commit introduces a genuine bug;
the row's `patch` (gold) fixes it touching source files only, its `test_patch` adds the FAIL_TO_PASS tests under
tests/. The output is deterministic (fixed author and dates), so the committed bundles and base commits are
reproducible: running this twice gives byte-identical files. batchtools stays the first row (tests use it).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

GIT_ENV = {
    "GIT_AUTHOR_NAME": "swe-gym-env",
    "GIT_AUTHOR_EMAIL": "demo@swe-gym-env.invalid",
    "GIT_COMMITTER_NAME": "swe-gym-env",
    "GIT_COMMITTER_EMAIL": "demo@swe-gym-env.invalid",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def sub(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` (which must occur exactly once) replaced by ``new``."""
    if text.count(old) != 1:
        raise AssertionError(f"expected exactly one occurrence of {old!r}, found {text.count(old)}")
    return text.replace(old, new)


def pyproject(name: str, version: str) -> str:
    return f"""[project]
name = "{name}"
version = "{version}"
requires-python = ">=3.9"

[tool.pytest.ini_options]
pythonpath = ["."]
"""


# ---------------------------------------------------------------------------------------------------------------
# batchtools: off-by-one (the last, partial chunk is dropped). Kept byte-for-byte as first built by make_demo.py.
# ---------------------------------------------------------------------------------------------------------------

BT_README = """# batchtools

Small helpers for splitting work into batches.
"""

BT_PYPROJECT = """[project]
name = "batchtools"
version = "0.2.0"

[tool.pytest.ini_options]
pythonpath = ["."]
"""

BT_INIT_V1 = '''"""Small helpers for splitting work into batches."""

from batchtools.chunks import chunked

__all__ = ["chunked"]
'''

BT_CHUNKS_V1 = '''"""Split sequences into fixed-size chunks."""

from __future__ import annotations

from typing import Sequence, TypeVar

T = TypeVar("T")


def chunked(items: Sequence[T], size: int) -> list[list[T]]:
    """Split ``items`` into consecutive lists of ``size`` elements.

    >>> chunked([1, 2, 3, 4], 2)
    [[1, 2], [3, 4]]
    """
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    return [list(items[i : i + size]) for i in range(0, len(items), size)]
'''

# Commit 2: a "performance" refactor that introduced the bug (drops the last, partial chunk).
BT_CHUNKS_V2 = '''"""Split sequences into fixed-size chunks."""

from __future__ import annotations

from typing import Sequence, TypeVar

T = TypeVar("T")


def chunked(items: Sequence[T], size: int) -> list[list[T]]:
    """Split ``items`` into consecutive lists of ``size`` elements.

    The last chunk may be shorter than ``size``.

    >>> chunked([1, 2, 3, 4], 2)
    [[1, 2], [3, 4]]
    """
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    count = len(items) // size
    return [list(items[i * size : (i + 1) * size]) for i in range(count)]


def chunk_count(items: Sequence[T], size: int) -> int:
    """How many chunks ``chunked(items, size)`` returns."""
    return len(chunked(items, size))
'''

BT_CHUNKS_FIXED = BT_CHUNKS_V2.replace(
    "    count = len(items) // size\n",
    "    count = -(-len(items) // size)  # ceil: keep the last, partial chunk\n",
)

BT_TESTS_V1 = """import pytest

from batchtools import chunked


def test_chunked_even():
    assert chunked([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]


def test_chunked_empty():
    assert chunked([], 3) == []


def test_chunked_rejects_bad_size():
    with pytest.raises(ValueError):
        chunked([1, 2], 0)
"""

BT_TESTS_NEW = (
    BT_TESTS_V1.replace(
        "from batchtools import chunked\n",
        "from batchtools import chunked\nfrom batchtools.chunks import chunk_count\n",
    )
    + """

def test_chunked_keeps_partial_tail():
    assert chunked([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]


def test_chunk_count_rounds_up():
    assert chunk_count(list(range(7)), 3) == 3
"""
)

BT_PROBLEM = """chunked() silently drops the last items when the length is not a multiple of size

Since 0.2.0, `batchtools.chunked` loses data:

```python
>>> from batchtools import chunked
>>> chunked([1, 2, 3, 4, 5], 2)
[[1, 2], [3, 4]]
```

I expected `[[1, 2], [3, 4], [5]]` — the docstring even says the last chunk may be shorter than `size`.
`chunk_count` has the same problem (`chunk_count(range(7), 3)` gives 2 instead of 3). In our pipeline this
meant the last few records of every batch job were never processed.
"""


# ---------------------------------------------------------------------------------------------------------------
# layercfg: dict-merge precedence (nested sections from earlier layers win over later ones).
# ---------------------------------------------------------------------------------------------------------------

LC_README = """# layercfg

Build an application's configuration from layers: built-in defaults, a config file, the environment.
Later layers take precedence over earlier ones.

```python
from layercfg import from_env, resolve

config = resolve(DEFAULTS, file_layer, from_env(os.environ, prefix="APP_"))
```
"""

LC_INIT = '''"""Layered configuration: defaults, config file, environment."""

from layercfg.env import from_env
from layercfg.merge import merge, resolve

__all__ = ["from_env", "merge", "resolve"]
'''

LC_ENV = '''"""Read a configuration layer from environment variables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def from_env(environ: Mapping[str, str], prefix: str = "APP_") -> dict[str, Any]:
    """The variables that start with ``prefix``, as a nested dict.

    A double underscore separates sections: ``APP_DB__PORT=5433`` becomes ``{"db": {"port": "5433"}}``.
    """
    out: dict[str, Any] = {}
    for name, value in sorted(environ.items()):
        if not name.startswith(prefix) or name == prefix:
            continue
        *sections, key = name[len(prefix) :].lower().split("__")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
    return out
'''

LC_MERGE_V1 = '''"""Merge configuration layers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict with the keys of ``override`` replacing those of ``base``."""
    out = dict(base)
    out.update(override)
    return out


def resolve(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``layers`` from left to right: later layers take precedence."""
    out: dict[str, Any] = {}
    for layer in layers:
        out = merge(out, layer)
    return out
'''

# Commit 2: nested sections are merged key by key instead of replaced wholesale; the recursive call has its
# arguments the wrong way round, so inside a section the earlier layer wins.
LC_MERGE_V2 = sub(
    LC_MERGE_V1,
    '''    """A new dict with the keys of ``override`` replacing those of ``base``."""
    out = dict(base)
    out.update(override)
    return out
''',
    '''    """A new dict with ``override`` merged into ``base``.

    Nested mappings are merged key by key, so a layer only has to name the keys it changes; for any other
    value, the one in ``override`` wins.
    """
    out = dict(base)
    for key, value in override.items():
        current = out.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            out[key] = merge(value, current)
        else:
            out[key] = value
    return out
''',
)

LC_MERGE_FIXED = sub(LC_MERGE_V2, "out[key] = merge(value, current)", "out[key] = merge(current, value)")

LC_TESTS_V1 = """from layercfg import from_env, resolve


def test_later_layer_wins():
    assert resolve({"debug": False}, {"debug": True}) == {"debug": True}


def test_keys_from_every_layer_are_kept():
    assert resolve({"a": 1}, {"b": 2}, {"c": 3}) == {"a": 1, "b": 2, "c": 3}


def test_layers_are_not_modified():
    base = {"a": 1, "db": {"port": 5432}}
    resolve(base, {"a": 2, "db": {"port": 6543}})
    assert base == {"a": 1, "db": {"port": 5432}}


def test_from_env_nests_on_double_underscore():
    env = {"APP_DB__PORT": "5433", "APP_DEBUG": "1", "HOME": "/root"}
    assert from_env(env) == {"db": {"port": "5433"}, "debug": "1"}
"""

LC_TESTS_V2 = (
    LC_TESTS_V1
    + """

def test_nested_sections_are_merged():
    defaults = {"db": {"host": "localhost", "port": 5432}}
    assert resolve(defaults, {"db": {"user": "app"}}) == {"db": {"host": "localhost", "port": 5432, "user": "app"}}
"""
)

LC_TESTS_NEW = (
    LC_TESTS_V2
    + """

def test_nested_value_from_later_layer_wins():
    defaults = {"db": {"host": "localhost", "port": 5432}}
    assert resolve(defaults, {"db": {"port": 6543}}) == {"db": {"host": "localhost", "port": 6543}}


def test_environment_overrides_config_file_inside_sections():
    defaults = {"db": {"host": "localhost", "port": "5432"}, "debug": "0"}
    file_layer = {"db": {"host": "db.internal"}, "log": {"level": "info"}}
    env_layer = from_env({"APP_DB__HOST": "db.staging", "APP_LOG__LEVEL": "debug", "APP_DEBUG": "1"})
    assert resolve(defaults, file_layer, env_layer) == {
        "db": {"host": "db.staging", "port": "5432"},
        "log": {"level": "debug"},
        "debug": "1",
    }


def test_deeply_nested_value_from_later_layer_wins():
    base = {"log": {"handlers": {"file": {"level": "info", "path": "app.log"}}}}
    override = {"log": {"handlers": {"file": {"level": "debug"}}}}
    assert resolve(base, override) == {"log": {"handlers": {"file": {"level": "debug", "path": "app.log"}}}}
"""
)

LC_PROBLEM = """Overrides inside a config section are ignored since 1.1

After upgrading layercfg from 1.0 to 1.1, values set in a later layer no longer take effect when they sit inside
a section. Top-level keys still work.

```python
>>> from layercfg import resolve
>>> defaults = {"db": {"host": "localhost", "port": 5432}}
>>> resolve(defaults, {"db": {"port": 6543}})
{'db': {'port': 5432, 'host': 'localhost'}}
```

I expected `{'db': {'host': 'localhost', 'port': 6543}}`: the README says later layers take precedence. The
environment layer has the same problem, e.g. `APP_DB__HOST=db.staging` read with `from_env` is silently
dropped when the config file also sets `db.host`, so our staging deploy talked to the wrong database. Keys that
only the later layer defines do show up; it is values that an earlier layer already set that never change.
"""

# ---------------------------------------------------------------------------------------------------------------
# dotenvlite: a parser mishandling quoted values (inline-comment stripping cuts quoted values at '#').
# ---------------------------------------------------------------------------------------------------------------

DE_README = """# dotenvlite

A small, dependency-free reader for `.env` files.

```
# comments and blank lines are ignored
export API_URL=https://api.example.com
GREETING="hello world"
```

Values may be wrapped in single or double quotes; a quoted value is taken literally.
"""

DE_INIT = '''"""Read ``.env`` files."""

from dotenvlite.parser import ParseError, load, parse

__all__ = ["ParseError", "load", "parse"]
'''

DE_PARSER_V1 = '''"""Parse ``.env`` files: ``KEY=value`` lines, comments and blank lines."""

from __future__ import annotations

import os
import re

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ParseError(ValueError):
    """A line that is not ``KEY=value``."""

    def __init__(self, lineno: int, line: str) -> None:
        super().__init__(f"line {lineno}: expected KEY=value, got {line!r}")
        self.lineno = lineno


def _parse_value(raw: str) -> str:
    value = raw.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\\"'":
        value = value[1:-1]
    return value


def parse(text: str) -> dict[str, str]:
    """The assignments in ``text``, in order; a later assignment to the same key wins."""
    values: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("export "):
            stripped = stripped[len("export ") :].lstrip()
        key, sep, raw = stripped.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise ParseError(lineno, line)
        values[key] = _parse_value(raw)
    return values


def load(path: str | os.PathLike[str]) -> dict[str, str]:
    """Parse the ``.env`` file at ``path`` (UTF-8)."""
    with open(path, encoding="utf-8") as f:
        return parse(f.read())
'''

# Commit 2: inline comments (``PORT=8080  # web``) are dropped by cutting at the first '#', quotes or not.
DE_PARSER_V2 = sub(
    DE_PARSER_V1,
    """def _parse_value(raw: str) -> str:
    value = raw.strip()
""",
    """def _parse_value(raw: str) -> str:
    value = raw.split("#", 1)[0].strip()  # drop an inline comment: KEY=value  # note
""",
)

DE_PARSER_FIXED = sub(
    DE_PARSER_V2,
    """def _parse_value(raw: str) -> str:
    value = raw.split("#", 1)[0].strip()  # drop an inline comment: KEY=value  # note
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\\"'":
        value = value[1:-1]
    return value
""",
    """def _parse_value(raw: str) -> str:
    value = raw.strip()
    if value[:1] in ("'", '"'):
        end = value.find(value[0], 1)
        if end != -1:  # quoted: everything up to the closing quote, literally; anything after it is a comment
            return value[1:end]
    return value.split("#", 1)[0].strip()  # drop an inline comment: KEY=value  # note
""",
)

DE_TESTS_V1 = """import pytest

from dotenvlite import ParseError, load, parse


def test_basic_pairs():
    assert parse("A=1\\nB = two\\n") == {"A": "1", "B": "two"}


def test_comments_and_blank_lines_are_skipped():
    assert parse("# settings\\n\\nA=1\\n   # indented comment\\n") == {"A": "1"}


def test_quotes_are_removed():
    assert parse("A=\\"hello world\\"\\nB='x'\\n") == {"A": "hello world", "B": "x"}


def test_export_prefix():
    assert parse("export TOKEN=abc\\n") == {"TOKEN": "abc"}


def test_later_assignment_wins():
    assert parse("A=1\\nA=2\\n") == {"A": "2"}


def test_bad_line_names_the_line():
    with pytest.raises(ParseError, match="line 2"):
        parse("A=1\\nnot a pair\\n")


def test_load_reads_utf8(tmp_path):
    path = tmp_path / ".env"
    path.write_text("CITY=Zürich\\n", encoding="utf-8")
    assert load(path) == {"CITY": "Zürich"}
"""

DE_TESTS_V2 = (
    DE_TESTS_V1
    + """

def test_inline_comment_is_dropped():
    assert parse("PORT=8080  # web server\\n") == {"PORT": "8080"}
"""
)

DE_TESTS_NEW = (
    DE_TESTS_V2
    + """

def test_hash_inside_double_quotes_is_kept():
    assert parse('DATABASE_PASSWORD="s3cr#t"\\n') == {"DATABASE_PASSWORD": "s3cr#t"}


def test_single_quoted_value_with_hash_and_inline_comment():
    assert parse("BRAND_COLOR='#ff8800'  # orange\\n") == {"BRAND_COLOR": "#ff8800"}


def test_url_fragment_in_quotes_is_kept():
    text = 'DOCS_URL="https://example.com/guide#install"\\n'
    assert parse(text) == {"DOCS_URL": "https://example.com/guide#install"}
"""
)

DE_PROBLEM = """Quoted values containing '#' are truncated and keep a stray quote (0.4)

Since upgrading dotenvlite to 0.4 our service can no longer log in to its database. The password in our `.env`
contains a `#`, and it is quoted so that it is taken literally:

```
DATABASE_PASSWORD="s3cr#t"
```

```python
>>> from dotenvlite import parse
>>> parse('DATABASE_PASSWORD="s3cr#t"\\n')
{'DATABASE_PASSWORD': '"s3cr'}
```

I expected `{'DATABASE_PASSWORD': 's3cr#t'}` (0.3 returned exactly that). Colours such as
`BRAND_COLOR='#ff8800'` and URLs with a fragment break the same way. A comment after a value, like
`PORT=8080  # web server`, should still be ignored, as 0.4 does now.
"""

# ---------------------------------------------------------------------------------------------------------------
# invoicer: money rounding done in binary floats (half cents rounded down). The fix spans two files.
# ---------------------------------------------------------------------------------------------------------------

IV_README = """# invoicer

Invoice arithmetic for small shops: lines, subtotal, tax, total. Amounts are `decimal.Decimal` in the invoice
currency and are rounded to whole cents, halves away from zero, like in our ledger.
"""

IV_INIT = '''"""Invoice arithmetic with exact decimal amounts."""

from invoicer.invoice import Invoice, Line
from invoicer.money import format_money, round_money, to_decimal

__all__ = ["Invoice", "Line", "format_money", "round_money", "to_decimal"]
'''

IV_MONEY_V1 = '''"""Money helpers. Amounts are ``Decimal`` values in the invoice currency."""

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
'''

IV_INVOICE_V1 = '''"""Invoices: lines, subtotal, tax and total."""

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
'''

# Commit 2: "faster totals": the arithmetic moves to floats and the rounding to the built-in round(), which
# rounds the binary value (2.675 is 2.67499999...) and sends exact halves to the even cent.
IV_MONEY_V2 = sub(
    IV_MONEY_V1,
    "    return to_decimal(amount).quantize(CENT, rounding=ROUND_HALF_UP)\n",
    '    return Decimal(f"{round(float(amount), 2):.2f}")\n',
)
IV_INVOICE_V2 = sub(
    sub(
        IV_INVOICE_V1,
        "        return round_money(self.unit_price * self.quantity)\n",
        "        return round_money(float(self.unit_price) * self.quantity)\n",
    ),
    "        return round_money(self.subtotal * to_decimal(self.tax_rate))\n",
    "        return round_money(float(self.subtotal) * float(self.tax_rate))\n",
)

IV_MONEY_FIXED = IV_MONEY_V1
IV_INVOICE_FIXED = IV_INVOICE_V1

IV_TESTS_V1 = """from decimal import Decimal

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
"""

IV_TESTS_NEW = (
    IV_TESTS_V1
    + """

def test_round_money_rounds_half_cents_up():
    assert round_money("2.675") == Decimal("2.68")
    assert round_money(Decimal("0.125")) == Decimal("0.13")
    assert round_money("1.005") == Decimal("1.01")


def test_line_amount_with_half_cent():
    assert Line("washer", Decimal("0.145"), 3).amount == Decimal("0.44")


def test_tax_with_half_cent():
    inv = Invoice(tax_rate=Decimal("0.15"))
    inv.add("widget", "4.10")
    assert inv.tax == Decimal("0.62")
    assert inv.total == Decimal("4.72")
"""
)

IV_PROBLEM = """Invoices come out a cent short since 2.3 (half cents rounded down)

Our accountant found invoices issued since we upgraded invoicer to 2.3 that no longer agree with the ledger:
half cents are sometimes rounded down now.

```python
>>> from decimal import Decimal
>>> from invoicer import Invoice, Line, round_money
>>> round_money("2.675")
Decimal('2.67')
>>> Line("washer", Decimal("0.145"), 3).amount
Decimal('0.43')
>>> inv = Invoice(tax_rate=Decimal("0.15"))
>>> inv.add("widget", "4.10")
>>> inv.tax, inv.total
(Decimal('0.61'), Decimal('4.71'))
```

The README and the docstring both say halves are rounded away from zero, so I expected `Decimal('2.68')`, a
line amount of 0.44 (3 x 0.145 = 0.435), and a tax of 0.62 (15% of 4.10 is exactly 0.615), total 4.72. 2.2
got all of these right. Every invoice has to match the ledger to the cent.
"""

# ---------------------------------------------------------------------------------------------------------------
# billcycle: a date boundary bug (end of month / leap day: adding months to the 29th-31st lands on the 28th).
# ---------------------------------------------------------------------------------------------------------------

BC_README = """# billcycle

Billing dates for monthly subscriptions. A subscription is billed on the same day of the month as it started;
in months that are too short for that day, it is billed on the month's last day.
"""

BC_INIT = '''"""Billing dates for monthly subscriptions."""

from billcycle.dates import add_months, month_end
from billcycle.schedule import billing_dates, next_billing_date

__all__ = ["add_months", "billing_dates", "month_end", "next_billing_date"]
'''

BC_DATES_V1 = '''"""Calendar arithmetic for billing periods."""

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
'''

# Commit 2: "simplify add_months": date.replace() and, when the day does not exist, a fixed fallback to the 28th.
BC_DATES_V2 = sub(
    BC_DATES_V1,
    """    year, month0 = divmod(d.year * 12 + d.month - 1 + months, 12)
    last = calendar.monthrange(year, month0 + 1)[1]
    return date(year, month0 + 1, min(d.day, last))
""",
    """    year, month0 = divmod(d.year * 12 + d.month - 1 + months, 12)
    try:
        return d.replace(year=year, month=month0 + 1)
    except ValueError:  # the target month has no such day, e.g. 31 April
        return d.replace(year=year, month=month0 + 1, day=28)
""",
)

BC_DATES_FIXED = sub(
    BC_DATES_V2,
    "        return d.replace(year=year, month=month0 + 1, day=28)\n",
    "        return month_end(date(year, month0 + 1, 1))\n",
)

BC_SCHEDULE = '''"""Billing schedules for monthly subscriptions."""

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
'''

BC_TESTS_V1 = """from datetime import date

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
"""

BC_TESTS_NEW = (
    BC_TESTS_V1
    + """

def test_add_months_clamps_to_leap_day():
    assert add_months(date(2024, 1, 31), 1) == date(2024, 2, 29)
    assert add_months(date(2024, 3, 30), -1) == date(2024, 2, 29)


def test_add_months_clamps_to_thirty_day_month():
    assert add_months(date(2023, 3, 31), 1) == date(2023, 4, 30)
    assert add_months(date(2023, 8, 31), 1) == date(2023, 9, 30)


def test_billing_dates_started_on_the_31st():
    assert billing_dates(date(2024, 1, 31), 4) == [
        date(2024, 1, 31),
        date(2024, 2, 29),
        date(2024, 3, 31),
        date(2024, 4, 30),
    ]


def test_next_billing_date_in_short_month():
    assert next_billing_date(date(2024, 1, 31), date(2024, 4, 29)) == date(2024, 4, 30)
"""
)

BC_PROBLEM = """Subscriptions started on the 31st are billed on the 28th in 30-day months and in leap-year February

We bill monthly subscriptions with billcycle 1.2. A customer who signed up on 31 January 2024 was charged on
28 February and again on 28 April, two days early each time:

```python
>>> from datetime import date
>>> from billcycle import billing_dates
>>> billing_dates(date(2024, 1, 31), 4)
[datetime.date(2024, 1, 31), datetime.date(2024, 2, 28), datetime.date(2024, 3, 31), datetime.date(2024, 4, 28)]
```

Expected: `[2024-01-31, 2024-02-29, 2024-03-31, 2024-04-30]`. The README promises the same day of the month, or
the month's last day when the month is too short; 2024 is a leap year, and April has 30 days. `add_months`
shows it directly: `add_months(date(2023, 3, 31), 1)` gives 28 April 2023. With 1.1 the dates were right.
"""

# ---------------------------------------------------------------------------------------------------------------
# retrykit: a swallowed exception (when every attempt fails, the error is logged and None is returned).
# ---------------------------------------------------------------------------------------------------------------

RK_README = """# retrykit

Retry flaky calls (network requests, lock acquisition) a bounded number of times.

```python
from retrykit import retry

@retry(attempts=5, retry_on=(ConnectionError,), delay=0.2)
def fetch_rates():
    ...
```

If every attempt fails, the last exception is raised to the caller.
"""

RK_INIT = '''"""Retry flaky calls a bounded number of times."""

from retrykit.retry import call_with_retry, retry

__all__ = ["call_with_retry", "retry"]
'''

RK_RETRY_V1 = '''"""Call a function again when it fails with a retryable exception."""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def call_with_retry(
    func: Callable[[], T],
    *,
    attempts: int = 3,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    delay: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``func()`` until it returns, at most ``attempts`` times, waiting ``delay`` seconds in between.

    An exception that is not one of ``retry_on`` propagates at once. If every attempt fails, the exception
    of the last attempt propagates.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for attempt in range(1, attempts + 1):
        try:
            return func()
        except retry_on:
            if attempt == attempts:
                raise
            sleep(delay)
    raise AssertionError("unreachable")


def retry(**options: Any) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorator form of :func:`call_with_retry`; ``options`` are its keyword arguments."""

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            return call_with_retry(lambda: fn(*args, **kwargs), **options)

        return wrapper

    return decorate
'''

# Commit 2: exponential backoff and a log line per failed attempt; the loop was rewritten and the error of the
# last attempt is now logged and dropped: call_with_retry returns None.
RK_RETRY_V2 = sub(
    sub(
        sub(
            sub(
                RK_RETRY_V1,
                "import functools\nimport time\n",
                "import functools\nimport logging\nimport time\n",
            ),
            'T = TypeVar("T")\n',
            'T = TypeVar("T")\n\nlog = logging.getLogger("retrykit")\n',
        ),
        """    delay: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    \"\"\"Call ``func()`` until it returns, at most ``attempts`` times, waiting ``delay`` seconds in between.
""",
        """    delay: float = 0.0,
    backoff: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    \"\"\"Call ``func()`` until it returns, at most ``attempts`` times.

    The first wait between attempts is ``delay`` seconds; each further wait is ``backoff`` times the previous one.
""",
    ),
    """    for attempt in range(1, attempts + 1):
        try:
            return func()
        except retry_on:
            if attempt == attempts:
                raise
            sleep(delay)
    raise AssertionError("unreachable")
""",
    """    wait = delay
    for attempt in range(1, attempts + 1):
        try:
            return func()
        except retry_on as exc:
            log.warning("attempt %d of %d failed: %r", attempt, attempts, exc)
            if attempt < attempts:
                sleep(wait)
                wait *= backoff
    log.error("giving up after %d attempts", attempts)
""",
)

RK_RETRY_FIXED = sub(
    RK_RETRY_V2,
    """            log.warning("attempt %d of %d failed: %r", attempt, attempts, exc)
            if attempt < attempts:
                sleep(wait)
                wait *= backoff
    log.error("giving up after %d attempts", attempts)
""",
    """            log.warning("attempt %d of %d failed: %r", attempt, attempts, exc)
            if attempt == attempts:
                log.error("giving up after %d attempts", attempts)
                raise
            sleep(wait)
            wait *= backoff
    raise AssertionError("unreachable")
""",
)

RK_TESTS_V1 = """import pytest

from retrykit import call_with_retry, retry


class Flaky:
    \"\"\"Fails ``failures`` times with ``exc``, then returns "ok".\"\"\"

    def __init__(self, failures, exc=ConnectionError):
        self.failures = failures
        self.exc = exc
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc(f"failure {self.calls}")
        return "ok"


def no_sleep(seconds):
    pass


def test_returns_first_success():
    flaky = Flaky(2)
    assert call_with_retry(flaky, attempts=3, sleep=no_sleep) == "ok"
    assert flaky.calls == 3


def test_other_exceptions_are_not_retried():
    flaky = Flaky(1, exc=KeyError)
    with pytest.raises(KeyError):
        call_with_retry(flaky, attempts=3, retry_on=(ConnectionError,), sleep=no_sleep)
    assert flaky.calls == 1


def test_rejects_zero_attempts():
    with pytest.raises(ValueError):
        call_with_retry(Flaky(0), attempts=0)


def test_decorator_passes_arguments():
    @retry(attempts=2, sleep=no_sleep)
    def add(a, b):
        return a + b

    assert add(2, b=3) == 5
    assert add.__name__ == "add"
"""

RK_TESTS_V2 = (
    RK_TESTS_V1
    + """

def test_backoff_multiplies_the_wait():
    waits = []
    assert call_with_retry(Flaky(3), attempts=4, delay=0.5, backoff=2.0, sleep=waits.append) == "ok"
    assert waits == [0.5, 1.0, 2.0]
"""
)

RK_TESTS_NEW = (
    RK_TESTS_V2
    + """

def test_last_error_is_raised_when_every_attempt_fails():
    flaky = Flaky(5)
    with pytest.raises(ConnectionError, match="failure 3"):
        call_with_retry(flaky, attempts=3, sleep=no_sleep)
    assert flaky.calls == 3


def test_no_wait_after_the_last_attempt():
    waits = []
    with pytest.raises(TimeoutError):
        call_with_retry(Flaky(9, exc=TimeoutError), attempts=3, delay=1.0, sleep=waits.append)
    assert waits == [1.0, 1.0]


def test_decorator_raises_after_the_last_attempt():
    @retry(attempts=2, sleep=no_sleep)
    def always_down():
        raise TimeoutError("upstream down")

    with pytest.raises(TimeoutError, match="upstream down"):
        always_down()
"""
)

RK_PROBLEM = """call_with_retry returns None instead of raising once all attempts have failed (0.3)

Since we upgraded retrykit to 0.3 (the release that added `backoff`), a call that never succeeds no longer
raises. It logs "giving up after 3 attempts" and hands back `None`:

```python
>>> from retrykit import call_with_retry
>>> def fetch():
...     raise ConnectionError("upstream down")
...
>>> print(call_with_retry(fetch, attempts=3))
None
```

Our code then failed much later with `TypeError: 'NoneType' object is not subscriptable`, far from the real
cause, and the `except ConnectionError:` handler around the call, which shows the user a "try again later"
page, never runs. The docstring and the README say the exception of the last attempt propagates, as it did in
0.2. Functions wrapped with `@retry(...)` behave the same way.
"""

# ---------------------------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Commit:
    message: str
    date: str
    files: dict[str, str]


@dataclass
class Spec:
    name: str  # repository and bundle name
    commits: list[Commit]  # the last one introduces the bug; its tip is base_commit
    gold: dict[str, str]  # source files as fixed
    tests: dict[str, str]  # test files with the FAIL_TO_PASS tests added
    problem: str
    created_at: str
    version: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    hints: str = ""
    number: int = 1


def specs() -> list[Spec]:
    return [
        Spec(
            name="batchtools",
            commits=[
                Commit(
                    "Add chunked()",
                    "2026-01-05T10:00:00+00:00",
                    {
                        "README.md": BT_README,
                        "pyproject.toml": BT_PYPROJECT,
                        "batchtools/__init__.py": BT_INIT_V1,
                        "batchtools/chunks.py": BT_CHUNKS_V1,
                        "tests/test_chunks.py": BT_TESTS_V1,
                    },
                ),
                Commit(
                    "Compute chunks by count; add chunk_count()",
                    "2026-02-11T15:30:00+00:00",
                    {"batchtools/chunks.py": BT_CHUNKS_V2},
                ),
            ],
            gold={"batchtools/chunks.py": BT_CHUNKS_FIXED},
            tests={"tests/test_chunks.py": BT_TESTS_NEW},
            problem=BT_PROBLEM,
            created_at="2026-02-12T09:00:00Z",
            version="0.2",
            fail_to_pass=[
                "tests/test_chunks.py::test_chunked_keeps_partial_tail",
                "tests/test_chunks.py::test_chunk_count_rounds_up",
            ],
            pass_to_pass=[
                "tests/test_chunks.py::test_chunked_even",
                "tests/test_chunks.py::test_chunked_empty",
                "tests/test_chunks.py::test_chunked_rejects_bad_size",
            ],
        ),
        Spec(
            name="layercfg",
            commits=[
                Commit(
                    "Resolve configuration from layers",
                    "2026-01-08T09:15:00+00:00",
                    {
                        "README.md": LC_README,
                        "pyproject.toml": pyproject("layercfg", "1.0.0"),
                        "layercfg/__init__.py": LC_INIT,
                        "layercfg/env.py": LC_ENV,
                        "layercfg/merge.py": LC_MERGE_V1,
                        "tests/test_merge.py": LC_TESTS_V1,
                    },
                ),
                Commit(
                    "Merge nested sections key by key instead of replacing them; release 1.1.0",
                    "2026-02-03T14:20:00+00:00",
                    {
                        "pyproject.toml": pyproject("layercfg", "1.1.0"),
                        "layercfg/merge.py": LC_MERGE_V2,
                        "tests/test_merge.py": LC_TESTS_V2,
                    },
                ),
            ],
            gold={"layercfg/merge.py": LC_MERGE_FIXED},
            tests={"tests/test_merge.py": LC_TESTS_NEW},
            problem=LC_PROBLEM,
            created_at="2026-02-05T11:42:00Z",
            version="1.1",
            fail_to_pass=[
                "tests/test_merge.py::test_nested_value_from_later_layer_wins",
                "tests/test_merge.py::test_environment_overrides_config_file_inside_sections",
                "tests/test_merge.py::test_deeply_nested_value_from_later_layer_wins",
            ],
            pass_to_pass=[
                "tests/test_merge.py::test_later_layer_wins",
                "tests/test_merge.py::test_keys_from_every_layer_are_kept",
                "tests/test_merge.py::test_layers_are_not_modified",
                "tests/test_merge.py::test_from_env_nests_on_double_underscore",
                "tests/test_merge.py::test_nested_sections_are_merged",
            ],
        ),
        Spec(
            name="dotenvlite",
            commits=[
                Commit(
                    "Parse .env files",
                    "2026-01-12T08:30:00+00:00",
                    {
                        "README.md": DE_README,
                        "pyproject.toml": pyproject("dotenvlite", "0.3.0"),
                        "dotenvlite/__init__.py": DE_INIT,
                        "dotenvlite/parser.py": DE_PARSER_V1,
                        "tests/test_parser.py": DE_TESTS_V1,
                    },
                ),
                Commit(
                    "Ignore inline comments after values; release 0.4.0",
                    "2026-02-16T17:05:00+00:00",
                    {
                        "pyproject.toml": pyproject("dotenvlite", "0.4.0"),
                        "dotenvlite/parser.py": DE_PARSER_V2,
                        "tests/test_parser.py": DE_TESTS_V2,
                    },
                ),
            ],
            gold={"dotenvlite/parser.py": DE_PARSER_FIXED},
            tests={"tests/test_parser.py": DE_TESTS_NEW},
            problem=DE_PROBLEM,
            created_at="2026-02-18T10:10:00Z",
            version="0.4",
            fail_to_pass=[
                "tests/test_parser.py::test_hash_inside_double_quotes_is_kept",
                "tests/test_parser.py::test_single_quoted_value_with_hash_and_inline_comment",
                "tests/test_parser.py::test_url_fragment_in_quotes_is_kept",
            ],
            pass_to_pass=[
                "tests/test_parser.py::test_basic_pairs",
                "tests/test_parser.py::test_comments_and_blank_lines_are_skipped",
                "tests/test_parser.py::test_quotes_are_removed",
                "tests/test_parser.py::test_export_prefix",
                "tests/test_parser.py::test_later_assignment_wins",
                "tests/test_parser.py::test_bad_line_names_the_line",
                "tests/test_parser.py::test_load_reads_utf8",
                "tests/test_parser.py::test_inline_comment_is_dropped",
            ],
        ),
        Spec(
            name="invoicer",
            commits=[
                Commit(
                    "Invoice lines, subtotal, tax and total with exact decimals",
                    "2026-01-14T13:00:00+00:00",
                    {
                        "README.md": IV_README,
                        "pyproject.toml": pyproject("invoicer", "2.2.0"),
                        "invoicer/__init__.py": IV_INIT,
                        "invoicer/money.py": IV_MONEY_V1,
                        "invoicer/invoice.py": IV_INVOICE_V1,
                        "tests/test_invoice.py": IV_TESTS_V1,
                    },
                ),
                Commit(
                    "Faster totals: float arithmetic and built-in round(); release 2.3.0",
                    "2026-02-20T16:45:00+00:00",
                    {
                        "pyproject.toml": pyproject("invoicer", "2.3.0"),
                        "invoicer/money.py": IV_MONEY_V2,
                        "invoicer/invoice.py": IV_INVOICE_V2,
                    },
                ),
            ],
            gold={"invoicer/money.py": IV_MONEY_FIXED, "invoicer/invoice.py": IV_INVOICE_FIXED},
            tests={"tests/test_invoice.py": IV_TESTS_NEW},
            problem=IV_PROBLEM,
            created_at="2026-02-24T09:30:00Z",
            version="2.3",
            fail_to_pass=[
                "tests/test_invoice.py::test_round_money_rounds_half_cents_up",
                "tests/test_invoice.py::test_line_amount_with_half_cent",
                "tests/test_invoice.py::test_tax_with_half_cent",
            ],
            pass_to_pass=[
                "tests/test_invoice.py::test_round_money_keeps_exact_cents",
                "tests/test_invoice.py::test_format_money_groups_thousands",
                "tests/test_invoice.py::test_line_amount",
                "tests/test_invoice.py::test_invoice_totals",
                "tests/test_invoice.py::test_empty_invoice_is_zero",
            ],
        ),
        Spec(
            name="billcycle",
            commits=[
                Commit(
                    "Billing dates for monthly subscriptions",
                    "2026-01-20T10:00:00+00:00",
                    {
                        "README.md": BC_README,
                        "pyproject.toml": pyproject("billcycle", "1.1.0"),
                        "billcycle/__init__.py": BC_INIT,
                        "billcycle/dates.py": BC_DATES_V1,
                        "billcycle/schedule.py": BC_SCHEDULE,
                        "tests/test_billing.py": BC_TESTS_V1,
                    },
                ),
                Commit(
                    "Simplify add_months with date.replace(); release 1.2.0",
                    "2026-02-25T12:10:00+00:00",
                    {"pyproject.toml": pyproject("billcycle", "1.2.0"), "billcycle/dates.py": BC_DATES_V2},
                ),
            ],
            gold={"billcycle/dates.py": BC_DATES_FIXED},
            tests={"tests/test_billing.py": BC_TESTS_NEW},
            problem=BC_PROBLEM,
            created_at="2026-03-02T08:05:00Z",
            version="1.2",
            fail_to_pass=[
                "tests/test_billing.py::test_add_months_clamps_to_leap_day",
                "tests/test_billing.py::test_add_months_clamps_to_thirty_day_month",
                "tests/test_billing.py::test_billing_dates_started_on_the_31st",
                "tests/test_billing.py::test_next_billing_date_in_short_month",
            ],
            pass_to_pass=[
                "tests/test_billing.py::test_add_months_same_day",
                "tests/test_billing.py::test_add_months_across_year_end",
                "tests/test_billing.py::test_add_months_clamps_to_february",
                "tests/test_billing.py::test_month_end",
                "tests/test_billing.py::test_billing_dates_mid_month",
                "tests/test_billing.py::test_billing_dates_rejects_negative_count",
                "tests/test_billing.py::test_next_billing_date",
            ],
        ),
        Spec(
            name="retrykit",
            commits=[
                Commit(
                    "call_with_retry() and @retry",
                    "2026-01-22T15:00:00+00:00",
                    {
                        "README.md": RK_README,
                        "pyproject.toml": pyproject("retrykit", "0.2.0"),
                        "retrykit/__init__.py": RK_INIT,
                        "retrykit/retry.py": RK_RETRY_V1,
                        "tests/test_retry.py": RK_TESTS_V1,
                    },
                ),
                Commit(
                    "Exponential backoff; log failed attempts; release 0.3.0",
                    "2026-03-04T11:25:00+00:00",
                    {
                        "pyproject.toml": pyproject("retrykit", "0.3.0"),
                        "retrykit/retry.py": RK_RETRY_V2,
                        "tests/test_retry.py": RK_TESTS_V2,
                    },
                ),
            ],
            gold={"retrykit/retry.py": RK_RETRY_FIXED},
            tests={"tests/test_retry.py": RK_TESTS_NEW},
            problem=RK_PROBLEM,
            created_at="2026-03-06T14:50:00Z",
            version="0.3",
            fail_to_pass=[
                "tests/test_retry.py::test_last_error_is_raised_when_every_attempt_fails",
                "tests/test_retry.py::test_no_wait_after_the_last_attempt",
                "tests/test_retry.py::test_decorator_raises_after_the_last_attempt",
            ],
            pass_to_pass=[
                "tests/test_retry.py::test_returns_first_success",
                "tests/test_retry.py::test_other_exceptions_are_not_retried",
                "tests/test_retry.py::test_rejects_zero_attempts",
                "tests/test_retry.py::test_decorator_passes_arguments",
                "tests/test_retry.py::test_backoff_multiplies_the_wait",
            ],
        ),
    ]


def git(cwd: Path, *args: str, date: str | None = None) -> str:
    env = {**os.environ, **GIT_ENV}
    if date:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def diff_of(repo: Path, files: dict[str, str]) -> str:
    """The diff that turns the files at HEAD into ``files`` (existing files only), leaving the tree clean."""
    missing = [rel for rel in files if not (repo / rel).is_file()]
    if missing:
        raise AssertionError(f"patches may only modify tracked files: {missing}")
    write(repo, files)
    out = git(repo, "diff", "--no-color", "--no-ext-diff")
    git(repo, "checkout", "--", ".")
    return out


def build(spec: Spec, tmp: Path) -> dict:
    repo = tmp / spec.name
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for commit in spec.commits:
        write(repo, commit.files)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", commit.message, date=commit.date)
    base = git(repo, "rev-parse", "HEAD").strip()
    gold = diff_of(repo, spec.gold)
    test_patch = diff_of(repo, spec.tests)
    bundle = HERE / f"{spec.name}.bundle"
    bundle.unlink(missing_ok=True)
    git(repo, "bundle", "create", str(bundle), "main")
    return {
        "instance_id": f"swe-gym-env__{spec.name}-{spec.number}",
        "repo": f"swe-gym-env/{spec.name}",
        "base_commit": base,
        "problem_statement": spec.problem,
        "hints_text": spec.hints,
        "created_at": spec.created_at,
        "version": spec.version,
        "patch": gold,
        "test_patch": test_patch,
        "FAIL_TO_PASS": spec.fail_to_pass,
        "PASS_TO_PASS": spec.pass_to_pass,
        "repo_source": bundle.name,
    }


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in specs():
            rows.append(build(spec, Path(tmp)))
            print(f"{spec.name}: base_commit={rows[-1]['base_commit']}")
    (HERE / "tasks.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    main()
