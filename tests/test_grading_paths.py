"""Each grading path on small real rows, run for real in the local sandbox (and one in a stand-in image):

- repo_parser: Django's runner and sympy's bin/test, mimicked by tiny runners of our own (same output formats, run
  for real on a tiny project each), read by swebench's `parse_log_django` / `parse_log_sympy`; no JUnit cross-check;
- eval_script: a row carrying its own SWE-bench eval script, graded through swebench's `make_test_spec`;
- install_config: a dependency the row declares that cannot be installed fails with the package named (also in
  `validate`'s output), a pytest plugin the repo's configuration needs but the row forgot is named, and a declared
  package missing from an image's env is named — never "no readable JUnit report".
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from test_pypi_split import pypi_images, pypi_split  # noqa: F401 (fixtures)

from swe_gym_env.server.grading import GradingError, grade, load_swebench, score_log
from swe_gym_env.server.sandbox.base import SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.catalog import bundled_tasks
from swe_gym_env.tasks.loaders import load_tasks

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.usefixtures("need_sandbox")]
GIT = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t"}
GIT |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z"}
GIT |= {"GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z"}

# --- a Django-style runner: what ./tests/runtests.py --verbosity 2 prints (Django's DiscoverRunner on unittest) --
RUNTESTS = '''#!/usr/bin/env python3
"""Tiny stand-in for Django's tests/runtests.py: the same arguments and the same --verbosity 2 output."""
import argparse, os, sys, unittest

p = argparse.ArgumentParser()
p.add_argument("labels", nargs="*")
p.add_argument("--verbosity", type=int, default=1)
p.add_argument("--settings")
p.add_argument("--parallel", default="1")
a = p.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.dirname(here))
print(f"Testing against Django installed in '{os.path.dirname(here)}/django' with up to {a.parallel} processes")
print(f"Importing application {a.labels[0].split('.')[0] if a.labels else 'all'}")
print("Skipping setup of unused database(s): default, other.")
print("System check identified no issues (0 silenced).", flush=True)
suite = unittest.defaultTestLoader.loadTestsFromNames(a.labels)
result = unittest.TextTestRunner(stream=sys.stderr, verbosity=a.verbosity).run(suite)
sys.exit(not result.wasSuccessful())
'''
CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
DJANGO_TESTS = textwrap.dedent(
    """\
    from unittest import TestCase, skip

    from calc import add, mul


    class CalcTests(TestCase):
        def test_mul(self):
            self.assertEqual(mul(2, 3), 6)

        @skip("not on this backend")
        def test_skipped(self):
            pass
    """
)
DJANGO_NEW_TESTS = DJANGO_TESTS.replace(
    "    def test_mul(self):",
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n    def test_mul(self):",
)

# --- a sympy-style bin/test: what `bin/test -C --verbose FILES` prints -----------------------------------------
BIN_TEST = '''#!/usr/bin/env python3
"""Tiny stand-in for sympy's bin/test: runs test_* functions of the given files, printing as sympy's runner does."""
import importlib.util, os, sys, time, traceback

files = [f for f in sys.argv[1:] if not f.startswith("-")]
print("=" * 29 + " test process starts " + "=" * 30)
print(f"executable:         {sys.executable}  ({sys.version.split()[0]}) [CPython]")
print("architecture:       64-bit\\ncache:              no\\nground types:       python\\nnumpy:              None")
print("random seed:        20240101\\nhash randomization: on (PYTHONHASHSEED=1)\\n")
sys.path.insert(0, os.getcwd())
passed = failed = errors = 0
reports = []
t0 = time.time()
for path in files:
    spec = importlib.util.spec_from_file_location(path[:-3].replace("/", "."), path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tests = [n for n in dir(mod) if n.startswith("test_") and callable(getattr(mod, n))]
    print(f"{path}[{len(tests)}] ")
    for name in tests:
        try:
            getattr(mod, name)()
            print(f"{name} ok")
            passed += 1
        except AssertionError:
            print(f"{name} F")
            failed += 1
            reports.append((path, name, traceback.format_exc()))
        except Exception:
            print(f"{name} E")
            errors += 1
            reports.append((path, name, traceback.format_exc()))
print()
for path, name, tb in reports:
    print("_" * 80)
    title = f" {path}:{name} "
    print(title.center(80, "_"))
    print(tb)
summary = f" tests finished: {passed} passed, {failed} failed, {errors} exceptions, in {time.time() - t0:.2f} seconds "
print(summary.center(80, "="))
if failed or errors:
    print("DO *NOT* COMMIT!")
sys.exit(1 if failed or errors else 0)
'''
SYMPY_TESTS = "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
SYMPY_NEW_TESTS = (
    SYMPY_TESTS.replace("import mul", "import add, mul") + "\n\ndef test_add():\n    assert add(2, 3) == 5\n"
)


def git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | GIT
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make_repo(root: Path, files: dict[str, str], fixed: dict[str, str], tests: dict[str, str]) -> dict:
    """A git repo with ``files`` committed; returns the row fields: base commit, gold patch, test patch."""
    root.mkdir()
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
        if text.startswith("#!"):
            (root / path).chmod(0o755)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    base = git(root, "rev-parse", "HEAD").strip()

    def diff(changes: dict[str, str]) -> str:
        for path, text in changes.items():
            (root / path).write_text(text)
        out = git(root, "diff", "--no-color")
        git(root, "checkout", "-q", "--", ".")
        return out

    return {"base_commit": base, "patch": diff(fixed), "test_patch": diff(tests), "repo_source": str(root)}


def row(repo: str, fields: dict, f2p: list[str], p2p: list[str], **extra) -> dict:
    iid = repo.replace("/", "__") + "-1"
    base = {"instance_id": iid, "repo": repo, "problem_statement": "add() subtracts", "FAIL_TO_PASS": f2p}
    return base | {"PASS_TO_PASS": p2p, **fields, **extra}


def load_row(tmp_path: Path, data: dict, name: str = "rows.jsonl"):
    path = tmp_path / name
    path.write_text(json.dumps(data) + "\n")
    report = load_tasks(str(path))
    assert not report.skipped, report.skipped
    return report.tasks[0]


def local(task):
    spec = SandboxSpec(repo_source=task.repo_source, base_commit=task.base_commit, workdir=task.workdir)
    return lambda: create_sandbox("local", spec)


async def test_django_runner_graded_by_parse_log_django(tmp_path):
    files = {
        "tests/runtests.py": RUNTESTS,
        "tests/calc_tests/__init__.py": "",
        "tests/calc_tests/tests.py": DJANGO_TESTS,
    }
    fields = make_repo(
        tmp_path / "django",
        {**files, "calc.py": CALC},
        {"calc.py": CALC.replace("a - b", "a + b")},
        {"tests/calc_tests/tests.py": DJANGO_NEW_TESTS},
    )
    ids = [f"test_{n} (calc_tests.tests.CalcTests.test_{n})" for n in ("add", "mul", "skipped")]
    data = row("django/django", fields, [ids[0]], [ids[1], ids[2]], environment_setup_commit=fields["base_commit"])
    task = load_row(tmp_path, data, "swe_bench_django.jsonl")
    # a SWE-bench row: its image's conda env; run here on `local` with the sandbox's Python instead
    task = task.model_copy(update={"env_activation": None, "image": None})
    assert task.test_cmd.startswith("./tests/runtests.py --verbosity 2") and task.test_targets() == ["calc_tests.tests"]
    gold = await grade(task, task.patch, local(task))
    assert gold.reward == 1.0, gold.report.log_tail
    r = gold.report
    assert (r.graded_by, r.parser, r.junit_cross_check) == ("repo_parser", "parse_log_django", "not_pytest")
    assert f"{ids[0]} ... ok" in r.log_tail and "System check identified no issues" in r.log_tail
    assert (r.canaries or "").startswith("held: 1 "), r.canaries  # the mutant's status from the log parser alone
    empty = await grade(task, "", local(task))
    assert empty.reward == 0.0 and empty.report.fail_to_pass["failure"] == [ids[0]]
    assert f"{ids[0]} ... FAIL" in empty.report.log_tail and f"FAIL: {ids[0]}" in empty.report.log_tail
    assert empty.report.pass_to_pass["success"] == [ids[1], ids[2]]  # a skipped PASS_TO_PASS test is kept


async def test_sympy_runner_graded_by_parse_log_sympy(tmp_path):
    fields = make_repo(
        tmp_path / "sympy",
        {"bin/test": BIN_TEST, "calc.py": CALC, "sympy/core/tests/test_calc.py": SYMPY_TESTS},
        {"calc.py": CALC.replace("a - b", "a + b")},
        {"sympy/core/tests/test_calc.py": SYMPY_NEW_TESTS},
    )
    data = row("sympy/sympy", fields, ["test_add"], ["test_mul"], environment_setup_commit=fields["base_commit"])
    task = load_row(tmp_path, data, "swe_bench_sympy.jsonl")
    task = task.model_copy(update={"env_activation": None, "image": None})
    assert "bin/test -C --verbose" in task.test_cmd
    gold = await grade(task, task.patch, local(task))
    assert gold.reward == 1.0, gold.report.log_tail
    r = gold.report
    assert (r.graded_by, r.parser, r.junit_cross_check) == ("repo_parser", "parse_log_sympy", "not_pytest")
    assert "test_add ok" in r.log_tail and "tests finished: 2 passed" in r.log_tail
    assert (r.canaries or "").startswith("held: 1 "), r.canaries
    empty = await grade(task, "", local(task))
    assert empty.reward == 0.0 and empty.report.fail_to_pass["failure"] == ["test_add"]
    log = empty.report.log_tail
    assert "test_add F" in log and " sympy/core/tests/test_calc.py:test_add " in log and "DO *NOT* COMMIT!" in log
    # the same real log, read again: sympy's failure banner is parsed as a failed test too
    sw = load_swebench()
    assert sw.PARSER_REGISTRY["parse_log_sympy"](log, None)["sympy/core/tests/test_calc.py:test_add"] == "FAILED"


def eval_script_for(task) -> str:
    """A SWE-bench-format eval script (as newer SWE-bench rows carry it) for a bundled task."""
    files = " ".join(task.test_files())
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            "source /opt/miniconda3/bin/activate",  # absent on local: the script goes on (no -e), as in swebench
            "conda activate testbed",
            "cd /testbed",
            "git status",
            f"git -c core.fileMode=false diff {task.base_commit}",
            f"git checkout {task.base_commit} {files}",
            "git apply -v - <<'EOF_114329324912'",
            task.test_patch.rstrip("\n"),
            "EOF_114329324912",
            ": '>>>>> Start Test Output'",
            f"python -m pytest -rA -p no:cacheprovider {files}",
            ": '>>>>> End Test Output'",
            f"git checkout {task.base_commit} {files}",
        ]
    )


async def test_row_with_its_own_eval_script_is_graded_through_make_test_spec(tmp_path):
    toy = bundled_tasks()[0]
    data = {
        **{k: v for k, v in toy.model_dump().items() if k in ("instance_id", "repo", "base_commit", "patch")},
        "problem_statement": toy.problem_statement,
        "test_patch": toy.test_patch,
        "FAIL_TO_PASS": json.dumps(toy.FAIL_TO_PASS),  # SWE-bench ships the lists as JSON strings
        "PASS_TO_PASS": json.dumps(toy.PASS_TO_PASS),
        "environment_setup_commit": toy.base_commit,
        "version": "0.2",
        "image": "swebench/sweb.eval.x86_64.toy",
        "eval_script": eval_script_for(toy),
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
        "repo_source": toy.repo_source,
    }
    task = load_row(tmp_path, data, "swe_bench_rows.jsonl")
    assert task.eval_script and task.log_parser == "parse_log_pytest"
    gold = await grade(task, task.patch, local(task))
    assert gold.reward == 1.0, gold.report.log_tail
    r = gold.report
    assert (r.graded_by, r.parser, r.junit_cross_check) == ("eval_script", "parse_log_pytest", "match")
    assert ">>>>> Test Exit Code: 0" in r.log_tail  # make_test_spec's exit-code recording ran
    assert (r.canaries or "").startswith("held: 2 "), r.canaries  # spliced after the script's test patch heredoc
    empty = await grade(task, "", local(task))
    assert empty.reward == 0.0 and empty.report.junit_cross_check == "match"
    assert ">>>>> Test Exit Code: 1" in empty.report.log_tail


def pypi_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=10).close()
    except OSError:
        return False
    return True


def toy_rebench_row(install_config: dict) -> dict:
    toy = bundled_tasks()[0]
    data = {k: v for k, v in toy.model_dump().items() if k in ("instance_id", "repo", "base_commit", "patch")}
    data |= {"problem_statement": toy.problem_statement, "test_patch": toy.test_patch}
    data |= {"FAIL_TO_PASS": toy.FAIL_TO_PASS, "PASS_TO_PASS": toy.PASS_TO_PASS, "repo_source": toy.repo_source}
    return {**data, "install_config": install_config}


@pytest.mark.slow
def test_undeclared_and_uninstallable_dependencies_are_named_by_validate(tmp_path, pypi_split):  # noqa: F811
    """The issue's two reports, through `validate`: a row declaring a package that cannot be installed, and the
    semver row with pytest-cov left out of its install_config (its setup.cfg adds --cov options to pytest)."""
    if not pypi_reachable():
        pytest.skip("PyPI unreachable: task environments cannot be built here")
    bogus = toy_rebench_row(
        {"python": "3.11", "pip_packages": ["pytest==8.4.2", "swe-gym-env-no-such-package==0.0.1"], "install": ""}
    )
    bogus["instance_id"] = "swe-gym-env__batchtools-bogus"
    semver = next(t for t in pypi_split if "semver" in t.instance_id)
    cfg = semver.install_config.model_dump()
    cfg["pip_packages"] = [p for p in cfg["pip_packages"] if not p.startswith("pytest-cov")]
    lines = [json.dumps(bogus)]
    lines.append(
        json.dumps(
            {
                **{k: v for k, v in semver.model_dump().items() if k in ("instance_id", "repo", "base_commit")},
                **{k: v for k, v in semver.model_dump().items() if k in ("patch", "test_patch", "problem_statement")},
                "FAIL_TO_PASS": semver.FAIL_TO_PASS,
                "PASS_TO_PASS": semver.PASS_TO_PASS,
                "repo_source": semver.repo_source,
                "install_config": {**cfg, "test_cmd": semver.test_cmd, "log_parser": "parse_log_pytest"},
            }
        )
    )
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    cli = [str(Path(sys.executable).parent / "swe-gym-env"), "validate", "--dataset", str(path), "--sandbox", "local"]
    r = subprocess.run(cli, capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "0 ok, 2 surprises" in out, out
    bogus_line = next(line for line in out.splitlines() if line.startswith("swe-gym-env__batchtools-bogus"))
    assert "could not install swe-gym-env-no-such-package==0.0.1" in bogus_line
    assert "install_config.pip_packages" in bogus_line
    semver_line = next(line for line in out.splitlines() if line.startswith(semver.instance_id))
    assert "pytest rejected the options --no-cov-on-fail --cov=semver" in semver_line, semver_line
    assert "declare it in install_config.pip_packages" in semver_line
    assert "no readable JUnit report" not in out


@pytest.mark.slow
async def test_declared_package_missing_from_the_image_env_is_named(need_docker, pypi_images):  # noqa: F811
    """In an image the env is the image's: a package the row declares that the image lacks is named before any test
    runs (the stand-in image of the toml task has no freezegun)."""
    toml = next(t for t in pypi_images if "toml" in t.instance_id)
    cfg = toml.install_config.model_copy(update={"pip_packages": [*toml.install_config.pip_packages, "freezegun"]})
    task = toml.model_copy(update={"install_config": cfg})
    spec = SandboxSpec(base_commit=task.base_commit, workdir=task.workdir, image=task.image)
    with pytest.raises(GradingError, match=r"lacks test dependencies the task declares .*: freezegun") as e:
        await grade(task, task.patch, lambda: create_sandbox("docker", spec))
    assert "conda env testbed" in str(e.value)


def test_score_log_reports_the_path_and_parser_without_a_sandbox():
    sw = load_swebench()
    toy = bundled_tasks()[0]
    t = toy.model_copy(update={"repo": "marshmallow-code/marshmallow"})
    log = ">>>>> Start Test Output\n" + "".join(f"PASSED {x}\n" for x in t.FAIL_TO_PASS + t.PASS_TO_PASS)
    g = score_log(t, log + ">>>>> End Test Output\n>>>>> Test Exit Code: 0\n", sw)
    assert g.reward == 1.0 and (g.report.graded_by, g.report.parser) == ("repo_parser", "parse_log_marshmallow")
    assert g.report.junit_cross_check is None  # no JUnit report was given
    g = score_log(toy, log + ">>>>> End Test Output\n", sw)
    assert (g.report.graded_by, g.report.parser) == ("pytest", "parse_log_pytest")


async def test_a_gold_patch_that_edits_pyproject_outside_pytest_settings_grades_one(pypi_split):  # noqa: F811
    """blinker 1.8.0 -> 1.8.1: the release's fix also bumps `version` in pyproject.toml, which has a
    `[tool.pytest.ini_options]` table. Grading pins pytest's settings, not the file: the gold grades 1.0 with the
    edit kept; the same patch plus an `addopts` plugin in that table is pinned back (the file reset)."""
    task = next(t for t in pypi_split if "blinker" in t.instance_id)
    assert "pyproject.toml" in task.patch and "tool.pytest" not in task.patch
    spec = SandboxSpec(repo_source=task.repo_source, base_commit=task.base_commit, workdir=task.workdir)
    g = await grade(task, task.patch, lambda: create_sandbox("local", spec))
    assert (g.reward, g.report.integrity, g.dropped_files) == (1.0, "clean", []), g.report.log_tail[-1500:]
    sneak = task.patch.replace('+version = "1.8.1"', '+version = "1.8.1"\n+[tool.pytest]\n+addopts = "-p nowhere"')
    sneak = re.sub(r"@@ -(\d+),(\d+) \+(\d+),(\d+) @@(?=[^\n]*\n[^@]*\[tool\.pytest\])", _grow_hunk, sneak, count=1)
    g = await grade(task, sneak, lambda: create_sandbox("local", spec))
    assert g.dropped_files == ["pyproject.toml"] and g.report.integrity == "clean"


def _grow_hunk(m: re.Match) -> str:
    """The hunk header of a hunk that gained two added lines."""
    a, b, c, d = (int(x) for x in m.groups())
    return f"@@ -{a},{b} +{c},{d + 2} @@"
