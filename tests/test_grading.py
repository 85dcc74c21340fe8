import pytest

from swe_gym_env.server.grading import filter_model_patch, grade
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
