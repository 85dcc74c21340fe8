import pytest

from swe_gym_env.server.grading import GradingError, filter_model_patch, grade
from swe_gym_env.server.sandbox.base import SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.catalog import bundled_tasks

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


async def test_fake_passed_lines_from_the_code_are_an_infra_failure_not_a_pass():
    task = bundled_tasks()[0]
    lines = "".join(f"print('PASSED {t}')\n" for t in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS])
    forge = new_file("batchtools/_forge.py", f"import os\n{lines}os._exit(0)")
    hook = (
        "diff --git a/batchtools/__init__.py b/batchtools/__init__.py\n--- a/batchtools/__init__.py\n"
        '+++ b/batchtools/__init__.py\n@@ -1,3 +1,4 @@\n """Small helpers for splitting work into batches."""\n'
        "+import batchtools._forge  # noqa\n \n from batchtools.chunks import chunked\n"
    )
    with pytest.raises(GradingError, match="JUnit"):
        await grade(task, forge + hook, factory(task))
