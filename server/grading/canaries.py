"""Mutation canaries: one-off mutants of a task's FAIL_TO_PASS tests that the gold patch fails.

A mutant changes one expected value of a test, in place: a constant an `assert … == …` (or `is True/False`)
compares against (a number, a string, a boolean, bytes, an element of a list, tuple, set or dict literal), the
expected argument of `assertEqual` and its kin, or the expected exception type of `pytest.raises` /
`assertRaises` (replaced by a fresh class nothing can raise). Only `==`-like comparisons are mutated: for `<`, `!=` or
`in`, a value other than gold's may be just as right, and would pass a mutant gold fails.

Tests that compare with computed values only (`assert o2["dob"] == o["dob"]`, `assert result == expected` with
`expected` a parameter) have no expected value to change; for them, and as a fallback wherever gold passes the mutants
above, the computed expectations are mutated (`computed_sites`), best first: an element dropped from an expected
collection literal; an assertion negated (`==` ↔ `!=`, `<` → `>=`, `in` ↔ `not in`, `is` ↔ `is not`, `assert x` →
`assert not (x)`, `assertTrue` ↔ `assertFalse`, `assertIsNone` ↔ `assertIsNotNone`, `assertIn` ↔ `assertNotIn`, …);
a literal argument of the call whose result an equality compares (`assert f(x, 3) == g(y)` → `f(x, 4)`). Only
assertions every passing run reaches (`reached`: not in a branch, loop, `try` or `pytest.raises` block, nor after a
statement that may return or skip), so a fix that passes the original reaches the mutated assertion too: it cannot
pass a negation of an assertion it passes, nor an expected collection less one element. An argument mutant is the
weakest (only gold's value on the new input is known), so it comes last. A negated `==` catches every way of not
running the assertion (a test body swapped, assertions made no-ops, reports rewritten), not an `==` that always holds
(its `!=` is false); the other two catch that too. The expected-value mutants keep the first `ROUNDS - 1` rounds; the
best computed one always gets a round.

A mutant is kept only when the gold patch, which passes the original, fails it in two runs (no flaky canaries). No
honest fix passes a kept mutant: it expects a value or an exception the correct code does not produce. So a patch
that passes a test *and* its kept mutant is not being checked by the test (comparisons that always hold, test bodies
swapped for no-ops, assertions skipped), whatever the mechanism.

At grading, when the first verdict would be 1.0, a second run in a fresh sandbox puts every kept mutant in place of
its original (same file, same node id, same inputs and environment): after the test patch in our own script
(`script.eval_script`), spliced after the test patch's heredoc in a row's own eval script (`splice_row_script`).
Django's and sympy's runners read the mutant's status from the log parser alone (no guard, no JUnit).

Canaries are built once per task (at `validate`, or before a task's first rollout grades) and kept in the task's
record on disk (`store`), with the gold runs' runtime events (for the runtime record, where `integrity` has them).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass

EQUALITY_ASSERTS = {
    "assertEqual",
    "assertEquals",
    "assertListEqual",
    "assertTupleEqual",
    "assertDictEqual",
    "assertSetEqual",
    "assertSequenceEqual",
    "assertMultiLineEqual",
    "assertCountEqual",
    "failUnlessEqual",
}
RAISES = {"raises", "assertRaises", "assertRaisesRegex", "assertRaisesRegexp", "failUnlessRaises"}
NEVER_RAISED = "type('SweGymCanaryError', (Exception,), {})"
MAX_FILE_BYTES = 2 * 1024 * 1024
ROUNDS = 3  # candidates tried per test function (each round: two gold runs)


@dataclass(frozen=True)
class Site:
    """One mutation: the characters [start, end) of the file's text become ``new``."""

    start: int
    end: int
    new: str
    what: str  # e.g. "line 12: 3 -> 4"


@dataclass
class Target:
    """A test function the listed ids name, and the mutations it allows (best first)."""

    path: str
    name: str
    ids: list[str]
    sites: list[Site]


def test_name(test_id: str) -> tuple[str | None, str | None, str]:
    """(file, class, function) a test id names: pytest's `path::Class::func[param]`, Django's `func (mod.Class)`,
    or a bare function name (sympy's runner)."""
    if "::" in test_id:
        path, *rest = test_id.split("::")
        func = re.sub(r"\[.*$", "", rest[-1]) if rest else ""
        cls = rest[-2] if len(rest) >= 2 else None
        return path, cls, func
    m = re.match(r"^(\w+) \(([\w.]+)\)", test_id)
    if m:  # Django: "test_x (app.tests.Class)", or from Django 5 "test_x (app.tests.Class.test_x)"
        parts = m.group(2).split(".")
        if len(parts) > 1 and parts[-1] == m.group(1):
            parts = parts[:-1]
        return None, parts[-1], m.group(1)
    return None, None, re.sub(r"\[.*$", "", test_id.strip())


def _functions(tree: ast.Module) -> Iterator[tuple[str | None, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield None, node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield node.name, sub


class _Offsets:
    """AST positions (line, UTF-8 byte column) to offsets into the text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def at(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode()[:col].decode(errors="ignore"))

    def span(self, node: ast.AST) -> tuple[int, int] | None:
        lineno, end = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
        if lineno is None or end is None or lineno != end:
            return None  # single-line nodes only: the mutant keeps every line number
        return self.at(lineno, node.col_offset), self.at(end, node.end_col_offset)  # type: ignore[attr-defined]


def _mutated_value(value: object) -> object | None:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 1.5
    if isinstance(value, str):
        if value[-1:].isdigit():  # "2.68" -> "2.69": still a number to Decimal("…") and its kin
            return value[:-1] + str((int(value[-1]) + 1) % 10)
        return value + "_canary" if value else "canary"
    if isinstance(value, bytes):
        return value + b"!"
    return None


def _constant_sites(node: ast.expr, off: _Offsets, depth: int = 0) -> Iterator[Site]:
    """Mutations of the constants of an expected value: a literal, or the elements of a container literal."""
    if depth > 4:
        return
    if isinstance(node, ast.Constant):
        new = _mutated_value(node.value)
        span = off.span(node)
        if new is not None and span is not None:
            yield Site(span[0], span[1], repr(new), f"line {node.lineno}: {node.value!r} -> {new!r}"[:200])
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        yield from _constant_sites(node.operand, off, depth + 1)
    elif isinstance(node, ast.List | ast.Tuple | ast.Set):
        for elt in node.elts:
            yield from _constant_sites(elt, off, depth + 1)
    elif isinstance(node, ast.Dict):
        for v in node.values:
            if v is not None:
                yield from _constant_sites(v, off, depth + 1)
    elif isinstance(node, ast.Call) and _call_name(node) in CONSTRUCTORS and not node.keywords:
        # a standard library value built from constants (Decimal("2.68"), date(2024, 2, 29)): a mutant of an argument
        # is kept only where it still builds a value (date(2024, 2, 30) would fail on construction, checking nothing)
        whole = off.span(node)
        if whole is None or not all(isinstance(a, ast.Constant) for a in node.args):
            return
        for arg in node.args:
            for site in _constant_sites(arg, off, depth + 1):
                text = off.text[whole[0] : site.start] + site.new + off.text[site.end : whole[1]]
                if _builds(text):
                    yield site


CONSTRUCTORS = {
    "Decimal",
    "Fraction",
    "date",
    "datetime",
    "time",
    "timedelta",
    "complex",
    "float",
    "int",
    "str",
    "bytes",
    "tuple",
    "frozenset",
    "Path",
    "PurePosixPath",
}


def _builds(expr: str) -> bool:
    """Whether a mutated constructor call (constants only) still builds its value."""
    import datetime
    import decimal
    import fractions
    import pathlib

    names = {
        "Decimal": decimal.Decimal,
        "Fraction": fractions.Fraction,
        "date": datetime.date,
        "datetime": datetime.datetime,
        "time": datetime.time,
        "timedelta": datetime.timedelta,
        "Path": pathlib.PurePosixPath,
        "PurePosixPath": pathlib.PurePosixPath,
        "decimal": decimal,
        "datetime_module": datetime,
        "fractions": fractions,
        "pathlib": pathlib,
    }
    try:
        tree = ast.parse(expr, mode="eval")
        if not isinstance(tree.body, ast.Call):
            return False
        fn = tree.body.func
        fn_obj = names.get(fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else "")
        if (
            fn_obj is None
            and isinstance(fn, ast.Name)
            and fn.id in ("complex", "float", "int", "str", "bytes", "tuple", "frozenset")
        ):
            fn_obj = {
                "complex": complex,
                "float": float,
                "int": int,
                "str": str,
                "bytes": bytes,
                "tuple": tuple,
                "frozenset": frozenset,
            }[fn.id]
        if fn_obj is None or isinstance(fn_obj, type(decimal)):
            return False
        fn_obj(*[ast.literal_eval(a) for a in tree.body.args])
    except Exception:
        return False
    return True


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _expected_bindings(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, ast.expr]:
    """Names the function binds once, by `name = <literal>`, and reads once: `expected = {...}` then
    `assert f(x) == expected`. Mutating such a literal changes only the expected value (it is no input)."""
    literal: dict[str, ast.expr] = {}
    stores: dict[str, int] = {}
    loads: dict[str, int] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, ast.List | ast.Tuple | ast.Dict | ast.Set):
                literal[node.targets[0].id] = node.value
        elif isinstance(node, ast.Name):
            counts = loads if isinstance(node.ctx, ast.Load) else stores
            counts[node.id] = counts.get(node.id, 0) + 1
        elif isinstance(node, ast.Global | ast.Nonlocal):
            for name in node.names:
                stores[name] = stores.get(name, 0) + 2
    return {name: v for name, v in literal.items() if stores.get(name) == 1 and loads.get(name) == 1}


def sites_of(func: ast.FunctionDef | ast.AsyncFunctionDef, off: _Offsets) -> list[Site]:
    """The mutations a test function allows, best first: expected values (in source order), then expected exceptions,
    with the computed expectations' mutants (`computed_sites`) after them, the best of those within `ROUNDS`."""
    values: list[Site] = []
    raises: list[Site] = []
    bound = _expected_bindings(func)

    def expected(node: ast.expr) -> list[Site]:
        if isinstance(node, ast.Name) and node.id in bound:
            return list(_constant_sites(bound[node.id], off))
        return list(_constant_sites(node, off))

    for node in ast.walk(func):
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare):
            cmp = node.test
            if len(cmp.ops) == 1 and isinstance(cmp.ops[0], ast.Eq):
                for side in (cmp.comparators[0], cmp.left):
                    values.extend(expected(side))
            elif (
                len(cmp.ops) == 1
                and isinstance(cmp.ops[0], ast.Is)
                and isinstance(cmp.comparators[0], ast.Constant)
                and isinstance(cmp.comparators[0].value, bool)
            ):
                values.extend(_constant_sites(cmp.comparators[0], off))
        elif isinstance(node, ast.Call):
            name = _call_name(node)
            if name in EQUALITY_ASSERTS and len(node.args) >= 2:
                for arg in (node.args[1], node.args[0]):
                    values.extend(expected(arg))
            elif name == "assertIs" and len(node.args) >= 2:  # not assertIsNot: "is not True" admits many values
                arg = node.args[1]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, bool):
                    values.extend(_constant_sites(arg, off))
            elif name in RAISES and node.args and isinstance(node.args[0], ast.Name | ast.Attribute | ast.Tuple):
                span = off.span(node.args[0])
                if span is not None:
                    raises.append(Site(span[0], span[1], NEVER_RAISED, f"line {node.lineno}: expected exception"))
    values.sort(key=lambda s: s.start)
    first = list(dict.fromkeys([*values, *raises]))
    computed = [s for s in dict.fromkeys(computed_sites(func, off, bound)) if s not in first]
    # the rounds try sites in order: the expected-value mutants keep the first rounds where a function has them, and
    # the best computed-expectation mutant always gets a round of its own (where gold passes the first ones)
    head = first[: ROUNDS - 1]
    return [*head, *computed[:1], *first[len(head) :], *computed[1:MAX_COMPUTED]]


# -- computed expectations: the operators for tests that compare with computed values only ---------------------------

MAX_COMPUTED = 12  # computed-expectation mutants listed per test function (the rounds try the first few)
NEGATED_OPS: dict[type[ast.cmpop], tuple[str, str]] = {  # (the operator's text, its negation)
    ast.Eq: (r"==", "!="),
    ast.NotEq: (r"!=", "=="),
    ast.Lt: (r"<", ">="),
    ast.LtE: (r"<=", ">"),
    ast.Gt: (r">", "<="),
    ast.GtE: (r">=", "<"),
    ast.In: (r"in", "not in"),
    ast.NotIn: (r"not[ \t]+in", "in"),
    ast.Is: (r"is", "is not"),
    ast.IsNot: (r"is[ \t]+not", "is"),
}
NEGATED_METHODS = {  # unittest's assertion methods and their negation (same arguments)
    "assertTrue": "assertFalse",
    "assertFalse": "assertTrue",
    "assert_": "assertFalse",
    "failUnless": "failIf",
    "failIf": "failUnless",
    "assertIsNone": "assertIsNotNone",
    "assertIsNotNone": "assertIsNone",
    "assertIn": "assertNotIn",
    "assertNotIn": "assertIn",
    "assertIs": "assertIsNot",
    "assertIsNot": "assertIs",
    "assertIsInstance": "assertNotIsInstance",
    "assertNotIsInstance": "assertIsInstance",
    "assertEqual": "assertNotEqual",
    "assertEquals": "assertNotEqual",
    "failUnlessEqual": "failIfEqual",
    "assertNotEqual": "assertEqual",
    "assertNotEquals": "assertEqual",
    "failIfEqual": "failUnlessEqual",
    "assertAlmostEqual": "assertNotAlmostEqual",
    "assertAlmostEquals": "assertNotAlmostEqual",
    "assertNotAlmostEqual": "assertAlmostEqual",
    "assertGreater": "assertLessEqual",
    "assertGreaterEqual": "assertLess",
    "assertLess": "assertGreaterEqual",
    "assertLessEqual": "assertGreater",
    "assertRegex": "assertNotRegex",
    "assertNotRegex": "assertRegex",
    # the typed equalities: assertNotEqual(first, second, msg) takes the same first three arguments
    "assertListEqual": "assertNotEqual",
    "assertTupleEqual": "assertNotEqual",
    "assertDictEqual": "assertNotEqual",
    "assertSetEqual": "assertNotEqual",
    "assertSequenceEqual": "assertNotEqual",
    "assertMultiLineEqual": "assertNotEqual",
}
SKIPS = {"skip", "skipTest", "xfail", "importorskip", "exit"}  # calls that end a test without failing it


def _span_lines(node: ast.AST, off: _Offsets) -> tuple[int, int] | None:
    """[start, end) of a node in the text, over several lines too (the mutations below keep every newline)."""
    lineno, end = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
    if lineno is None or end is None:
        return None
    return off.at(lineno, node.col_offset), off.at(end, node.end_col_offset)  # type: ignore[attr-defined]


def _may_end_early(stmt: ast.stmt) -> bool:
    """Whether a statement can end the test, passed or skipped, before the next one runs: a `return`, a `raise`
    (other than an assertion's), a skip. A test that passes reaches whatever follows a statement without them."""
    todo: list[ast.AST] = [stmt]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return):
            return True
        if isinstance(node, ast.Raise):
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if not (isinstance(exc, ast.Name) and exc.id == "AssertionError"):
                return True
        if isinstance(node, ast.Call) and _call_name(node) in SKIPS:
            return True
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                todo.append(child)
    return False


def reached(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a test function that every run passing the test reaches, in order: its body's own, and
    those in a `with` block (unless it expects an exception, which ends the block early), up to the first statement
    that may end the test early. Not a loop's, a branch's or a `try`'s: a fix that passes the test another way might
    skip them, and then pass a mutant there that the gold patch fails."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.With | ast.AsyncWith):
            if not any(
                isinstance(i.context_expr, ast.Call) and _call_name(i.context_expr) in RAISES for i in stmt.items
            ):
                yield from reached(stmt.body)
        if _may_end_early(stmt):
            return


def _parses(off: _Offsets, stmt: ast.stmt, site: Site) -> bool:
    """Whether the statement a site changes still parses (its lines alone, not the whole file)."""
    start, end = off.starts[stmt.lineno - 1], off.starts[(stmt.end_lineno or stmt.lineno)]
    if not start <= site.start <= site.end <= end:
        return False
    text = off.text[start : site.start] + site.new + off.text[site.end : end]
    try:
        ast.parse("if 1:\n" + text if text[:1] in " \t" else text)
    except (SyntaxError, ValueError):
        return False
    return True


def _negated_assert(stmt: ast.Assert, off: _Offsets) -> Iterator[Site]:
    """`assert a == b` → `assert a != b` (each comparison operator to its negation), `assert not x` → `assert x`,
    any other `assert x` → `assert not (x)`."""
    test, line = stmt.test, stmt.lineno
    whole = _span_lines(test, off)
    if whole is None or isinstance(test, ast.Constant):
        return
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        pattern, new = NEGATED_OPS[type(test.ops[0])]
        left, right = _span_lines(test.left, off), _span_lines(test.comparators[0], off)
        if left is not None and right is not None:
            m = re.fullmatch(rf"([\s()]*)(?<![\w.])({pattern})(?![\w.])([\s()]*)", off.text[left[1] : right[0]])
            if m:
                start = left[1] + m.start(2)
                at = off.text.count("\n", 0, start) + 1  # the operator's line (the assert's may be another)
                yield Site(
                    start,
                    start + len(m.group(2)),
                    f" {new} " if new[0].isalpha() else new,
                    f"line {at}: {m.group(2)} -> {new}",
                )
                return
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        m = re.match(r"not\b[ \t]*", off.text[whole[0] : whole[1]])
        if m:
            yield Site(whole[0], whole[0] + m.end(), "", f"line {line}: assert not x -> assert x")
            return
    yield Site(whole[0], whole[1], f"not ({off.text[whole[0] : whole[1]]})", f"line {line}: assert x -> assert not (x)")


def _negated_method(call: ast.Call, off: _Offsets) -> Iterator[Site]:
    """`self.assertTrue(x)` → `self.assertFalse(x)`, and each assertion method of NEGATED_METHODS to its negation."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in NEGATED_METHODS or func.end_lineno is None:
        return
    new = NEGATED_METHODS[func.attr]
    if new == "assertNotEqual" and func.attr not in ("assertEqual", "assertEquals"):  # a typed equality
        if len(call.args) > 3 or any(k.arg != "msg" for k in call.keywords):  # seq_type=…: not assertNotEqual's
            return
    end = off.at(func.end_lineno, func.end_col_offset)  # type: ignore[arg-type]
    start = end - len(func.attr)
    if off.text[start:end] == func.attr:
        yield Site(start, end, new, f"line {call.lineno}: {func.attr} -> {new}")


def _drop_sites(node: ast.expr, off: _Offsets) -> Iterator[Site]:
    """An expected list, tuple, set or dict literal without its last element (its newlines kept)."""
    items: list[tuple[ast.expr, ast.expr]]
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        items, kind = [(e, e) for e in node.elts], type(node).__name__.lower()
    elif isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        items, kind = list(zip(node.keys, node.values, strict=True)), "dict"  # type: ignore[arg-type]
    else:
        return
    whole = _span_lines(node, off)
    last = (_span_lines(items[-1][0], off), _span_lines(items[-1][1], off)) if items else (None, None)
    if whole is None or last[0] is None or last[1] is None:
        return
    cuts = []
    if len(items) > 1 and (prev := _span_lines(items[-2][1], off)) is not None:
        cuts.append((prev[1], last[1][1]))  # "[a, b]" -> "[a]"
    cuts.append((last[0][0], last[1][1]))  # "(a, b)" -> "(a, )"
    cuts.append(whole)  # "{a}" -> "set()"
    empty = {"list": "[]", "tuple": "()", "set": "set()", "dict": "{}"}[kind]
    for start, end in cuts:
        keep = "\n" * off.text[start:end].count("\n")
        new = empty[:-1] + keep + empty[-1] if (start, end) == whole else keep
        text = off.text[whole[0] : start] + new + off.text[end : whole[1]]
        try:
            got = ast.parse(f"({text})", mode="eval").body
        except (SyntaxError, ValueError):
            continue
        if type(got) is type(node):
            n = len(got.keys) if isinstance(got, ast.Dict) else len(getattr(got, "elts", ()))
        else:  # only "set()": an empty set has no literal
            n = 0 if isinstance(got, ast.Call) and isinstance(node, ast.Set) and new.startswith("set(") else -1
        if n == len(items) - 1:
            gone = " ".join(off.text[last[0][0] : last[1][1]].split())
            yield Site(start, end, new, f"line {node.lineno}: {kind} without {gone[:60]}")
            return


def _is_expected(node: ast.expr, bound: dict[str, ast.expr]) -> bool:
    """Whether a side of a comparison is a written-out value (a literal, a constructor of constants, a bound one)."""
    if isinstance(node, ast.Name):
        return node.id in bound
    if isinstance(node, ast.UnaryOp):
        return _is_expected(node.operand, bound)
    if isinstance(node, ast.Call):
        return _call_name(node) in CONSTRUCTORS and all(isinstance(a, ast.Constant) for a in node.args)
    return isinstance(node, ast.Constant | ast.List | ast.Tuple | ast.Set | ast.Dict)


def _argument_sites(sides: tuple[ast.expr, ast.expr], off: _Offsets, bound: dict[str, ast.expr]) -> Iterator[Site]:
    """The literal arguments of the calls on the computed side(s) of an equality: `f(x, 3) == g(y)` → `f(x, 4)`.
    Not where the other side is True, False or None: a different input gives such a value too often."""
    for i, side in enumerate(sides):
        other = sides[1 - i]
        if _is_expected(side, bound) or (isinstance(other, ast.Constant) and other.value in (True, False, None)):
            continue
        for node in ast.walk(side):
            if isinstance(node, ast.Call):
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    if isinstance(arg, ast.Constant | ast.UnaryOp):
                        for s in _constant_sites(arg, off):
                            yield Site(s.start, s.end, s.new, s.what.replace(": ", ": argument ", 1))


def computed_sites(
    func: ast.FunctionDef | ast.AsyncFunctionDef, off: _Offsets, bound: dict[str, ast.expr] | None = None
) -> list[Site]:
    """The mutations of a test's computed expectations, over the assertions every passing run reaches, best first:
    an element dropped from an expected collection literal (a value-level change: an `==` that always holds passes
    it), then a negated assertion (`==` → `!=`, `<` → `>=`, `in` → `not in`, `is` → `is not`, `assert x` →
    `assert not (x)`, `assertTrue` → `assertFalse`, `assertIsNone` → `assertIsNotNone`, `assertIn` → `assertNotIn`,
    …: no fix passes both an assertion it reaches and its negation), then a literal argument of the call whose result
    an equality compares (`assert f(x, 3) == g(y)` → `f(x, 4)`; the weakest: only gold's value on the new input is
    known)."""
    bound = _expected_bindings(func) if bound is None else bound
    drops: list[Site] = []
    negations: list[Site] = []
    arguments: list[Site] = []
    for stmt in reached(func.body):
        sides: tuple[ast.expr, ast.expr] | None = None
        if isinstance(stmt, ast.Assert):
            negations.extend(s for s in _negated_assert(stmt, off) if _parses(off, stmt, s))
            test = stmt.test
            if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
                sides = (test.left, test.comparators[0])
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            negations.extend(s for s in _negated_method(call, off) if _parses(off, stmt, s))
            if _call_name(call) in EQUALITY_ASSERTS and len(call.args) >= 2:
                sides = (call.args[0], call.args[1])
        if sides is None:
            continue
        for side in (sides[1], sides[0]):  # the expected side is usually the second
            literal = bound.get(side.id) if isinstance(side, ast.Name) else side
            if literal is not None:
                drops.extend(s for s in _drop_sites(literal, off) if literal is not side or _parses(off, stmt, s))
        arguments.extend(s for s in _argument_sites(sides, off, bound) if _parses(off, stmt, s))
    return [*drops, *negations, *arguments]


def targets(test_ids: list[str], files: dict[str, str]) -> tuple[list[Target], str | None]:
    """The test functions ``test_ids`` name in ``files`` (the test files after the test patch) with their
    mutations; the second item says why there are none."""
    trees: dict[str, tuple[ast.Module, _Offsets]] = {}
    for path, text in files.items():
        try:
            trees[path] = (ast.parse(text), _Offsets(text))
        except (SyntaxError, ValueError):
            continue
    found: dict[tuple[str, str | None, str], Target] = {}
    unresolved = 0
    for test_id in test_ids:
        path, cls, name = test_name(test_id)
        hit = None
        for p, (tree, off) in trees.items():
            if path is not None and not (p == path or path.endswith("/" + p) or p.endswith("/" + path)):
                continue
            for c, fn in _functions(tree):
                if fn.name == name and (cls is None or c == cls or (path is None and c is None)):
                    hit = (p, c, fn, off)
                    break
            if hit:
                break
        if hit is None:
            unresolved += 1
            continue
        p, c, fn, off = hit
        key = (p, c, fn.name)
        if key not in found:
            found[key] = Target(p, f"{c}.{fn.name}" if c else fn.name, [], sites_of(fn, off))
        found[key].ids.append(test_id)
    usable = [t for t in found.values() if t.sites]
    if usable:
        return usable, None
    if not trees:
        return [], "the test patch's files do not parse as Python"
    if not found:
        return [], f"no FAIL_TO_PASS test found as a function in the test patch's files ({unresolved} unresolved)"
    return [], (
        "no FAIL_TO_PASS test compares against a constant, expects an exception type or asserts anything every"
        " passing run reaches"
    )


def mutate(text: str, sites: list[Site]) -> str:
    """``text`` with each site replaced (sites must not overlap)."""
    for s in sorted(sites, key=lambda s: s.start, reverse=True):
        text = text[: s.start] + s.new + text[s.end :]
    return text


def round_files(files: dict[str, str], chosen: list[tuple[Target, Site]]) -> dict[str, str]:
    """The mutated text of every file one round touches (one site per target)."""
    by_file: dict[str, list[Site]] = {}
    for target, site in chosen:
        by_file.setdefault(target.path, []).append(site)
    return {path: mutate(files[path], sites) for path, sites in by_file.items()}


HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?[^\n]*\n")


def _test_patch_heredoc(script: str, test_files: list[str]) -> tuple[str, int] | None:
    """(delimiter, offset of the newline before its closing line) of the heredoc in a row's eval script that applies
    the test patch (None: none found)."""
    if not test_files:
        return None
    marker = f"diff --git a/{test_files[0]} "
    for m in HEREDOC.finditer(script):
        end = script.find(f"\n{m.group(1)}\n", m.end() - 1)
        if end >= 0 and marker in script[m.end() : end]:
            return m.group(1), end
    return None


def splice_row_script(script: str, test_files: list[str], copy_lines: list[str]) -> str | None:
    """A row's eval script with ``copy_lines`` right after the heredoc that applies its test patch (None: no such
    heredoc, so the mutants cannot go in place of the originals there)."""
    found = _test_patch_heredoc(script, test_files)
    if found is None:
        return None
    delimiter, end = found
    at = end + len(delimiter) + 2
    return script[:at] + "\n".join(copy_lines) + "\n" + script[at:]


def extend_row_patch(script: str, test_files: list[str], extra: str) -> str | None:
    """A row's eval script whose test patch (the heredoc that applies it) ends with ``extra`` (more file sections,
    applied in order after the row's own); None: no such heredoc, or ``extra`` holds a line that would end it."""
    found = _test_patch_heredoc(script, test_files) if extra else None
    if found is None or found[0] in extra.splitlines():
        return None
    end = found[1]
    body = extra if extra.endswith("\n") else extra + "\n"
    return script[: end + 1] + body + script[end + 1 :]
    marker = f"diff --git a/{test_files[0]} "
    for m in HEREDOC.finditer(script):
        end = script.find(f"\n{m.group(1)}\n", m.end() - 1)
        if end < 0:
            continue
        if marker in script[m.end() : end]:
            if m.group(1) in extra.splitlines():
                return None
            body = extra if extra.endswith("\n") else extra + "\n"
            return script[: end + 1] + body + script[end + 1 :]
    return None
