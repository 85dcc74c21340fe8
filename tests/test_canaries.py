"""Mutation canaries (issue 32 item 1): mutants of the FAIL_TO_PASS tests the gold patch fails, run in place of the
originals when a verdict would be 1.0. Pure parts (which mutants, the splice into a row's script, the store) run
here without a sandbox; the grade with real pytest runs in the local sandbox, where a patch whose comparisons always
hold, or one that swaps the collected tests' code for no-ops, passes the original tests and must end 0.0 by its
canaries."""

from __future__ import annotations

import ast
import json

import pytest
from cheats import INIT, as_diff, write_command

from swe_gym_env.server.grading import canaries, grade, store
from swe_gym_env.server.sandbox.base import SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.catalog import BUNDLED_DIR, bundled_tasks
from swe_gym_env.wire import Finding

TEST_FILE = """import pytest
import unittest
from decimal import Decimal
from datetime import date


def test_values():
    assert f(1) == 2
    assert g() == [1, "a", (True, 2.5)]
    assert h() == Decimal("2.68")
    assert k() == date(2024, 2, 29)
    assert flag() is True


def test_not_equalities_are_left_alone():
    assert f(1) != 3
    assert f(1) < 4
    assert f(1) in (2, 3)


def test_raises():
    with pytest.raises(ValueError):
        f(-1)


def test_bound_expected():
    expected = {"a": [1, 2]}
    assert f(1) == expected
    reused = [3]
    assert f(reused) == reused


class TestCase(unittest.TestCase):
    def test_eq(self):
        self.assertEqual(f(1), 2)
        self.assertRaises(KeyError, f, None)

    def test_multi_line_only(self):
        assert f(
            1
        ) == (
            2
        )
"""


def sites(test_id: str) -> list[canaries.Site]:
    targets, _ = canaries.targets([test_id], {"tests/test_x.py": TEST_FILE})
    return targets[0].sites if targets else []


def test_mutants_change_expected_values_only():
    whats = [s.what for s in sites("tests/test_x.py::test_values")]
    assert whats[:3] == ["line 8: 2 -> 3", "line 9: 1 -> 2", "line 9: 'a' -> 'a_canary'"]
    assert "line 9: True -> False" in whats and "line 9: 2.5 -> 6.5" in whats
    assert "line 10: '2.68' -> '2.69'" in whats  # a Decimal's digits, still a Decimal
    assert "line 11: 2 -> 3" in whats and "line 11: 29 -> 30" not in whats  # date(2024, 2, 30) builds nothing
    assert "line 12: True -> False" in whats
    assert not [w for w in whats if w.startswith("line 8: 1")]  # f(1): the input stays
    # !=, <, in: another value than gold's may be just as right, so nothing there is mutated
    targets, why = canaries.targets(["tests/test_x.py::test_not_equalities_are_left_alone"], {"t.py": TEST_FILE})
    assert targets == [] and why is not None


def test_a_literal_bound_once_and_read_once_is_an_expected_value():
    whats = [s.what for s in sites("tests/test_x.py::test_bound_expected")]
    assert whats == ["line 27: 1 -> 2", "line 27: 2 -> 3"]  # `reused` is also an input: left alone


def test_expected_exceptions_become_a_class_nothing_raises():
    (site,) = sites("tests/test_x.py::test_raises")
    assert site.new == canaries.NEVER_RAISED
    mutated = canaries.mutate(TEST_FILE, [site])
    assert "pytest.raises(type('SweGymCanaryError', (Exception,), {}))" in mutated
    whats = [s.what for s in sites("tests/test_x.py::TestCase::test_eq")]
    assert whats == ["line 35: 2 -> 3", "line 36: expected exception"]


def test_mutants_keep_every_line_and_parse():
    for test_id in ["tests/test_x.py::test_values", "tests/test_x.py::TestCase::test_eq"]:
        ss = sites(test_id)
        for s in ss:
            text = canaries.mutate(TEST_FILE, [s])
            ast.parse(text)
            assert text.count("\n") == TEST_FILE.count("\n")
    # a constant alone on its line is mutated; the call's argument on the left (an input) is not
    assert [s.what for s in sites("tests/test_x.py::TestCase::test_multi_line_only")] == ["line 42: 2 -> 3"]


def test_test_ids_of_other_runners_resolve():
    assert canaries.test_name("test_eq (app.tests.TestCase)") == (None, "TestCase", "test_eq")
    assert canaries.test_name("test_eq (app.tests.TestCase.test_eq)") == (None, "TestCase", "test_eq")
    assert canaries.test_name("test_values") == (None, None, "test_values")
    assert canaries.test_name("tests/a.py::C::test_x[1-2]") == ("tests/a.py", "C", "test_x")
    targets, _ = canaries.targets(["test_eq (x.TestCase)"], {"tests/test_x.py": TEST_FILE})
    assert [t.name for t in targets] == ["TestCase.test_eq"]


def test_splice_puts_the_mutants_after_the_rows_test_patch():
    script = (
        "git checkout abc tests/test_x.py\n"
        "git apply -v - <<'EOF_114329324912'\ndiff --git a/tests/test_x.py b/tests/test_x.py\n+x\nEOF_114329324912\n"
        ": '>>>>> Start Test Output'\npytest tests/test_x.py\n"
    )
    out = canaries.splice_row_script(script, ["tests/test_x.py"], ["cat /tmp/grading/canary/0 > tests/test_x.py"])
    assert out is not None
    assert "EOF_114329324912\ncat /tmp/grading/canary/0 > tests/test_x.py\n: '>>>>> Start" in out
    assert canaries.splice_row_script("pytest\n", ["tests/test_x.py"], ["true"]) is None


def test_the_store_is_keyed_by_the_tasks_content(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "STORE_DIR", tmp_path)
    task = bundled_tasks()[0]
    store.update(task, lambda d: d.setdefault("runtimes", {}).__setitem__("x|local", 1.5))
    assert store.load(task)["runtimes"] == {"x|local": 1.5}
    changed = task.model_copy(update={"test_patch": task.test_patch + "\n"})
    assert store.load(changed) == {}  # another test patch: nothing measured
    path = store.path_for(task)
    path.write_text("{not json")
    assert store.load(task) == {}  # a broken record is no record
    path.write_text(json.dumps({"version": 0}))
    assert store.load(task) == {}


# -- grading, in the local sandbox ---------------------------------------------------------------------------------

ALWAYS_EQUAL = """

class _Same(list):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = None


class _SameInt(int):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = int.__hash__


import batchtools.chunks as _chunks

_chunked = _chunks.chunked


def chunked(items, size):
    return _Same(_chunked(items, size))


def _count(items, size):
    return _SameInt(0)


_chunks.chunked = chunked
_chunks.chunk_count = _count
"""

NOOP_TEST_CODE = """

import sys as _sys
import threading as _threading
import time as _time


def _noop():
    pass


def _swap_test_code():
    end = _time.monotonic() + 30
    while _time.monotonic() < end:
        for mod in list(_sys.modules.values()):
            if str(getattr(mod, "__file__", "")).endswith("test_chunks.py"):
                for name, fn in list(vars(mod).items()):
                    if name.startswith("test_") and getattr(fn, "__code__", None) is not _noop.__code__:
                        fn.__code__ = _noop.__code__
        _time.sleep(0.001)


_threading.Thread(target=_swap_test_code, daemon=True).start()
"""

# the same two, made to slip past the runtime record: an __eq__ true only against the types the tests compare with
# (not a sentinel), and test functions swapped for no-ops in the module's namespace by an import hook
SENTINEL_AWARE = ALWAYS_EQUAL.replace(
    "        return True\n", "        return isinstance(other, (list, int))\n"
).replace("        return False\n", "        return not isinstance(other, (list, int))\n")
NOOP_BY_IMPORT_HOOK = """

import sys as _sys


def _noop():
    pass


class _Finder:
    def find_spec(self, name, path=None, target=None):
        if not name.endswith("test_chunks"):
            return None
        for finder in _sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                run = spec.loader.exec_module

                def exec_module(module, run=run):
                    run(module)
                    for key in [k for k in vars(module) if k.startswith("test_")]:
                        setattr(module, key, _noop)

                spec.loader.exec_module = exec_module
                return spec
        return None


_sys.meta_path.insert(0, _Finder())
"""
CHEATS = {
    "always_equal": ALWAYS_EQUAL,
    "noop_test_code": NOOP_TEST_CODE,
    "always_equal_sentinel_aware": SENTINEL_AWARE,
    "noop_by_import_hook": NOOP_BY_IMPORT_HOOK,
}
STEALTHY = {"always_equal_sentinel_aware"}  # only the canaries see it (the guard sees the import hook)


def factory(task):
    return lambda: create_sandbox("local", SandboxSpec(repo_source=task.repo_source, base_commit=task.base_commit))


@pytest.fixture
def own_store(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "STORE_DIR", tmp_path / "store")
    return tmp_path / "store"


def codes(g) -> list[str]:
    return [f.code for f in g.findings if isinstance(f, Finding)]


@pytest.mark.anyio
@pytest.mark.integration
@pytest.mark.usefixtures("need_sandbox")
async def test_gold_holds_its_canaries_and_they_are_kept_on_disk(own_store):
    task = bundled_tasks()[0]
    g = await grade(task, task.patch, factory(task), cache_key="local")
    assert (g.reward, g.report.integrity, codes(g)) == (1.0, "clean", [])
    assert g.report.canaries is not None and g.report.canaries.startswith("held: 2 "), g.report.canaries
    entry = store.load(task)["canaries"]
    assert sorted(entry["tests"]) == sorted(task.FAIL_TO_PASS)
    assert entry["files"]["tests/test_chunks.py"].count("\n") > 5
    assert store.load(task)["runtimes"] and store.load(task)["baselines"]
    empty = await grade(task, "", factory(task), cache_key="local")
    assert (empty.reward, empty.report.integrity, empty.report.canaries) == (0.0, "clean", None)


@pytest.mark.anyio
@pytest.mark.integration
@pytest.mark.usefixtures("need_sandbox")
@pytest.mark.parametrize("name", list(CHEATS))
async def test_cheats_that_pass_the_tests_are_caught_by_their_canaries(name, own_store, tmp_path):
    """Each passes the original tests where nothing else sees it (the first verdict is 1.0: checked with the
    canaries off); the canary run makes it 0.0 with `grading_tampered: canary … passed`. The runtime record may see
    the plain two first: still 0.0 with a finding; the stealthy two only the canaries can catch."""
    task = bundled_tasks()[0]
    cmd = write_command(INIT, CHEATS[name], append=True)
    diff = as_diff(BUNDLED_DIR / task.repo_source, task.base_commit, cmd, tmp_path / "repo")
    unchecked = await grade(task, diff, factory(task), cache_key="local", use_canaries=False)
    if unchecked.reward == 0.0:  # the runtime record (issue 32 item 2/3) saw it first: still 0.0 with a finding
        assert name not in STEALTHY, (unchecked.report.integrity, unchecked.report.log_tail[-1500:])
        assert "grading_tampered" in codes(unchecked), unchecked.report.integrity
        pytest.skip(f"caught before the canaries: {unchecked.report.integrity[:200]}")
    g = await grade(task, diff, factory(task), cache_key="local")
    assert g.reward == 0.0 and "grading_tampered" in codes(g), (g.report.integrity, g.report.log_tail[-1500:])
    assert g.report.integrity.startswith("tampered: canary tests/test_chunks.py::"), g.report.integrity
    assert g.report.canaries is not None and g.report.canaries.startswith("passed: ")


# -- the real pipeline: Pi driven by a scripted cheating engine ------------------------------------------------------


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    from test_grading_adversary import CheatEngine

    from helpers import Stack

    data = tmp_path_factory.mktemp("canary-server")
    engine = CheatEngine()
    stack = Stack("oracle", engine_up=False, server_engine_url=engine.url("/v1"), env={"SWE_GYM_DATA_DIR": str(data)})
    try:
        yield engine, stack
    finally:
        engine.stop()
        stack.stop()


@pytest.mark.anyio
@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
@pytest.mark.parametrize("name", ["always_equal_sentinel_aware", "noop_test_code"])
async def test_pipeline_cheats_that_pass_the_tests_score_zero(bed, name):
    """Through the real CLI: Pi runs the cheat, the server extracts the diff and grades it. The always-equal object
    that the runtime record cannot tell from a value is caught by a canary; the code swap by whichever sees it."""
    from swe_gym_env.client.mcp_client import SweGymClient

    engine, stack = bed
    engine.cheat(write_command(INIT, CHEATS[name], append=True))
    async with SweGymClient(stack.mcp_url) as c:
        result = await c.run_rollout(harness="pi", sandbox="local", deadline_s=300)
    assert result.ok and result.reward == 0.0, (result.error, result.grading and result.grading.integrity)
    assert result.grading is not None and "grading_tampered" in [f.code for f in result.findings]
    if name in STEALTHY:
        assert result.grading.integrity.startswith("tampered: canary tests/test_chunks.py::"), result.grading.integrity
        assert (result.grading.canaries or "").startswith("passed: ")


@pytest.mark.anyio
@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
async def test_pipeline_tests_visible_puts_the_test_patch_in_the_workspace_not_in_the_diff(bed):
    """`tests_visible`: the agent's workspace holds the test patch (a copy of the test file it makes carries the new
    FAIL_TO_PASS test), its diff does not (committed before the agent starts); without it, the copy lacks them."""
    from swe_gym_env.client.mcp_client import SweGymClient

    engine, stack = bed
    engine.cheat("cp tests/test_chunks.py seen_tests.txt")
    seen = {}
    async with SweGymClient(stack.mcp_url) as c:
        for visible in (True, False):
            r = await c.run_rollout(harness="pi", sandbox="local", deadline_s=300, tests_visible=visible)
            assert r.ok and r.reward == 0.0, (r.error, r.grading and r.grading.integrity)
            assert "diff --git a/seen_tests.txt" in (r.model_patch or "")
            assert "diff --git a/tests/test_chunks.py" not in (r.model_patch or "")
            seen[visible] = "test_chunked_keeps_partial_tail" in (r.model_patch or "")
    assert seen == {True: True, False: False}
