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
from swe_gym_env.server.grading.files import BaseTree, config_change_reason, protected_reason
from swe_gym_env.server.grading.integrity import guard_launch_source, guard_plugin_source, read_record, section_paths
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
    """pytest on ``files`` started as grading starts it (the launcher: setup resolved first, then the collector and
    the guarded test process): (log, junit, record, key)."""
    repo = root / "repo"
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        if not (repo / path).exists() or (repo / path).read_text() != text:  # an unchanged file keeps its mtime
            (repo / path).write_text(text)
    guard = Guarded(b"k" * 64, junit=True, dir=str(root / "guard"))
    Path(guard.dir).mkdir()
    (Path(guard.dir) / "swe_gym_guard.py").write_bytes(guard_plugin_source())
    launcher = Path(guard.dir) / "swe_gym_launch.py"
    launcher.write_bytes(guard_launch_source())
    (Path(guard.dir) / "key").write_bytes(guard.key)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(repo)}
    args = ["-rA", "-p", "no:cacheprovider", "tests"]
    for what, extra in (("resolve", []), ("run", guard.extra_args())):
        r = subprocess.run(
            [sys.executable, str(launcher), what, guard.dir, "module", "--", *extra, *args],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert what == "run" or r.returncode == 0, r.stderr
    assert not (Path(guard.dir) / "key").exists(), "the collector deletes the key before the test process starts"
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


def test_the_record_is_chained_by_the_collector_and_ends(subtests_run):
    _, _, record, key = subtests_run
    rec = read_record(record, key)
    assert rec.started and rec.ended and not rec.problems, rec.problems
    assert rec.exit_code == 1  # the failed subtests
    assert {c["id"] for c in rec.calls} >= {T + "test_plain", T + "test_fixture_subtests"}
    assert rec.junit_sha256 and rec.pytest_version.split(".")[0] >= "9"
    assert read_record(record, b"another key").problems, "a wrong key verifies nothing"
    lines = record.splitlines(keepends=True)
    altered = b"".join([*lines[:2], lines[2].replace(b"passed", b"failed").replace(b"ok", b"ko"), *lines[3:]])
    assert any("altered" in p for p in read_record(altered, key).problems)
    dropped = b"".join(lines[:2] + lines[3:])
    assert read_record(dropped, key).problems, "a removed line breaks the chain"
    assert not read_record(b"".join(lines[:-1]), key).ended, "no exit line: the collector did not see the end"


def test_lines_the_test_process_writes_to_the_pipe_are_not_the_guards(subtests_run):
    """Something in the test process writing to the collector's pipe: the collector chains whatever arrives (it
    cannot be taken back), and the grader sees it is not the guard's (wrong numbering, a phase twice)."""
    import hashlib
    import hmac
    import json

    _, _, record, key = subtests_run
    lines = record.splitlines()
    prev = json.loads(lines[4])["mac"]
    body = json.loads(json.loads(lines[5])["p"])
    forged = json.dumps({**body}, sort_keys=True, separators=(",", ":"))  # a copy of a real line, replayed
    out = lines[:5]
    for n, payload in enumerate([forged, *(json.loads(x)["p"] for x in lines[5:])], start=5):
        mac = hmac.new(key, (prev + str(n) + "\n" + payload).encode(), hashlib.sha256).hexdigest()
        out.append(json.dumps({"n": n, "p": payload, "mac": mac}).encode())
        prev = mac
    rec = read_record(b"\n".join(out), key)
    assert any("not the guard's" in p for p in rec.problems), rec.problems


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
        ("a/b/c/ConfTest.py", True),  # case folded
        (".pytest.ini", True),
        ("pytest.toml", True),
        ("sub/.pytest.toml", True),
        ("sitecustomize.py", True),
        ("src/usercustomize.py", True),
        ("setup.py", True),
        ("pkg/x.pth", True),
        ("pkg/__pycache__/m.cpython-311.pyc", True),
        ("pkg.egg-info/entry_points.txt", True),
        ("pkg.DIST-INFO/entry_points.txt", True),  # the case importlib.metadata ignores
        ("pkg.dist\uff0dinfo/entry_points.txt", True),  # a full-width hyphen: NFKC makes it "-"
        ("pytest.py", True),
        ("PyTest.py", True),
        ("_pytest/__init__.py", True),
        ("pluggy/__init__.py", True),
        ("typing.py", True),
        ("pytest_evil.py", True),
        ("tests/test_sub.py", True),  # a verdict file
        ("TESTS/Test_Sub.py", True),
        ("setup.cfg", False),  # judged by its parser (config_change_reason)
        ("pyproject.toml", False),
        ("pkg/module.py", False),
        ("tests/helpers.py", False),
        ("tests/__init__.py", True),  # the package init of a verdict file's directory
        ("pkg/__init__.py", False),
        (".git/hooks/pre-commit", True),
        ("../outside.py", True),
    ],
)
def test_protected_paths(path, protected):
    assert (protected_reason(path, {"tests/test_sub.py"}) is not None) == protected


TREE = BaseTree.of(
    ["pkg/__init__.py", "pkg/core.py", "src/mod/__init__.py", "tests/test_sub.py", "README.md"],
    ["json", "pytest", "freezegun", "requests"],
    {},
)


@pytest.mark.parametrize(
    ("path", "kept"),
    [
        ("pkg/new_module.py", True),  # a new module in a package that exists
        ("pkg/json.py", True),  # inside a package: imported as pkg.json, never in place of json
        ("pkg/sub/new.py", False),  # a folder base_commit does not have
        ("newpkg/__init__.py", False),
        ("freezegun.py", False),  # at the root (on sys.path): in place of an installed package
        ("tests/freezegun.py", False),  # tests/ has no __init__: its folder goes on sys.path
        ("src/json.py", False),
        ("tests/__init__.py", False),  # turns tests/ into a package
        ("helpers.py", True),  # a new top-level module that imitates nothing
        ("docs_new.txt", True),
    ],
)
def test_new_files_against_base_commits_tree(path, kept):
    section = (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+x = 1\n"
    )
    out, dropped = filter_model_patch(section, task([T + "test_fixed"], []), TREE)
    assert (out == section) == kept and (dropped == []) == kept


@given(st.text(alphabet="pytesPYTES_.", min_size=4, max_size=12))
def test_names_that_fold_to_a_protected_one_are_protected(name):
    folded = name.casefold()
    if folded in ("pytest.py", "conftest.py", "setup.py", "pytest.ini", "pytest.toml"):
        assert protected_reason(name, set()) is not None


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
def test_configuration_files_are_judged_by_their_parsers(name, base, new, changed):
    import difflib

    body = "".join(difflib.unified_diff((base or "").splitlines(True), new.splitlines(True), "a/" + name, "b/" + name))
    head = f"diff --git a/{name} b/{name}\n" + ("new file mode 100644\n" if base is None else "")
    if base is None:
        body = body.replace(f"--- a/{name}", "--- /dev/null")
    assert (config_change_reason(name, base, head + body) is not None) == changed


@pytest.mark.parametrize(
    "new",
    [
        TOML.replace("[tool.pytest.ini_options]", '[tool."pyt\\u0065st"."ini_options"]').replace('"-ra"', '"-p x"'),
        TOML.replace("[tool.ruff]\nx = 1", '[tool]\n"pytest" = { ini_options = { addopts = "-p x" } }'),
    ],
)
def test_toml_escapes_do_not_hide_pytest_settings(new):
    """Class 5 of issue 40: a table name behind TOML escapes is the table tomllib reads."""
    import difflib

    body = "".join(
        difflib.unified_diff(TOML.splitlines(True), new.splitlines(True), "a/pyproject.toml", "b/pyproject.toml")
    )
    reason = config_change_reason("pyproject.toml", TOML, "diff --git a/pyproject.toml b/pyproject.toml\n" + body)
    assert reason is not None, new


# -- the launcher's command line and a row's own eval script --------------------------------------------------------
@pytest.mark.parametrize(
    ("cmd", "mode", "args"),
    [
        ("pytest -rA -p no:cacheprovider", "script", ["-rA", "-p", "no:cacheprovider"]),
        ("python -m pytest -rA", "module", ["-rA"]),
        ("python3.9 -W ignore -m pytest tests", "module", ["tests"]),
        ("/opt/env/bin/python -m pytest", "module", []),
        ("PYTHONHASHSEED=0 py.test -x", "script", ["-x"]),
    ],
)
def test_pytest_commands_the_launcher_starts(cmd, mode, args):
    from swe_gym_env.server.grading import pytest_command

    got = pytest_command(cmd)
    assert got is not None and got.mode == mode and got.args == args


@pytest.mark.parametrize("cmd", ["tox -e py", "./runtests.py --verbosity 2", "bin/test -C", "python setup.py test"])
def test_other_runners_are_not_pytest(cmd):
    from swe_gym_env.server.grading import pytest_command

    assert pytest_command(cmd) is None


def test_a_rows_eval_script_runs_no_install_after_the_patch_and_pytest_through_the_launcher():
    from swe_gym_env.server.grading.script import LAUNCHER, guard_row_script

    script = "\n".join(
        [
            "cd /testbed",
            "python -m pip install -e .",
            "python setup.py develop",
            "git apply -v - <<'EOF_1'",
            "diff --git a/tests/t.py b/tests/t.py",
            "+pip install -e .",
            "EOF_1",
            ": '>>>>> Start Test Output'",
            "pytest -rA tests/t.py",
            ": '>>>>> End Test Output'",
        ]
    )
    out, first = guard_row_script(script, Guarded.new(junit=True))
    lines = out.split("\n")
    assert lines[1].startswith(": ") and "not run after the model patch" in lines[1]
    assert lines[2].startswith(": ") and "setup.py develop" in lines[2]
    assert "+pip install -e ." in lines  # inside the heredoc: the test patch's text, untouched
    assert first is not None and first.args == ["-rA", "tests/t.py"]
    assert LAUNCHER in lines[8] and " run " in lines[8] and "--junitxml" in lines[8]
