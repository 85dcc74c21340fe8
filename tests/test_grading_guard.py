"""The grading guard and the grader's integrity rules, without a sandbox: real pytest runs (this venv's pytest >= 9,
which logs subtests as SUBFAILED lines) with the real guard plugin, read back the way grading reads them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cheats import IMPORT_HOOK, MONKEYPATCH_REPORT
from hypothesis import given
from hypothesis import strategies as st

from swe_gym_env.server.grading import Guarded, filter_model_patch, load_swebench, parse_junit, score_log
from swe_gym_env.server.grading.integrity import (
    PIN_SCRIPT,
    guard_plugin_source,
    protected_reason,
    read_record,
    section_paths,
)
from swe_gym_env.tasks.models import Task

T = "tests/test_sub.py::"
SUBTESTS = """import unittest


class TestSub(unittest.TestCase):
    def test_unittest_subtests(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertNotEqual(i, 1)

    def test_unittest_subtests_pass(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertGreaterEqual(i, 0)


def test_fixture_subtests(subtests):
    for i in range(3):
        with subtests.test(msg="each", i=i):
            assert i != 2


def test_plain():
    assert True
"""


@pytest.fixture(scope="module")
def swebench():
    return load_swebench()


def task(f2p: list[str], p2p: list[str]) -> Task:
    return Task(
        instance_id="guard__case-1",
        repo="guard/case",
        base_commit="0" * 40,
        problem_statement="x",
        test_patch="diff --git a/tests/test_sub.py b/tests/test_sub.py\n",
        FAIL_TO_PASS=f2p,
        PASS_TO_PASS=p2p,
    )


def guarded_run(root: Path, files: dict[str, str]) -> tuple[str, bytes, bytes, bytes]:
    """pytest on ``files`` with the guard loaded as grading loads it: (log, junit, record, key)."""
    repo = root / "repo"
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        if not (repo / path).exists() or (repo / path).read_text() != text:  # an unchanged file keeps its mtime
            (repo / path).write_text(text)
    guard = Guarded(str(root / "guard"), b"k" * 64, junit=True)
    Path(guard.dir).mkdir()
    (Path(guard.dir) / "swe_gym_guard.py").write_bytes(guard_plugin_source())
    (Path(guard.dir) / "key").write_bytes(guard.key)
    env = {
        "PATH": os.environ["PATH"],
        "SWE_GYM_GUARD": guard.dir,
        "PYTHONPATH": f"{guard.dir}:{repo}",
        "PYTEST_ADDOPTS": f"-p swe_gym_guard --junitxml={guard.junit_path} -o junit_logging=no",
    }
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "tests"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert not (Path(guard.dir) / "key").exists(), "the guard deletes its key before the code under test runs"
    log = f">>>>> Start Test Output\n{r.stdout}{r.stderr}>>>>> End Test Output\n>>>>> Test Exit Code: {r.returncode}\n"
    junit = Path(guard.junit_path).read_bytes() if Path(guard.junit_path).exists() else b""
    return log, junit, Path(guard.record_path).read_bytes(), guard.key


def grade_log(swebench, t: Task, run) -> object:
    log, junit, record, key = run
    return score_log(
        t, log, swebench, parse_junit(junit), record=read_record(record, key), touched=set(), junit_bytes=junit
    )


@pytest.fixture(scope="module")
def subtests_run(tmp_path_factory):
    return guarded_run(tmp_path_factory.mktemp("sub"), {"tests/test_sub.py": SUBTESTS})


def test_this_pytest_logs_failed_subtests_as_subfailed_lines(subtests_run):
    log = subtests_run[0]
    assert "SUBFAILED" in log, log[-3000:]


@pytest.mark.parametrize("name", ["TestSub::test_unittest_subtests", "test_fixture_subtests"])
def test_a_failed_subtest_fails_its_test_never_a_pass_and_never_tampering(swebench, subtests_run, name):
    g = grade_log(swebench, task([T + name], [T + "test_plain"]), subtests_run)
    assert g.reward == 0.0 and g.report.integrity == "clean", g.report.integrity
    assert g.report.fail_to_pass["failure"] == [T + name]
    assert any("failed subtest" in str(f) for f in g.findings)


def test_passing_subtests_pass(swebench, subtests_run):
    g = grade_log(swebench, task([T + "TestSub::test_unittest_subtests_pass"], [T + "test_plain"]), subtests_run)
    assert g.reward == 1.0 and g.report.integrity == "clean" and g.report.junit_cross_check == "match"


def test_the_record_is_keyed_chained_and_ends(subtests_run):
    _, _, record, key = subtests_run
    rec = read_record(record, key)
    assert rec.started and rec.ended and not rec.problems, rec.problems
    assert {c["id"] for c in rec.calls} >= {T + "test_plain", T + "test_fixture_subtests"}
    assert rec.junit_sha256 and rec.pytest_version.split(".")[0] >= "9"
    assert read_record(record, b"another key").problems, "a wrong key verifies nothing"
    lines = record.splitlines(keepends=True)
    altered = b"".join([*lines[:2], lines[2].replace(b"passed", b"failed").replace(b"ok", b"ko"), *lines[3:]])
    assert any("altered" in p for p in read_record(altered, key).problems)
    dropped = b"".join(lines[:2] + lines[3:])
    assert read_record(dropped, key).problems, "a removed line breaks the chain"
    assert not read_record(b"".join(lines[:-1]), key).ended, "no end line: the run did not reach pytest's end"


BROKEN = "import pkg\n\n\ndef test_fixed():\n    assert pkg.VALUE == 2\n\n\ndef test_kept():\n    assert True\n"


def test_a_rewritten_report_is_tampering_under_this_pytest(swebench, tmp_path):
    run = guarded_run(tmp_path, {"pkg/__init__.py": "VALUE = 1\n" + MONKEYPATCH_REPORT, "tests/test_sub.py": BROKEN})
    assert "1 passed" not in run[0] and "2 passed" in run[0], "the cheat works on pytest's own reporting"
    g = grade_log(swebench, task([T + "test_fixed"], [T + "test_kept"]), run)
    assert g.reward == 0.0 and g.report.integrity.startswith("tampered: ")
    assert "replaced _pytest.reports.TestReport.from_item_and_call" in g.report.integrity
    assert "says passed where the test raised AssertionError" in g.report.integrity


def test_an_import_hook_from_the_package_is_tampering(swebench, tmp_path):
    """The repository's own conftest imports the package, whose patched __init__ puts a finder first on
    sys.meta_path that loads test modules with their asserts neutralised (the assertion rewriter never sees them)."""
    files = {
        "conftest.py": "import pkg  # noqa\n",
        "pkg/__init__.py": "VALUE = 1\n" + IMPORT_HOOK,
        "tests/__init__.py": "",
        "tests/test_sub.py": BROKEN,
    }
    run = guarded_run(tmp_path, files)
    assert "2 passed" in run[0], "the cheat works: the failing assert was neutralised"
    g = score_log(
        task([T + "test_fixed"], [T + "test_kept"]),
        run[0],
        swebench,
        parse_junit(run[1]),
        record=read_record(run[2], run[3]),
        touched={"pkg/__init__.py"},
        junit_bytes=run[1],
    )
    assert g.reward == 0.0 and "an import hook (sys.meta_path) implemented from pkg/__init__.py" in g.report.integrity


def test_an_honest_run_of_the_same_shape_is_clean(swebench, tmp_path):
    run = guarded_run(tmp_path, {"pkg/__init__.py": "VALUE = 2\n", "tests/test_sub.py": BROKEN})
    g = grade_log(swebench, task([T + "test_fixed"], [T + "test_kept"]), run)
    assert g.reward == 1.0 and g.report.integrity == "clean"


# -- protected paths and pinned settings -------------------------------------------------------------------------
def rename(old: str, new: str) -> str:
    return f"diff --git a/{old} b/{new}\nsimilarity index 100%\nrename from {old}\nrename to {new}\n"


@pytest.mark.parametrize(
    ("path", "protected"),
    [
        ("conftest.py", True),
        ("a/b/c/conftest.py", True),
        (".pytest.ini", True),
        ("pytest.toml", True),
        ("sub/.pytest.toml", True),
        ("sitecustomize.py", True),
        ("src/usercustomize.py", True),
        ("pkg/x.pth", True),
        ("pkg/__pycache__/m.cpython-311.pyc", True),
        ("pkg.egg-info/entry_points.txt", True),
        ("tests/test_sub.py", True),  # a verdict file
        ("setup.cfg", False),  # pinned, not dropped
        ("pyproject.toml", False),
        ("pkg/module.py", False),
        ("tests/helpers.py", False),
        ("tests/__init__.py", True),  # the package init of a verdict file's directory
        ("pkg/__init__.py", False),
    ],
)
def test_protected_paths(path, protected):
    assert (protected_reason(path, {"tests/test_sub.py"}) is not None) == protected


def test_renames_are_judged_by_both_names():
    t = task([T + "test_fixed"], [])
    kept, dropped = filter_model_patch(rename("pkg/plugin.py", "tests/conftest.py"), t)
    assert kept == "" and dropped == ["pkg/plugin.py"]
    kept, dropped = filter_model_patch(rename("tests/test_sub.py", "tests/old.py"), t)
    assert kept == "" and dropped
    symlink = "diff --git a/pkg/link b/pkg/link\nnew file mode 120000\nindex 0000000..1111111\n--- /dev/null\n"
    assert filter_model_patch(symlink, t) == ("", ["pkg/link"])


@given(st.from_regex(r"[a-z]{1,8}(/[a-z_]{1,8}){0,3}\.py", fullmatch=True), st.sampled_from(sorted(["conftest.py"])))
def test_a_rename_onto_a_startup_name_is_always_dropped(old, name):
    new = str(Path(old).parent / name) if "/" in old else name
    t = task([T + "test_fixed"], [])
    assert filter_model_patch(rename(old, new), t)[0] == ""
    assert new in section_paths(rename(old, new)) and old in section_paths(rename(old, new))


def pin(tmp_path: Path, base: str | None, new: str, name: str) -> int:
    (tmp_path / "pin.py").write_text(PIN_SCRIPT)
    (tmp_path / name).write_text(new)
    (tmp_path / "base").write_text(base or "")
    return subprocess.run(
        [sys.executable, "-I", "-S", str(tmp_path / "pin.py"), str(tmp_path / name), str(tmp_path / "base")]
    ).returncode


CFG = "[metadata]\nname = x\nversion = 1.0\n\n[tool:pytest]\naddopts = -ra\n\n[flake8]\nmax-line-length = 100\n"
TOML = '[project]\nname = "x"\nversion = "1.0"\n\n[tool.pytest.ini_options]\naddopts = "-ra"\n\n[tool.ruff]\nx = 1\n'


@pytest.mark.parametrize(
    ("name", "base", "new", "changed"),
    [
        ("setup.cfg", CFG, CFG.replace("version = 1.0", "version = 1.1"), False),
        ("setup.cfg", CFG, CFG.replace("max-line-length = 100", "max-line-length = 120"), False),
        ("setup.cfg", CFG, CFG.replace("addopts = -ra", "addopts = -ra -p pkg.plugin"), True),
        ("setup.cfg", CFG, CFG + "\n[pytest]\naddopts = -p pkg.plugin\n", True),
        ("setup.cfg", None, "[tool:pytest]\naddopts = -p pkg.plugin\n", True),
        ("setup.cfg", None, "[metadata]\nname = x\n", False),
        ("pyproject.toml", TOML, TOML.replace('version = "1.0"', 'version = "1.1"'), False),
        ("pyproject.toml", TOML, TOML.replace('addopts = "-ra"', 'addopts = "-p pkg.plugin"'), True),
        ("pyproject.toml", TOML, TOML + '\n[tool.pytest]\naddopts = ["-p", "pkg.plugin"]\n', True),
        (
            "pyproject.toml",
            TOML,
            TOML.replace("[tool.ruff]", 'tool.pytest.ini_options.addopts = "-p x"\n[tool.ruff]'),
            True,
        ),
        ("tox.ini", "[tox]\nenvlist = py3\n", "[tox]\nenvlist = py3\n[pytest]\naddopts = -p pkg.plugin\n", True),
    ],
)
def test_the_pin_script_sees_exactly_pytest_settings(tmp_path, name, base, new, changed):
    assert pin(tmp_path, base, new, name) == (1 if changed else 0)
