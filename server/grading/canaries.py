"""Mutation canaries: one-off mutants of a task's FAIL_TO_PASS tests that the gold patch fails.

A mutant changes one expected value of a test, in place: a constant an `assert … == …` (or `is True/False`)
compares against (a number, a string, a boolean, bytes, an element of a list, tuple, set or dict literal), the
expected argument of `assertEqual` and its kin, or the expected exception type of `pytest.raises` /
`assertRaises` (replaced by a fresh class nothing can raise). Only `==`-like comparisons are mutated: for `<`, `!=` or
`in`, a value other than gold's may be just as right, and would pass a mutant gold fails.

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
ROUNDS = 2  # candidates tried per test function (each round: two gold runs)


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
    """The mutations a test function allows, in source order: expected values first, then expected exceptions."""
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
    return list(dict.fromkeys([*values, *raises]))


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
    return [], "no FAIL_TO_PASS test compares against a constant or expects an exception type"


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
