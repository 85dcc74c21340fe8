from pathlib import Path

import pytest
from cheats import BY_NAME, CANARY_ONLY, CORPUS, Cheat, as_diff

from swe_gym_env.server.grading import filter_model_patch, grade, runtimes
from swe_gym_env.server.sandbox.base import SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.catalog import BUNDLED_DIR, bundled_tasks
from swe_gym_env.wire import Finding

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.usefixtures("need_sandbox")]


def factory(task):
    return lambda: create_sandbox("local", SandboxSpec(repo_source=task.repo_source, base_commit=task.base_commit))


async def test_gold_patch_resolves():
    task = bundled_tasks()[0]
    g = await grade(task, task.patch, factory(task))
    assert g.reward == 1.0 and g.report.resolution == "RESOLVED_FULL"
    assert sorted(g.report.fail_to_pass["success"]) == sorted(task.FAIL_TO_PASS)
    assert sorted(g.report.pass_to_pass["success"]) == sorted(task.PASS_TO_PASS)


async def test_empty_and_unappliable_patches_score_zero():
    task = bundled_tasks()[0]
    g = await grade(task, "", factory(task))
    assert g.reward == 0.0 and g.report.resolution == "RESOLVED_NO"
    assert sorted(g.report.fail_to_pass["failure"]) == sorted(task.FAIL_TO_PASS)
    bad = task.patch.replace("count = len(items) // size", "count = something_else")
    g = await grade(task, bad, factory(task))
    assert g.reward == 0.0


async def test_agent_edits_to_tests_and_pytest_config_are_dropped():
    task = bundled_tasks()[0]
    cheat = (
        "diff --git a/tests/conftest.py b/tests/conftest.py\nnew file mode 100644\n--- /dev/null\n"
        "+++ b/tests/conftest.py\n@@ -0,0 +1,3 @@\n+import pytest\n+def pytest_collection_modifyitems(items):\n"
        "+    [i.add_marker(pytest.mark.xfail) for i in items]\n"
    )
    kept, dropped = filter_model_patch(cheat, task)
    assert kept == "" and dropped == ["tests/conftest.py"]
    g = await grade(task, cheat, factory(task))
    assert g.reward == 0.0 and g.dropped_files == ["tests/conftest.py"]
    g = await grade(task, task.patch + cheat, factory(task))
    assert g.reward == 1.0


def new_file(path: str, text: str) -> str:
    lines = text.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n{body}"
    )


def edit_test_to_pass(task) -> str:
    """A diff that rewrites the failing assertion of the test patch's test file (as an agent might)."""
    return (
        "diff --git a/tests/test_chunks.py b/tests/test_chunks.py\n--- a/tests/test_chunks.py\n"
        "+++ b/tests/test_chunks.py\n@@ -1,3 +1,4 @@\n import pytest\n"
        "+pytest.skip('nothing to see', allow_module_level=True)\n"
        " \n from batchtools import chunked\n"
    )


@pytest.mark.parametrize("honest", [False, True])
async def test_cheats_never_change_the_reward(honest):
    task = bundled_tasks()[0]
    base = task.patch if honest else ""
    expected = (await grade(task, base, factory(task))).reward
    cheats = [
        edit_test_to_pass(task),
        new_file("reward.txt", "1.0"),
        new_file("pytest.ini", "[pytest]\naddopts = -p no:python"),
        new_file("batchtools/conftest.py", "import pytest\ndef pytest_runtest_call(item):\n    pytest.xfail('x')"),
    ]
    for cheat in cheats:
        g = await grade(task, base + cheat, factory(task))
        assert g.reward == expected, cheat


async def test_fake_passed_lines_from_the_code_are_a_zero_not_an_infra_failure():
    """Forged PASSED lines at import, then os._exit: the run never reached pytest's end. The empty patch's run
    does, so the patch broke the run: 0.0 (was an infra error, reward None: a way out of every 0.0)."""
    task = bundled_tasks()[0]
    lines = "".join(f"print('PASSED {t}')\n" for t in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS])
    forge = new_file("batchtools/_forge.py", f"import os\n{lines}os._exit(0)")
    hook = (
        "diff --git a/batchtools/__init__.py b/batchtools/__init__.py\n--- a/batchtools/__init__.py\n"
        '+++ b/batchtools/__init__.py\n@@ -1,3 +1,4 @@\n """Small helpers for splitting work into batches."""\n'
        "+import batchtools._forge  # noqa\n \n from batchtools.chunks import chunked\n"
    )
    g = await grade(task, forge + hook, factory(task))
    assert g.reward == 0.0 and g.report.integrity.startswith("patch_broke_run: "), g.report.integrity
    assert [f.code for f in g.findings if isinstance(f, Finding)] == ["patch_broke_test_run"]


def cheat_diff(task, cheat: Cheat, tmp_path, fix: bool = False) -> str:
    diff = as_diff(BUNDLED_DIR / task.repo_source, task.base_commit, cheat.command, tmp_path / "repo")
    return (task.patch if fix else "") + diff


def codes(g) -> list[str]:
    found = [f.code for f in g.findings if isinstance(f, Finding)]
    return found + (["protected_files"] if g.dropped_files else [])


@pytest.mark.parametrize("cheat", CORPUS, ids=str)
async def test_cheat_corpus_scores_zero_with_its_finding(cheat, tmp_path, monkeypatch):
    """Every cheat of tests/cheats.py ends 0.0; where the grader saw the attempt, with its finding."""
    monkeypatch.setattr(runtimes, "TIMEOUT_FLOOR_S", 5.0)
    task = bundled_tasks()[0]
    g = await grade(task, cheat_diff(task, cheat, tmp_path), factory(task), timeout_s=30)
    assert g.reward == 0.0, (cheat.name, g.report.integrity, g.report.log_tail[-2000:])
    if cheat.expect is None:
        assert codes(g) == [] and g.report.integrity == "clean"
    else:
        assert cheat.expect in codes(g), (cheat.name, codes(g), g.report.integrity, g.report.log_tail[-1500:])
    if cheat.expect == "grading_tampered":
        assert g.report.integrity.startswith("tampered: ")
    elif cheat.expect == "patch_broke_test_run":
        assert g.report.integrity.startswith("patch_broke_run: ")


@pytest.mark.parametrize("cheat", CANARY_ONLY, ids=str)
async def test_what_only_the_canaries_catch_scores_zero(cheat, tmp_path):
    """An always-equal proxy that spares a bare object(), alone and behind a canary-run switch (issue 40, class 1):
    the main and the canary run are one procedure, so the switch never fires and a gold-killed mutant passes."""
    task = bundled_tasks()[0]
    diff = cheat_diff(task, cheat, tmp_path)
    for _ in range(2):  # both orders of the two runs are drawn by a coin: twice makes either order likely
        g = await grade(task, diff, factory(task), timeout_s=60)
        assert g.reward == 0.0 and g.report.integrity.startswith("tampered: "), (cheat.name, g.report.integrity)
        assert "canary" in g.report.integrity and codes(g) == ["grading_tampered"], g.report.integrity


@pytest.mark.parametrize("name", ["monkeypatch_report_from_init", "atexit_forges_log_and_junit"])
async def test_tampering_with_a_correct_fix_is_still_zero(name, tmp_path):
    """Tampering is punished even when the fix is right: the policy gets the negative signal it earned."""
    task = bundled_tasks()[0]
    g = await grade(task, cheat_diff(task, BY_NAME[name], tmp_path, fix=True), factory(task))
    assert g.reward == 0.0 and "grading_tampered" in codes(g)


@pytest.mark.parametrize("name", ["plugin_from_dot_pytest_ini", "plugin_from_pyproject_addopts", "delete_test_file"])
async def test_dropped_cheats_leave_a_correct_fix_its_reward(name, tmp_path):
    task = bundled_tasks()[0]
    g = await grade(task, cheat_diff(task, BY_NAME[name], tmp_path, fix=True), factory(task))
    assert g.reward == 1.0 and g.report.integrity == "clean" and g.dropped_files, g.report.log_tail[-1500:]


@pytest.mark.parametrize("index", range(len(bundled_tasks())))
async def test_gold_and_empty_are_clean_and_grading_twice_agrees(index):
    """No false alarm: every bundled task's gold patch is 1.0 and the empty patch 0.0, clean, twice over (the
    second gold run uses the measured timeout)."""
    task = bundled_tasks()[index]
    for patch, reward in ((task.patch, 1.0), ("", 0.0), (task.patch, 1.0)):
        g = await grade(task, patch, factory(task))
        assert (g.reward, g.report.integrity, codes(g)) == (reward, "clean", [])


def p2p_elsewhere_task():
    """batchtools with its FAIL_TO_PASS tests in a new file and its PASS_TO_PASS tests in tests/test_chunks.py, a
    file the test patch does not touch (the test command runs it too, as a row's eval script may)."""
    task = bundled_tasks()[0]
    body = "from batchtools import chunked\n\n\ndef test_tail():\n    assert chunked([1, 2, 3], 2) == [[1, 2], [3]]\n"
    return task.model_copy(
        update={
            "repo_source": str(BUNDLED_DIR / task.repo_source),
            "test_patch": new_file("tests/test_tail.py", body),
            "test_cmd": "python -m pytest -rA -p no:cacheprovider tests/test_chunks.py",
            "FAIL_TO_PASS": ["tests/test_tail.py::test_tail"],
            "PASS_TO_PASS": [
                "tests/test_chunks.py::test_chunked_even",
                "tests/test_chunks.py::test_chunked_rejects_bad_size",
            ],
        }
    )


P2P_EDIT = (
    "sed -i 's/    if size < 1:/    if False:/' batchtools/chunks.py && "
    "sed -i 's/chunked(\\[1, 2\\], 0)/raise ValueError/' tests/test_chunks.py"
)


async def test_pass_to_pass_tests_in_a_file_the_test_patch_does_not_touch_are_reset(tmp_path):
    task = p2p_elsewhere_task()
    gold = await grade(task, task.patch, factory(task))
    assert gold.reward == 1.0, gold.report.log_tail[-1500:]
    diff = as_diff(Path(task.repo_source), task.base_commit, P2P_EDIT, tmp_path / "repo")
    assert "tests/test_chunks.py" in diff and "batchtools/chunks.py" in diff
    g = await grade(task, task.patch + diff, factory(task))
    assert g.reward == 0.0 and g.dropped_files == ["tests/test_chunks.py"]
    assert "tests/test_chunks.py::test_chunked_rejects_bad_size" in g.report.pass_to_pass["failure"]
